"""The measuring side of the benchmark: one variant, in this process. Not a task.

`benchmark_variant` runs ``python -m tasks.benchmark_worker REQUEST RESULT`` so each variant is
measured in a fresh process. Nothing heavy is imported at module level: a process measuring a
TFLite or ONNX model never loads TensorFlow, so its peak memory is the model's and its runtime's.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.machine_load import LoadProbe, background_cores
from tfopt.artifacts import BenchmarkInputs, LatencyStats, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.fileio import atomic_write_json, gzip_size_bytes, path_size_bytes

_KEPT_SAMPLES = 2000
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
    return min(medians), max(medians)


def latency_stats(samples_ms: np.ndarray, stability_tolerance: float = 0.1) -> LatencyStats:
    """Summarize timed runs (milliseconds) and judge whether they settled.

    The measurement is stable when the medians of its last two thirds agree within
    `stability_tolerance` (a drift, e.g. thermal or a noisy neighbour, shows there first).
    """
    p50, p90, p95, p99 = np.percentile(samples_ms, [50, 90, 95, 99])
    ordered = np.sort(samples_ms)
    trim = len(ordered) // 10
    trimmed = ordered[trim : len(ordered) - trim] if len(ordered) > 2 * trim else ordered
    mean = float(np.mean(samples_ms))
    thirds = np.array_split(samples_ms, 3)
    middle, last = float(np.median(thirds[1])), float(np.median(thirds[2]))
    stable = bool(abs(last - middle) <= stability_tolerance * max(middle, 1e-12))
    return LatencyStats(
        p50=float(p50), p90=float(p90), p99=float(p99), mean=mean,
        std=float(np.std(samples_ms)), min=float(ordered[0]), max=float(ordered[-1]),
        p95=float(p95), trimmed_mean=float(np.mean(trimmed)),
        cv=float(np.std(samples_ms) / mean) if mean else 0.0, stable=stable,
        p50_ci95=p50_interval(samples_ms),
    )


def time_runs(
    run_once: Callable[[int], object],
    cfg: BenchmarkConfig,
) -> np.ndarray:
    """Time `run_once(i)` after warm-up, with the run count and duration bounded both ways.

    Warm-up: at least `warmup_runs` and `warmup_seconds` (untimed: tracing, allocation,
    caches). Timed: until both `min_runs` and `min_seconds` are reached, but never past
    `max_seconds` (a slow model is still measured, with fewer runs).

    Args:
        run_once: One inference; receives the run index to pick its input.
        cfg: The protocol's bounds.

    Returns:
        The timed runs' durations in milliseconds.
    """
    index = 0
    warm_until = time.perf_counter() + cfg.warmup_seconds
    while index < cfg.warmup_runs or time.perf_counter() < warm_until:
        run_once(index)
        index += 1
    samples = []
    started = time.perf_counter()
    while True:
        before = time.perf_counter()
        run_once(index)
        after = time.perf_counter()
        samples.append((after - before) * 1000.0)
        index += 1
        elapsed = after - started
        if elapsed >= cfg.max_seconds:
            break
        if len(samples) >= cfg.min_runs and elapsed >= cfg.min_seconds:
            break
    return np.asarray(samples)


def batch_throughput(runner: object, images: np.ndarray, batch_size: int,
                     seconds: float) -> float:
    """Examples per second at `batch_size` (one untimed batch first), for about `seconds`."""
    batch = np.concatenate([images] * (-(-batch_size // len(images))))[:batch_size]
    runner.predict(batch)
    count, started = 0, time.perf_counter()
    while True:
        runner.predict(batch)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and count >= 3:
            return count * batch_size / elapsed


def measure_variant(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> VariantResult:
    """Measure a variant in this process (see `benchmark_variant` for the protocol)."""
    from tasks.runners import (
        TF_FORMATS,
        GraphRunner,
        load_runner,
        predict_batched,
        softmax,
        tf_threads_in_force,
    )

    images, labels = np.load(inputs.images), np.load(inputs.labels)
    started = time.perf_counter()
    runner = load_runner(spec, cfg.threads)
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    runner.predict(images[:1])
    first_inference_ms = (time.perf_counter() - started) * 1000.0
    logits = predict_batched(runner, images)
    reference = logits if inputs.reference_logits is None else np.load(inputs.reference_logits)
    singles = [images[i : i + 1] for i in range(len(images))]
    cores_before = background_cores(_LOAD_PROBE_S)
    probe = LoadProbe.start()
    samples = time_runs(lambda i: runner.predict(singles[i % len(singles)]), cfg)
    cores_during = probe.cores()
    throughput_at_batch = batch_throughput(runner, images, inputs.batch_size,
                                           min(max(0.2, cfg.min_seconds), cfg.max_seconds))
    intra, inter = tf_threads_in_force() if spec.format in TF_FORMATS else (None, None)
    extra_files = []
    hlo_path = spec.params.get("hlo_path")
    if hlo_path and isinstance(runner, GraphRunner):
        Path(str(hlo_path)).write_text(runner.hlo_text(images[:1]))
        extra_files.append(Path(str(hlo_path)))
    return VariantResult(
        name=spec.name,
        source=spec.source,
        format=spec.format,
        precision=spec.precision,
        status="ok",
        derived_from=spec.derived_from,
        size_bytes=path_size_bytes(spec.path),
        gzip_bytes=gzip_size_bytes(spec.path),
        accuracy=float(np.mean(np.argmax(logits, axis=1) == labels)),
        latency_ms=latency_stats(samples, cfg.stability_tolerance),
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples),
        load_seconds=load_seconds,
        first_inference_ms=first_inference_ms,
        peak_rss_mb=peak_rss_mb(),
        top1_agreement=float(np.mean(np.argmax(reference, 1) == np.argmax(logits, 1))),
        max_abs_diff=float(np.max(np.abs(softmax(reference) - softmax(logits)))),
        batch_throughput_per_s=throughput_at_batch,
        batch_size=inputs.batch_size,
        samples_ms=[float(v) for v in samples[:_KEPT_SAMPLES]],
        path=spec.path,
        tf_intra_op_threads=intra,
        tf_inter_op_threads=inter,
        extra_files=extra_files,
        background_cores_before=cores_before,
        background_cores=cores_during,
        under_load=any(cores is not None and cores > cfg.max_background_cores
                       for cores in (cores_before, cores_during)),
    )


def main(request_path: str, response_path: str) -> None:
    """Read a request (variant, inputs, protocol), measure, write the result as JSON."""
    request = json.loads(Path(request_path).read_text())
    cfg = BenchmarkConfig.model_validate(request["cfg"])
    if cfg.cpus:
        os.sched_setaffinity(0, cfg.cpus)
    result = measure_variant(
        VariantSpec.model_validate(request["spec"]),
        BenchmarkInputs.model_validate(request["inputs"]),
        cfg,
    )
    atomic_write_json(Path(response_path), result.model_dump(mode="json"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
