"""The measuring side of the benchmark: one variant, in this process.

`tfopt.measurement.isolation` runs ``python -m tfopt.measurement.worker REQUEST RESULT`` so each
variant is measured in a fresh process. The variant's runtime (`tfopt.runtimes.runtime_of`)
opens, profiles and counts it; nothing heavy is imported at module level: a process measuring a
TFLite or ONNX model never loads TensorFlow, so its peak memory is the model's and its runtime's.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.artifacts import (
    RUNNER_PARAMS,
    BenchmarkInputs,
    LatencyStats,
    OpProfile,
    Runoff,
    VariantResult,
    VariantSpec,
    median_interval,
)
from tfopt.config import MeasurementProtocol, resolve_cpus
from tfopt.cpu_features import amx_permitted, cpu_flags, deny_amx
from tfopt.fileio import (
    atomic_save_array,
    atomic_write_json,
    gzip_size_bytes,
    path_size_bytes,
)
from tfopt.measurement.floor import floor_format, floor_key
from tfopt.measurement.machine_load import LoadProbe, background_cores
from tfopt.runtimes import load_runner, runtime_of
from tfopt.runtimes.base import Runner, outputs_batched, predict_batched, softmax

_KEPT_SAMPLES = 2000
PREDICTIONS_FOLDER = "predictions"
_LOAD_PROBE_S = 0.3


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM) in MB.

    `getrusage`'s ru_maxrss survives `exec` on Linux, so a worker forked from a large parent
    would report the parent's size; VmHWM belongs to the current address space only.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


P50_WINDOWS = 6
"""Consecutive windows whose medians bound the p50: the true median lies between the lowest and
the highest of 6 independent window medians with probability 1 - 2 * 0.5**6 = 96.9%."""


def p50_interval(samples_ms: np.ndarray) -> tuple[float, float]:
    """A distribution-free interval of at least 95% for the p50: the range of window medians.

    Windows of consecutive runs, rather than single runs, carry the slow drifts of a shared
    machine (a neighbour's load, the clock), so two variants whose intervals overlap were not
    told apart by the measurement. With fewer runs than windows, the whole range of the runs.
    """
    if len(samples_ms) < P50_WINDOWS:
        return float(np.min(samples_ms)), float(np.max(samples_ms))
    medians = [float(np.median(window)) for window in np.array_split(samples_ms, P50_WINDOWS)]
    return median_interval(medians)


def p50_settled(samples_ms: np.ndarray, width: float) -> bool:
    """Whether the p50's interval lies within +-`width` of the p50 (the windows agree)."""
    if len(samples_ms) < P50_WINDOWS:
        return False
    return _within(p50_interval(samples_ms), float(np.median(samples_ms)), width)


def _within(interval: tuple[float, float], p50: float, width: float) -> bool:
    return interval[0] >= p50 * (1.0 - width) and interval[1] <= p50 * (1.0 + width)


def latency_stats(samples_ms: np.ndarray, ci_width: float = 0.03) -> LatencyStats:
    """Summarize timed runs (milliseconds) and judge whether they settled.

    The measurement is stable when the p50's interval lies within +-`ci_width` of the p50: the
    medians of all windows agree (a drift, e.g. thermal or a noisy neighbour, moves one window).
    """
    p50, p90, p95, p99 = np.percentile(samples_ms, [50, 90, 95, 99])
    ordered = np.sort(samples_ms)
    trim = len(ordered) // 10
    trimmed = ordered[trim : len(ordered) - trim] if len(ordered) > 2 * trim else ordered
    mean = float(np.mean(samples_ms))
    return LatencyStats(
        p50=float(p50), p90=float(p90), p99=float(p99), mean=mean,
        std=float(np.std(samples_ms)), min=float(ordered[0]), max=float(ordered[-1]),
        p95=float(p95), trimmed_mean=float(np.mean(trimmed)),
        cv=float(np.std(samples_ms) / mean) if mean else 0.0,
        stable=p50_settled(samples_ms, ci_width), p50_ci95=p50_interval(samples_ms),
    )


def time_runs(
    call: Callable[[object], object],
    inputs: Sequence[object],
    cfg: MeasurementProtocol,
) -> np.ndarray:
    """Time `call` on `inputs` in turn, in windows, until the last 6 windows agree.

    Warm-up: at least `warmup_runs` and `warmup_seconds` (untimed: tracing, allocation,
    caches). Then windows of at least `min_runs` / 6 runs and `min_seconds` / 6 seconds are
    timed until the medians of the last 6 lie within +-`p50_ci_width` of their pooled median,
    or `max_seconds` have passed (as Triton's perf_analyzer waits for consecutive windows to
    agree). Windows before those 6 were disturbed (a neighbour's burst, a clock change) and are
    dropped like warm-up; a variant that never settles keeps its last 6 and reads unstable.
    Only the call itself is inside the timed region: picking the input and the bookkeeping are
    not. Python's cyclic garbage collector is paused meanwhile, as `timeit` does, so its
    pauses (whose timing depends on allocations elsewhere in the process) do not land in some
    runs and not others. What survives the collection before is frozen: the next variant's or
    window's collection does not walk TensorFlow's half a million objects again (a measuring
    process spent ~1.4 CPU-s collecting them).

    Args:
        call: One inference on one prepared input (see `Runner.invoke`).
        inputs: Prepared inputs, used round-robin.
        cfg: The protocol's bounds.

    Returns:
        The durations in milliseconds of the runs of the last 6 windows, in order.
    """
    collecting = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return _timed_windows(call, inputs, cfg)
    finally:
        if collecting:
            gc.enable()


def _timed_windows(call: Callable[[object], object], inputs: Sequence[object],
                   cfg: MeasurementProtocol) -> np.ndarray:
    count, clock = len(inputs), time.perf_counter
    index = 0
    warm_until = clock() + cfg.warmup_seconds
    while index < cfg.warmup_runs or clock() < warm_until:
        call(inputs[index % count])
        index += 1
    window_runs = -(-cfg.min_runs // P50_WINDOWS)
    window_seconds = cfg.min_seconds / P50_WINDOWS
    windows: list[list[float]] = []
    started = clock()
    while True:
        window: list[float] = []
        window_started = clock()
        while True:
            prepared = inputs[index % count]
            before = clock()
            call(prepared)
            after = clock()
            window.append(after - before)
            index += 1
            if after - started >= cfg.max_seconds:
                break
            if len(window) >= window_runs and after - window_started >= window_seconds:
                break
        if clock() - started >= cfg.max_seconds:
            if len(window) >= window_runs or len(windows) < P50_WINDOWS:
                windows.append(window)  # a cut-short window counts only if it is needed
            break
        windows.append(window)
        last = windows[-P50_WINDOWS:]
        if len(last) == P50_WINDOWS and _windows_agree(last, cfg.p50_ci_width):
            break
    kept = [duration for window in windows[-P50_WINDOWS:] for duration in window]
    return np.asarray(kept) * 1000.0


def _windows_agree(windows: list[list[float]], width: float) -> bool:
    medians = [float(np.median(window)) for window in windows]
    return _within((min(medians), max(medians)), float(np.median(np.concatenate(windows))),
                   width)


def batch_throughput(runner: Runner, images: np.ndarray | dict[str, np.ndarray],
                     batch_size: int, seconds: float) -> float:
    """Examples per second at `batch_size` (one untimed batch first), for about `seconds`.

    A batch amortizes the per-call cost that batch-1 timing must resolve, so a window's length
    (and at least 3 batches) measures it: about 10x shorter than the batch-1 timing. `images`
    may be named feeds of any model.
    """
    from tfopt.measurement.feeds import count_of, take

    repeat = np.arange(batch_size) % count_of(images)
    batch = take(images, repeat)
    run = runner.predict if isinstance(batch, np.ndarray) else runner.run
    run(batch)
    count, started = 0, time.perf_counter()
    while True:
        run(batch)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and count >= 3:
            return count * batch_size / elapsed


def flops_per_inference(spec: VariantSpec, runner: Runner) -> float | None:
    """FLOPs per example of the model a runner holds (None where its runtime cannot count)."""
    return runtime_of(spec.format).flops(runner)


def operator_profile(spec: VariantSpec, runner: Runner, prepared: Sequence[object],
                     threads: int) -> OpProfile:
    """The variant's top operators (`Runtime.op_profile`), after its timed runs.

    The profile explains the measurement and is not part of it: a profiler that fails leaves
    its error in the profile's method, and the variant stays ok.
    """
    try:
        profile = runtime_of(spec.format).op_profile(runner, prepared, threads)
        return profile or OpProfile(method="no profiler")
    except Exception as error:  # any profiler failure is kept, never fatal
        return OpProfile(method=f"profiler failed: {type(error).__name__}: {error}")


def load_scenarios(spec: VariantSpec, runner: Runner, images: np.ndarray | dict[str, np.ndarray],
                   prepared: Sequence[object], samples_ms: np.ndarray, batch_size: int,
                   cfg: MeasurementProtocol) -> dict[str, float | int | str | None]:
    """The Offline and Server scenarios `cfg.scenarios` asks for (see `load_scenarios`).

    Offline tries batch sizes 1, 8 and the run's batch size on the variant's runner (or the
    one its runtime sets up for throughput: `Runtime.offline_runner`). Server
    clients are runtime instances of their own with `threads / clients` threads each (at
    least one); the rate search starts at half of what the clients could serve at the
    single-stream p50. A budget the single-stream p99 misses, or one client's p99 answering
    alone with its share of the threads, is met at no rate (a query alone takes longer), so the
    rate is 0 without a search, with the reason (`server_reason`): its way down to ever lower
    rates would wait minutes for LoadGen's minimum query count.
    """
    from tfopt.measurement.feeds import count_of
    from tfopt.measurement.load_scenarios import alone_p99_ms, offline_throughput, server_search

    found: dict[str, float | int | str | None] = {}
    p50_s = float(np.median(samples_ms)) / 1000.0
    if "offline" in cfg.scenarios:
        examples = count_of(images)
        fixed_batch = any(i.shape and i.shape[0] is not None for i in runner.inputs)
        sizes = [1] if fixed_batch else sorted({1, min(8, examples), min(batch_size, examples)})
        offline = runtime_of(spec.format).offline_runner(spec, cfg.threads) or runner
        predict = offline.predict if isinstance(images, np.ndarray) else offline.run
        rate, best_size = offline_throughput(predict, images, sizes, 1.0 / p50_s,
                                             cfg.scenario_seconds)
        found.update(offline_examples_per_s=rate, offline_batch_size=best_size)
    if "server" not in cfg.scenarios or cfg.latency_budget_ms is None:
        return found
    single_p99 = float(np.percentile(samples_ms, 99))
    if single_p99 > cfg.latency_budget_ms:
        found.update(server_qps_within_budget=0.0, server_p99_ms=None, server_reason=(
            f"single-stream p99 over budget: {single_p99:.3f} ms > "
            f"{cfg.latency_budget_ms:g} ms, so no arrival rate meets it"))
        return found
    threads = max(1, cfg.threads // cfg.server_clients)
    runners = [runner if threads == cfg.threads else load_runner(spec, threads)]
    runners += [load_runner(spec, threads) for _ in range(cfg.server_clients - 1)]
    clients = [_client(each, images) for each in runners]
    alone_ms = alone_p99_ms(clients[0], prepared, cfg.scenario_seconds)
    if alone_ms > cfg.latency_budget_ms:
        found.update(server_qps_within_budget=0.0, server_p99_ms=None, server_reason=(
            f"p99 at 1 client over budget: {alone_ms:.3f} ms > {cfg.latency_budget_ms:g} ms "
            f"with {threads} thread(s) per client, so no arrival rate meets it"))
        return found
    trial = server_search(clients, prepared, cfg.latency_budget_ms,
                          0.5 * cfg.server_clients / p50_s, cfg.scenario_seconds)
    found.update(server_qps_within_budget=trial.target_qps if trial else 0.0,
                 server_p99_ms=trial.p99_ms if trial else None)
    return found


def _client(runner: Runner, images: np.ndarray | dict[str, np.ndarray],
            ) -> Callable[[object], object]:
    from tfopt.measurement.feeds import take

    runner.prepare(take(images, slice(0, 1)))  # sizes its input for batch 1 again (Offline)
    return runner.invoke


_FLOOR_SECONDS = 0.3


def harness_floor_ms(spec: VariantSpec, inputs: BenchmarkInputs, images: np.ndarray,
                     cfg: MeasurementProtocol) -> float | None:
    """The p50 of the variant's floor model through the same runner, threads and protocol.

    Timed briefly (the floor models take microseconds), once per run for each floor model and
    thread count (`BenchmarkInputs.floor_ms`); None where no floor model was built.
    """
    floor = floor_format(spec.format)
    floor_path = inputs.floor_models.get(floor)
    if floor_path is None:
        return None
    known = inputs.floor_ms.get(floor_key(spec.format, cfg.threads))
    if known is not None:
        return known
    runner = load_runner(VariantSpec(name="harness-floor", source="harness", format=floor,
                                     precision="fp32", path=floor_path), cfg.threads)
    brief = cfg.model_copy(update={"min_seconds": min(cfg.min_seconds, _FLOOR_SECONDS),
                                   "max_seconds": min(cfg.max_seconds, _FLOOR_SECONDS),
                                   "warmup_seconds": min(cfg.warmup_seconds, 0.1)})
    return float(np.median(time_runs(runner.invoke, runner.prepare(images[:32]), brief)))


def time_other_apis(spec: VariantSpec, images: np.ndarray, samples_ms: np.ndarray,
                    cfg: MeasurementProtocol) -> tuple[dict[str, LatencyStats], dict[str, str]]:
    """The variant timed through its runtime's other APIs (`Runtime.other_apis`).

    Each is timed with the run's protocol on the same inputs, after the main runner, in this
    process. A runtime without other APIs gives nothing; an API that fails on this file is
    left out with its error among the facts (the variant stays ok).

    Returns:
        Latency by API, the main API's `samples_ms` included, and each API's facts
        (``<api>.<fact>``).
    """
    runtime = runtime_of(spec.format)
    try:
        others = runtime.other_apis(spec, cfg.threads)
    except Exception as error:  # another API's failure never fails the variant
        return {}, {"other_apis.error": f"{type(error).__name__}: {error}"[:300]}
    if not others:
        return {}, {}
    by_api = {runtime.main_api or "main": latency_stats(samples_ms, cfg.p50_ci_width)}
    facts: dict[str, str] = {}
    for api, other in others.items():
        by_api[api] = latency_stats(time_runs(other.invoke, other.prepare(images), cfg),
                                    cfg.p50_ci_width)
        facts.update({f"{api}.{key}": value for key, value in other.facts().items()})
    return by_api, facts


def measure_variant(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: MeasurementProtocol
) -> VariantResult:
    """Measure a variant in this process (see `benchmark_variant` for the protocol)."""
    if inputs.images is None:
        return measure_on_feeds(spec, inputs, cfg)
    runtime = runtime_of(spec.format)
    metric = inputs.metric()
    images, labels = np.load(inputs.images), np.load(inputs.labels)
    started = time.perf_counter()
    runner = load_runner(spec, cfg.threads)
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    runner.predict(images[:1])
    first_inference_ms = (time.perf_counter() - started) * 1000.0
    logits = predict_batched(runner, images)
    validation = validation_predictions(runner, inputs)
    reference = logits if inputs.reference_logits is None else np.load(inputs.reference_logits)
    prepared = runner.prepare(images)
    cores_before = background_cores(_LOAD_PROBE_S)
    probe = LoadProbe.start()
    timing = time.perf_counter()
    samples = time_runs(runner.invoke, prepared, cfg)
    timing_seconds = time.perf_counter() - timing
    cores_during = probe.cores()
    floor_ms = harness_floor_ms(spec, inputs, images, cfg)
    flops = flops_per_inference(spec, runner)
    timing = time.perf_counter()
    scenarios = load_scenarios(spec, runner, images, prepared, samples, inputs.batch_size, cfg)
    timing_seconds += time.perf_counter() - timing
    profiling = time.perf_counter()
    profile = (operator_profile(spec, runner, prepared, cfg.threads) if cfg.profile
               else OpProfile(method="not profiled (benchmark.profile: false)"))
    profile_seconds = time.perf_counter() - profiling
    timing = time.perf_counter()
    throughput_at_batch = batch_throughput(runner, images, inputs.batch_size,
                                           max(0.2, cfg.min_seconds / P50_WINDOWS))
    timing_seconds += time.perf_counter() - timing
    intra, inter = runtime.threads_in_force() or (None, None)
    extra_files = runtime.extra_files(runner, spec, images)
    peak_mb = peak_rss_mb()  # before another API's copy of the model is opened
    profiling = time.perf_counter()
    by_api, api_facts = time_other_apis(spec, images, samples, cfg) if cfg.profile else ({}, {})
    profile_seconds += time.perf_counter() - profiling
    return VariantResult(
        name=spec.name,
        source=spec.source,
        format=spec.format,
        precision=spec.precision,
        status="ok",
        derived_from=spec.derived_from,
        size_bytes=path_size_bytes(spec.path),
        gzip_bytes=gzip_size_bytes(spec.path),
        accuracy=metric.score(labels if metric.needs_labels else reference, logits),
        metric=metric.name,
        val_accuracy=(None if validation is None or not metric.needs_labels
                      else metric.score(validation[1], validation[0])),
        predictions=save_predictions(spec.name, np.argmax(logits, axis=1), inputs),
        val_predictions=(None if validation is None
                         else save_predictions(spec.name, np.argmax(validation[0], axis=1),
                                               inputs, "val")),
        latency_ms=latency_stats(samples, cfg.p50_ci_width),
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples),
        load_seconds=load_seconds,
        first_inference_ms=first_inference_ms,
        peak_rss_mb=peak_mb,
        top1_agreement=float(np.mean(np.argmax(reference, 1) == np.argmax(logits, 1))),
        max_abs_diff=float(np.max(np.abs(softmax(reference) - softmax(logits)))),
        batch_throughput_per_s=throughput_at_batch,
        runner_params={**{key: str(value) for key, value in spec.params.items()
                          if key in RUNNER_PARAMS}, **runner.facts(), **api_facts,
                       **amx_fact()},
        latency_ms_by_api=by_api,
        batch_size=inputs.batch_size,
        samples_ms=[float(v) for v in samples[:_KEPT_SAMPLES]],
        path=spec.path,
        tf_intra_op_threads=intra,
        tf_inter_op_threads=inter,
        extra_files=extra_files,
        background_cores_before=cores_before,
        background_cores=cores_during,
        harness_floor_ms=floor_ms,
        gflops_per_inference=None if flops is None else flops / 1e9,
        op_profile=profile,
        profile_seconds=profile_seconds,
        timing_seconds=timing_seconds,
        **scenarios,
        under_load=any(cores is not None and cores > cfg.max_background_cores
                       for cores in (cores_before, cores_during)),
    )


def validation_predictions(runner: Runner, inputs: BenchmarkInputs,
                           ) -> tuple[np.ndarray, np.ndarray] | None:
    """The runner's scores for the validation images, and the labels (None: no images)."""
    if inputs.selection_images is None or inputs.selection_labels is None:
        return None
    images, labels = np.load(inputs.selection_images), np.load(inputs.selection_labels)
    if len(images) == 0:
        return None
    return predict_batched(runner, images), labels


def save_predictions(name: str, predicted: np.ndarray, inputs: BenchmarkInputs,
                     split: str = "test") -> Path | None:
    """Write a variant's predicted classes on `split` beside the test images (atomically).

    Returns:
        Their path (None: the inputs have no images).
    """
    if inputs.images is None:
        return None
    folder = inputs.images.parent / PREDICTIONS_FOLDER
    path = (folder if split == "test" else folder / split) / f"{name}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_array(path, predicted.astype(np.int32))
    return path


def measure_on_feeds(spec: VariantSpec, inputs: BenchmarkInputs,
                     cfg: MeasurementProtocol) -> VariantResult:
    """Measure a model of any inputs and outputs on named feeds.

    The feeds are the user's file, or generated from the model's signature now (and written
    to `inputs.feeds`, so the same inputs can be given again). Everything but agreement is
    measured as for a pipeline's variant: latency statistics, throughput, load scenarios, peak
    memory, FLOPs and the operator profile, and the metric where the user's file holds labels
    or targets (`score_on_feeds`). A model whose batch dimension is fixed is measured at batch
    1 only.

    Raises:
        FeedsError: The inputs do not fit the model (naming the input).
        MetricError: The metric cannot score the outputs against the labels (one line).
    """
    from tfopt.measurement.feeds import generated_feeds, read_feeds, save_feeds, take

    runtime = runtime_of(spec.format)
    started = time.perf_counter()
    runner = load_runner(spec, cfg.threads)
    load_seconds = time.perf_counter() - started
    if inputs.generate is not None:
        feeds = generated_feeds(runner.inputs, inputs.generate, inputs.examples)
        if inputs.feeds is not None:
            save_feeds(inputs.feeds, feeds)
    else:
        feeds = read_feeds(inputs.feeds, runner.inputs)
    started = time.perf_counter()
    runner.run(take(feeds, slice(0, 1)))
    first_inference_ms = (time.perf_counter() - started) * 1000.0
    metric, score = score_on_feeds(runner, inputs, feeds)
    validated = validation_on_feeds(runner, inputs)
    prepared = runner.prepare(feeds)
    cores_before = background_cores(_LOAD_PROBE_S)
    probe = LoadProbe.start()
    samples = time_runs(runner.invoke, prepared, cfg)
    cores_during = probe.cores()
    flops = flops_per_inference(spec, runner)
    scenarios = load_scenarios(spec, runner, feeds, prepared, samples, inputs.batch_size, cfg)
    profile = operator_profile(spec, runner, prepared, cfg.threads)
    throughput_at_batch, batch = _batch_throughput_if_batched(
        runner, feeds, inputs.batch_size, max(0.2, cfg.min_seconds / P50_WINDOWS))
    intra, inter = runtime.threads_in_force() or (None, None)
    return VariantResult(
        name=spec.name, source=spec.source, format=spec.format, precision=spec.precision,
        status="ok", derived_from=spec.derived_from, size_bytes=path_size_bytes(spec.path),
        gzip_bytes=gzip_size_bytes(spec.path), accuracy=score, metric=metric,
        val_accuracy=validated,
        latency_ms=latency_stats(samples, cfg.p50_ci_width),
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples), load_seconds=load_seconds,
        first_inference_ms=first_inference_ms, peak_rss_mb=peak_rss_mb(),
        batch_throughput_per_s=throughput_at_batch, batch_size=batch,
        runner_params={**{key: str(value) for key, value in spec.params.items()
                          if key in RUNNER_PARAMS}, **runner.facts(), **amx_fact()},
        samples_ms=[float(v) for v in samples[:_KEPT_SAMPLES]], path=spec.path,
        tf_intra_op_threads=intra, tf_inter_op_threads=inter,
        background_cores_before=cores_before, background_cores=cores_during,
        gflops_per_inference=None if flops is None else flops / 1e9, op_profile=profile,
        **scenarios,
        under_load=any(cores is not None and cores > cfg.max_background_cores
                       for cores in (cores_before, cores_during)),
    )


def score_on_feeds(runner: Runner, inputs: BenchmarkInputs, feeds: dict[str, np.ndarray],
                   ) -> tuple[str, float | None]:
    """The metric's name, and its figure on the user's feeds against their labels or targets.

    Against the file's ``y``, or for a fidelity metric against the reference model's output of
    the same name (`BenchmarkInputs.reference_outputs`). The figure is None where there is
    nothing to score against: inputs generated for this model alone, a file without ``y``, a
    fidelity metric without a reference.

    Raises:
        FeedsError: ``eval.output`` names no output of the model, or of the reference.
        MetricError: The metric cannot score the outputs against ``y`` (one line).
    """
    metric = inputs.metric()
    if inputs.generate is not None or inputs.feeds is None:
        return metric.name, None
    return metric.name, _scored(runner, inputs.feeds, inputs.reference_outputs, inputs, feeds)


def validation_on_feeds(runner: Runner, inputs: BenchmarkInputs) -> float | None:
    """The metric's figure on the validation split's feeds (None: nothing to score against).

    Raises:
        FeedsError, MetricError: As `score_on_feeds`.
    """
    if inputs.selection_feeds is None:
        return None
    return _scored(runner, inputs.selection_feeds, inputs.selection_reference_outputs, inputs)


def _scored(runner: Runner, path: Path, reference_outputs: Path | None,
            inputs: BenchmarkInputs, feeds: dict[str, np.ndarray] | None = None,
            ) -> float | None:
    """The run's metric on its output for an ``.npz``'s feeds (given, else read).

    Against the file's ``y``, or for a fidelity metric against the reference's same-named
    output in `reference_outputs`; None where there is no such truth.

    Raises:
        FeedsError, MetricError: As `score_on_feeds`.
    """
    from tfopt.measurement.feeds import FeedsError, read_feeds, read_truth

    metric = inputs.metric()
    output = scored_output(runner, inputs.judged_by.output)
    if metric.needs_labels:
        truth = read_truth(path, runner.inputs)
    elif reference_outputs is None:
        truth = None
    else:
        with np.load(reference_outputs) as reference:
            if output not in reference.files:
                raise FeedsError(f"the reference model has no output {output!r} (its "
                                 f"outputs: {', '.join(reference.files)}): outputs are "
                                 "matched by name")
            truth = reference[output]
    if truth is None:
        return None
    feeds = feeds if feeds is not None else read_feeds(path, runner.inputs)
    return metric.score(truth, outputs_batched(runner, feeds)[output])


def scored_output(runner: Runner, name: str | None) -> str:
    """The output a metric scores: `name` (``eval.output``), else logits or the first output.

    Raises:
        FeedsError: The model has no output `name` (naming its outputs).
    """
    from tfopt.measurement.feeds import FeedsError

    if name is None:
        return runner.scores_output
    names = [output.name for output in runner.outputs]
    if name not in names:
        raise FeedsError(f"eval.output: the model has no output {name!r}; its outputs: "
                         f"{', '.join(names)}")
    return name


def _batch_throughput_if_batched(runner: Runner, feeds: dict[str, np.ndarray],
                                 batch_size: int, seconds: float) -> tuple[float, int]:
    """Examples/s at `batch_size`, or at batch 1 where the model's batch dimension is fixed."""
    fixed = any(info.shape and info.shape[0] is not None for info in runner.inputs)
    size = 1 if fixed else batch_size
    return batch_throughput(runner, feeds, size, seconds), size


def measure_runoff(specs: list[VariantSpec], inputs: BenchmarkInputs,
                   cfg: MeasurementProtocol, rounds: int = P50_WINDOWS,
                   thread_counts: Sequence[int] = ()) -> Runoff:
    """Time `specs` in `rounds` alternating rounds in this process (`tfopt.measurement.runoff`).

    With two or more `thread_counts`, each contender takes part at each count in the same
    alternating rounds, and its figures are its fastest count's (`fastest_thread_count`): each
    file at the count a deployer would give it, picked under the conditions its rivals' counts
    were: a count picked in rounds of its own can run 2x slower in the rounds that follow, and
    flatter every file quoted against it (docs/measurements.md). Each file is loaded once per
    count. Each turn lasts
    about `min_seconds` / 4 over 6 rounds, the same time in all over more rounds. The cores
    other processes kept busy meanwhile are recorded, as for a turn (`Runoff.under_load`).
    """
    turn_seconds = max(cfg.min_seconds / 4.0 * P50_WINDOWS / rounds, 0.05)
    probe = LoadProbe.start()
    counts = list(thread_counts) if len(thread_counts) > 1 else [cfg.threads]
    loaded = _loaded_entries({(spec.name, threads): (spec, threads)
                              for spec in specs for threads in counts}, inputs)
    timed = _alternating_rounds(loaded, cfg, rounds, turn_seconds)
    del loaded
    picked: dict[str, int] = {}
    pick_p50s: dict[str, dict[int, float]] = {}
    if len(counts) > 1:
        for spec in specs:
            by_count = {threads: timed[(spec.name, threads)] for threads in counts}
            picked[spec.name] = fastest_thread_count(by_count)
            pick_p50s[spec.name] = {threads: float(np.median(p50s))
                                    for threads, p50s in by_count.items()}
    round_p50s = {spec.name: timed[(spec.name, picked.get(spec.name, cfg.threads))]
                  for spec in specs}
    cores = probe.cores()
    return Runoff(rounds=rounds, threads=picked, thread_pick_p50_ms=pick_p50s,
                  round_p50_ms=round_p50s, background_cores=cores,
                  under_load=cores is not None and cores > cfg.max_background_cores)


def fastest_thread_count(round_p50s: dict[int, list[float]]) -> int:
    """The thread count whose rounds ran fastest, paired round by round with the first count's.

    The median of per-round ratios, as `Runoff.ratio` reads speed-ups; on a tie the fewer threads
    (they leave the other cores to the rest of the machine).
    """
    first = next(iter(round_p50s.values()))
    return min(round_p50s, key=lambda threads: (
        float(np.median([mine / theirs for mine, theirs in
                         zip(round_p50s[threads], first, strict=True)])), threads))


def _loaded_entries(entries: dict[Any, tuple[VariantSpec, int]], inputs: BenchmarkInputs,
                    ) -> dict[Any, tuple[Runner, Any]]:
    """Each entry (a file at a thread count) loaded, with its timed inputs prepared."""
    runners = {key: load_runner(spec, threads) for key, (spec, threads) in entries.items()}
    return {key: (runner, runner.prepare(_timed_inputs(runner, inputs)))
            for key, runner in runners.items()}


def _alternating_rounds(loaded: dict[Any, tuple[Runner, Any]], cfg: MeasurementProtocol,
                        rounds: int, turn_seconds: float) -> dict[Any, list[float]]:
    """Each loaded entry's (a file at a thread count) p50 in each of `rounds` alternating rounds.

    A first, untimed round warms every entry with the run's warm-up (`warmup_runs`,
    `warmup_seconds`): a first round reads slower than the later ones even after each entry's
    own warm-up, and its figures would widen every interval until all overlap. Then each turn is a
    short measurement with the run's protocol: `warmup_runs` and windows for `turn_seconds`. The
    order rotates each round.
    """
    warm_up = cfg.model_copy(update={"min_seconds": turn_seconds, "max_seconds": turn_seconds,
                                     "min_runs": max(P50_WINDOWS, cfg.min_runs // 4)})
    turn = warm_up.model_copy(update={"warmup_seconds": 0.0})
    keys = list(loaded)
    for key in keys:
        runner, prepared = loaded[key]
        time_runs(runner.invoke, prepared, warm_up)
    round_p50s: dict[Any, list[float]] = {key: [] for key in keys}
    for round_index in range(rounds):
        shift = round_index % len(keys)
        for key in keys[shift:] + keys[:shift]:
            runner, prepared = loaded[key]
            samples = time_runs(runner.invoke, prepared, turn)
            round_p50s[key].append(float(np.median(samples)))
    return round_p50s


def _timed_inputs(runner: Runner, inputs: BenchmarkInputs) -> np.ndarray | dict[str, np.ndarray]:
    """The test images, or the model's named feeds as `measure_on_feeds` reads or makes them."""
    from tfopt.measurement.feeds import generated_feeds, read_feeds

    if inputs.images is not None:
        return np.load(inputs.images)
    if inputs.generate is not None:
        return generated_feeds(runner.inputs, inputs.generate, inputs.examples)
    return read_feeds(inputs.feeds, runner.inputs)


def amx_fact() -> dict[str, str]:
    """Whether this process held AMX when it measured, on a CPU that has AMX (else nothing).

    XNNPACK and oneDNN ask for AMX when they load a model; ``benchmark.amx: denied`` refuses it.
    """
    if "amx_tile" not in cpu_flags():
        return {}
    return {"amx_permitted": str(amx_permitted()).lower()}


def read_request(request_path: str) -> tuple[dict, MeasurementProtocol]:
    """A worker's request and its protocol; pins this process to `cfg.cpus` if set.

    With ``benchmark.amx: denied`` AMX is refused to this process before any model loads.
    """
    request = json.loads(Path(request_path).read_text())
    cfg = MeasurementProtocol.of(request["cfg"])
    cfg = cfg.model_copy(update={"cpus": resolve_cpus(cfg.cpus)})
    if cfg.cpus:
        os.sched_setaffinity(0, cfg.cpus)
    if cfg.amx == "denied":
        deny_amx()
    return request, cfg


def main(request_path: str, response_path: str) -> None:
    """Read a request (a variant, or run-off contenders; inputs; protocol), measure, write JSON."""
    request, cfg = read_request(request_path)
    inputs = BenchmarkInputs.model_validate(request["inputs"])
    if "specs" in request:
        measured = measure_runoff([VariantSpec.model_validate(s) for s in request["specs"]],
                                  inputs, cfg, request.get("rounds", P50_WINDOWS),
                                  request.get("thread_counts", ()))
    else:
        measured = measure_variant(VariantSpec.model_validate(request["spec"]), inputs, cfg)
    atomic_write_json(Path(response_path), measured.model_dump(mode="json"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
