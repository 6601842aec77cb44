"""The measuring side of the benchmark: one variant, in this process. Not a task.

`benchmark_variant` runs ``python -m tasks.benchmark_worker REQUEST RESULT`` so each variant is
measured in a fresh process. Nothing heavy is imported at module level: a process measuring a
TFLite or ONNX model never loads TensorFlow, so its peak memory is the model's and its runtime's.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tfopt.artifacts import BenchmarkInputs, LatencyStats, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.fileio import atomic_write_json, gzip_size_bytes, path_size_bytes


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


def latency_stats(samples_ms: np.ndarray) -> LatencyStats:
    """Summarize timed runs (milliseconds): percentiles, mean and standard deviation."""
    p50, p90, p99 = np.percentile(samples_ms, [50, 90, 99])
    return LatencyStats(
        p50=float(p50), p90=float(p90), p99=float(p99),
        mean=float(np.mean(samples_ms)), std=float(np.std(samples_ms)),
    )


def time_runs(
    run_once: Callable[[int], object],
    warmup_runs: int,
    min_runs: int,
    max_seconds: float,
) -> np.ndarray:
    """Time `run_once(i)` after untimed warm-up runs.

    Runs until `min_runs` are timed, unless `max_seconds` of timed work pass first (a slow
    model is still measured, with fewer runs).

    Args:
        run_once: One inference; receives the run index to pick its input.
        warmup_runs: Untimed runs first (graph tracing, allocation, caches).
        min_runs: Timed runs wanted.
        max_seconds: Time budget for the timed runs.

    Returns:
        The timed runs' durations in milliseconds.
    """
    for index in range(warmup_runs):
        run_once(index)
    samples = []
    budget_end = time.perf_counter() + max_seconds
    for index in range(min_runs):
        started = time.perf_counter()
        run_once(index)
        finished = time.perf_counter()
        samples.append((finished - started) * 1000.0)
        if finished > budget_end:
            break
    return np.asarray(samples)


def measure_variant(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> VariantResult:
    """Measure a variant in this process (see `benchmark_variant` for the protocol)."""
    from tasks.runners import GraphRunner, load_runner, predict_batched, softmax

    images, labels = np.load(inputs.images), np.load(inputs.labels)
    started = time.perf_counter()
    runner = load_runner(spec, cfg.threads)
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    runner.predict(images[:1])
    first_inference_ms = (time.perf_counter() - started) * 1000.0
    logits = predict_batched(runner, images)
    reference = np.load(inputs.reference_logits)
    singles = [images[i : i + 1] for i in range(len(images))]
    samples = time_runs(
        lambda i: runner.predict(singles[i % len(singles)]),
        cfg.warmup_runs, cfg.min_runs, cfg.max_seconds,
    )
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
        size_bytes=path_size_bytes(spec.path),
        gzip_bytes=gzip_size_bytes(spec.path),
        accuracy=float(np.mean(np.argmax(logits, axis=1) == labels)),
        latency_ms=latency_stats(samples),
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples),
        load_seconds=load_seconds,
        first_inference_ms=first_inference_ms,
        peak_rss_mb=peak_rss_mb(),
        top1_agreement=float(np.mean(np.argmax(reference, 1) == np.argmax(logits, 1))),
        max_abs_diff=float(np.max(np.abs(softmax(reference) - softmax(logits)))),
        path=spec.path,
        extra_files=extra_files,
    )


def main(request_path: str, response_path: str) -> None:
    """Read a request (variant, inputs, protocol), measure, write the result as JSON."""
    request = json.loads(Path(request_path).read_text())
    result = measure_variant(
        VariantSpec.model_validate(request["spec"]),
        BenchmarkInputs.model_validate(request["inputs"]),
        BenchmarkConfig.model_validate(request["cfg"]),
    )
    atomic_write_json(Path(response_path), result.model_dump(mode="json"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
