"""The run-off: the contenders for champion timed again side by side, in one process.

Each variant is timed on its own turn, minutes apart from the others. On a shared machine the speed
moves between turns (a neighbour's load, the host's frequency, another VM on the sibling
hyperthread), and two files of the same network can swap places between their own turns and side by
side. Each turn's interval is narrow, so such a drift would pick the champion. The run-off takes the
variants whose runtime can share a process (`Runtime.shares_process`: LiteRT, ONNX Runtime,
OpenVINO) within `benchmark.runoff_margin` of the fastest eligible one (at most `MAX_CONTENDERS`,
the contenders' speed-up references among them: `tfopt.measurement.champion.speedup_reference`, the
baseline's int8 TFLite file and the fastest peer every champion is also quoted against), loads them
all in one fresh process, warms them all in an untimed round and times them in `RUNOFF_ROUNDS`
rounds that alternate between them (the order rotates each round), so a drift reaches all of them
alike. Other work on the machine does not reach them alike (a file on two threads loses more to a
busy core than one on one): a run-off that ran while more than ``benchmark.max_background_cores``
were busy runs once more, and is marked ``under_load`` if it still was, as a variant's turn is. A
contender's run-off p50 is the median of its round p50s and its interval a distribution-free one of
at least 95% (`tfopt.artifacts.median_interval`, as a turn's windows); each round's p50 paired with
the baseline's int8 file's in that round when it took part (`Runoff.anchor`: the machine's speed may
flip between rounds), speed-ups the median of two files' per-round ratios (`Runoff.ratio`), and two
contenders are tied when the interval of their per-round ratio holds 1.0
(`tfopt.measurement.champion.tied_with_best`).

Threads: with ``benchmark.runoff_threads: fastest`` each contender is timed at 1, 2, 4, ... up to
``benchmark.threads`` intra-op threads, every count in the same alternating rounds, and its
figures are its fastest count's (`Runoff.threads`), the count its packaged model then serves with:
a small file often runs fastest on one thread (its work is too small to split), a larger one on
all, and a file whose second thread runs slow while the rounds run is quoted at one.

TensorFlow's variants stay out: a process cannot hold both XLA auto-clustering's flags and the
others, and on CPU they are rarely near the fastest.
"""

from __future__ import annotations

import logging

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig, MeasurementProtocol
from tfopt.eval.metrics import accuracy_budget
from tfopt.measurement.champion import (
    budget_rule,
    fastest_peer,
    plain_int8,
    speedup_reference,
)
from tfopt.measurement.isolation import once_more_under_load, run_worker, worker_env
from tfopt.measurement.worker import P50_WINDOWS, measure_runoff
from tfopt.runtimes import runtime_of

MAX_CONTENDERS = 5
RUNOFF_ROUNDS = 12
"""The champion's run-off rounds, in the time 6 took: a contender's interval is then its 3rd to
10th round (`tfopt.artifacts.median_interval`), so one or two rounds a VM's slow state hit do
not make a tie (with 6, one slow round did: docs/measurements.md, "Run-off")."""


def runoff_contenders(results: list[VariantResult], cfg: BenchmarkConfig) -> list[VariantResult]:
    """The variants of runtimes that share a process near the fastest eligible one, fastest first.

    Near: a p50 within the margin of the upper end of the fastest's p50 interval, so an
    unsettled fastest (a wide interval) draws its likely rivals into the run-off; by default
    twice it, since a whole turn can run in a VM's slow state (with a narrower margin such a
    file was never timed again and a slower one won: docs/measurements.md). For each
    technique's variant among them, the baseline's same form (`speedup_reference`) takes part
    too, after them, and so do the baseline's int8 TFLite file (`plain_int8`) and the fastest
    of the peers (`fastest_peer`, when its runtime shares a process): the speed-ups
    the run reports are then measured side by side, not across
    turns minutes apart (a measuring process now and then runs slow its whole life), whichever
    of the near ones wins. None (an empty list) unless the objective is p50, a
    margin is set and at least two variants qualify.
    """
    rule = budget_rule(results, accuracy_budget(cfg.accuracy_budget_points))
    if cfg.objective != "p50" or cfg.runoff_margin is None or rule is None:
        return []
    eligible = sorted(
        (r for r in results if runtime_of(r.format).shares_process and r.path is not None
         and rule.keeps(r)),
        key=lambda r: r.latency_ms.p50)
    if not eligible:
        return []
    fastest = eligible[0].latency_ms
    upper = fastest.p50_ci95[1] if fastest.p50_ci95 else fastest.p50
    limit = max(fastest.p50, upper) * (1.0 + cfg.runoff_margin)
    near = _with_references([r for r in eligible if r.latency_ms.p50 <= limit], results)
    return near if len(near) >= 2 else []


def _with_references(near: list[VariantResult],
                     results: list[VariantResult]) -> list[VariantResult]:
    """`near` and their references, at most `MAX_CONTENDERS`: the slowest near ones give way.

    The references: each one's `speedup_reference`, the baseline's int8 TFLite file
    (`plain_int8`) and the fastest peer (`fastest_peer`) when its runtime shares a process.
    """
    peer = fastest_peer(results)
    if peer is not None and not (runtime_of(peer.format).shares_process and peer.path):
        peer = None
    while True:
        references: list[VariantResult] = []
        for reference in [*(speedup_reference(r, results) for r in near), plain_int8(results),
                          peer]:
            if reference is not None and reference not in near + references:
                references.append(reference)
        if len(near) + len(references) <= MAX_CONTENDERS or len(near) == 1:
            return [*near, *references][:MAX_CONTENDERS]
        near = near[:-1]


def _spec_of(result: VariantResult) -> VariantSpec:
    return VariantSpec(name=result.name, source=result.source, format=result.format,
                       precision=result.precision, path=result.path,
                       derived_from=result.derived_from)


def runoff_thread_counts(cfg: BenchmarkConfig) -> list[int]:
    """The thread counts each contender is tried at: 1, 2, 4, ... and `threads` itself.

    Only `threads` unless ``benchmark.runoff_threads`` is ``fastest``.
    """
    if cfg.runoff_threads != "fastest":
        return [cfg.threads]
    counts = {cfg.threads}
    count = 1
    while count < cfg.threads:
        counts.add(count)
        count *= 2
    return sorted(counts)


def side_by_side_in_worker(specs: list[VariantSpec], inputs: BenchmarkInputs,
                           protocol: MeasurementProtocol, rounds: int = P50_WINDOWS,
                           thread_counts: list[int] | None = None) -> Runoff:
    """`specs` timed in alternating rounds in one fresh measuring process (one runtime's env).

    Each at its fastest of `thread_counts` when there are several (`measure_runoff`).
    """
    request = {"specs": [spec.model_dump(mode="json") for spec in specs],
               "inputs": inputs.model_dump(mode="json"), "rounds": rounds,
               "thread_counts": thread_counts or [],
               "cfg": protocol.as_protocol().model_dump(mode="json")}
    return Runoff.model_validate_json(run_worker(
        "tfopt.measurement.worker", request, worker_env(specs[0]), protocol.time_limit_seconds))


def run_runoff(results: list[VariantResult], inputs: BenchmarkInputs, cfg: BenchmarkConfig,
               logger: logging.Logger) -> Runoff | None:
    """Time the contenders again side by side; None when there are none or it cannot run."""
    contenders = runoff_contenders(results, cfg)
    if not contenders:
        return None
    specs = [_spec_of(result) for result in contenders]
    try:
        runoff = once_more_under_load(lambda: _timed_side_by_side(specs, inputs, cfg),
                                      "the run-off", _cores, cfg.max_background_cores, logger)
    except (RuntimeError, OSError) as error:
        logger.warning("run-off of %s skipped: %s", ", ".join(s.name for s in specs), error)
        return None
    anchor = plain_int8(results)
    if anchor is not None and anchor in contenders:
        runoff = runoff.model_copy(update={"anchor": anchor.name})
    logger.info("run-off, %d alternating rounds: %s", runoff.rounds, "; ".join(
        f"{name} p50 {runoff.p50(name):.4f} ms ({low:.4f}-{high:.4f}){threads_note(runoff, name)}"
        f", on its turn {result.latency_ms.p50:.4f}"
        for result in contenders
        for name, (low, high) in [(result.name, runoff.interval(result.name))]))
    return runoff


def _timed_side_by_side(specs: list[VariantSpec], inputs: BenchmarkInputs,
                        cfg: BenchmarkConfig) -> Runoff:
    counts = runoff_thread_counts(cfg)
    return (side_by_side_in_worker(specs, inputs, cfg, RUNOFF_ROUNDS, counts) if cfg.isolate
            else measure_runoff(specs, inputs, cfg, RUNOFF_ROUNDS, counts))


def _cores(runoff: Runoff) -> str:
    return "?" if runoff.background_cores is None else f"{runoff.background_cores:.2f}"


def threads_note(runoff: Runoff, name: str) -> str:
    """" at N thread(s)" where the run-off picked `name`'s count, else nothing."""
    threads = runoff.threads.get(name)
    return "" if threads is None else f" at {threads} thread{'s' if threads > 1 else ''}"
