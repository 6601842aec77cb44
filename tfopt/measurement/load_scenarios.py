"""MLPerf LoadGen's Offline and Server scenarios around tfopt's runners. Not a task.

SingleStream is the benchmark's batch-1 protocol (`tfopt.measurement.worker.time_runs`). Here
`mlcommons-loadgen` (the MLPerf Inference load generator) issues the queries and times them:

- Offline: every sample in one query, answered in batches; the best examples/s over a few batch
  sizes is the variant's `offline_examples_per_s`.
- Server: single-sample queries with Poisson arrivals at a target rate, answered by concurrent
  clients (one runtime instance each, since interpreters are not thread-safe); the rate is
  searched (doubling, then bisection) for the highest one whose p99 stays within the latency
  budget: `server_qps_within_budget`, with `server_p99_ms` at that rate.

LoadGen writes its own logs; the figures are read from its ``mlperf_log_summary.txt``.
"""

from __future__ import annotations

import queue
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.measurement.feeds import count_of, take

_SEARCH_TRIALS = 8
_MIN_QUERIES = 64
_FLOOR_QUERIES = 32
"""The fewest queries of a Server trial at a low rate: its p99 is then the second-slowest."""
_ALONE_CALLS = 32


@dataclass(frozen=True)
class ServerTrial:
    """One Server-scenario run at a target rate."""

    target_qps: float
    p99_ms: float
    completed_qps: float
    scheduled_qps: float = 0.0

    def within(self, budget_ms: float) -> bool:
        """Whether the p99 met the budget and the clients kept up with the arrivals.

        Keeping up is judged against the rate LoadGen actually scheduled (a Poisson draw, below
        the target on short runs): on a short run an overloaded client's queue may not yet have
        pushed the p99 past a generous budget, but it completes visibly fewer queries per second.
        """
        return self.p99_ms <= budget_ms and self.completed_qps >= 0.95 * self.scheduled_qps


def _summary_values(folder: Path) -> dict[str, str]:
    values = {}
    for line in (folder / "mlperf_log_summary.txt").read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _run_loadgen(issue: Callable[[list], None], samples: int, settings: object) -> dict[str, str]:
    import mlperf_loadgen as lg

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(samples, samples, lambda _: None, lambda _: None)
    with tempfile.TemporaryDirectory(prefix="tfopt-loadgen-") as folder:
        output = lg.LogOutputSettings()
        output.outdir = folder
        output.copy_summary_to_stdout = False
        log = lg.LogSettings()
        log.log_output = output
        log.enable_trace = False
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        return _summary_values(Path(folder))


def _settings(scenario: str, seconds: float, rate: float | None = None) -> object:
    """LoadGen's settings; a Server trial at `rate` asks for as many queries as `seconds` allow.

    LoadGen runs until both the duration and the query count are reached, so a fixed count
    would stretch a low-rate trial (64 queries at 0.1/s: 11 minutes): the count follows the
    rate, between `_FLOOR_QUERIES` and `_MIN_QUERIES`.
    """
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(seconds * 1000)
    if scenario == "Offline":
        settings.min_query_count = 1
    else:
        wanted = _MIN_QUERIES if rate is None else int(rate * seconds)
        settings.min_query_count = max(_FLOOR_QUERIES, min(_MIN_QUERIES, wanted))
    return settings


def alone_p99_ms(invoke: Callable[[object], object], prepared: Sequence[object],
                 seconds: float) -> float:
    """The p99 (ms) of one Server client answering queries one at a time, with no queue.

    This is the lowest latency any arrival rate can give: when it is over the budget, no rate
    meets it, and searching lower rates only waits (LoadGen's minimum query count at ever lower
    rates). At most `_ALONE_CALLS` calls or `seconds`, whichever ends first (at least 8).
    """
    import time

    durations: list[float] = []
    started = time.perf_counter()
    for index in range(_ALONE_CALLS):
        before = time.perf_counter()
        invoke(prepared[index % len(prepared)])
        durations.append(time.perf_counter() - before)
        if index >= 7 and time.perf_counter() - started >= seconds:
            break
    return float(np.percentile(durations, 99)) * 1000.0


def offline_throughput(predict: Callable[[Any], object], images: np.ndarray | dict[str, np.ndarray],
                       batch_sizes: Sequence[int], expected_per_s: float,
                       seconds: float) -> tuple[float, int]:
    """The best Offline examples/s over `batch_sizes`, and the batch size that reached it.

    Args:
        predict: The runner's batch inference (`Runner.predict`, or `Runner.run` on feeds).
        images: The benchmark's inputs, images or named feeds (samples are drawn from them).
        batch_sizes: Batch sizes to try.
        expected_per_s: A guess of the rate (sizes the one query: LoadGen asks for enough
            samples to last `seconds` at that rate).
        seconds: Minimum duration of each run.
    """
    import mlperf_loadgen as lg

    best = (0.0, batch_sizes[0])
    for batch_size in batch_sizes:
        def issue(samples: list, size: int = batch_size) -> None:
            for start in range(0, len(samples), size):
                chunk = samples[start : start + size]
                predict(take(images, [sample.index for sample in chunk]))
                lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in chunk])

        settings = _settings("Offline", seconds)
        settings.offline_expected_qps = max(expected_per_s, 1.0)
        values = _run_loadgen(issue, count_of(images), settings)
        rate = float(values.get("Samples per second", 0.0))
        if rate > best[0]:
            best = (rate, batch_size)
    return best


def server_trial(clients: Sequence[Callable[[object], object]], prepared: Sequence[object],
                 target_qps: float, budget_ms: float, seconds: float) -> ServerTrial:
    """One Server run: Poisson arrivals at `target_qps`, answered by `clients` in parallel."""
    import mlperf_loadgen as lg

    work: queue.Queue = queue.Queue()

    def serve(invoke: Callable[[object], object]) -> None:
        while (sample := work.get()) is not None:
            invoke(prepared[sample.index])
            lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0)])

    threads = [threading.Thread(target=serve, args=(invoke,), daemon=True) for invoke in clients]
    for thread in threads:
        thread.start()
    settings = _settings("Server", seconds, target_qps)
    settings.server_target_qps = target_qps
    settings.server_target_latency_ns = int(budget_ms * 1e6)
    try:
        values = _run_loadgen(lambda samples: [work.put(s) for s in samples], len(prepared),
                              settings)
    finally:
        for _ in threads:
            work.put(None)
        for thread in threads:
            thread.join()
    return ServerTrial(
        target_qps=target_qps,
        p99_ms=float(values.get("99.00 percentile latency (ns)", "inf")) / 1e6,
        completed_qps=float(values.get("Completed samples per second", 0.0)),
        scheduled_qps=float(values.get("Scheduled samples per second", 0.0)),
    )


def server_search(clients: Sequence[Callable[[object], object]], prepared: Sequence[object],
                  budget_ms: float, first_qps: float, seconds: float) -> ServerTrial | None:
    """The highest-rate Server trial within the budget (None: not even `first_qps` / 1024).

    The rate doubles from `first_qps` until a trial misses the budget, or is quartered until
    one meets it, then the gap is bisected; at most 8 trials in all. The start comes from the
    runtime's p50, and a tiny model's p50 can be far below what Python clients can dispatch,
    so the way down must be long.
    """
    within: ServerTrial | None = None
    low, high = 0.0, None
    rate = first_qps
    for _ in range(_SEARCH_TRIALS):
        trial = server_trial(clients, prepared, rate, budget_ms, seconds)
        if trial.within(budget_ms):
            within, low = trial, rate
        else:
            high = rate
        if high is None:
            rate *= 2.0
        elif within is None:
            rate = high / 4.0
            if rate < first_qps / 1024:
                return None
        else:
            if high / low < 1.1:
                break
            rate = (low + high) / 2.0
    return within
