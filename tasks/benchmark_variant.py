"""Benchmark one variant: accuracy and agreement on the test split, latency, memory, size.

Each variant is measured in a fresh process by default (`python -m tasks.benchmark_variant`),
so variants do not disturb each other's memory or thread pools, XLA auto-clustering can be
switched on by environment flags, and a crashing backend fails only its own variant.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prefect import task

from tfopt.artifacts import DatasetArtifact, LatencyStats, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.fileio import atomic_write_json, gzip_size_bytes, path_size_bytes
from tfopt.logs import step_logger

_WORKER_TIMEOUT_S = 3600


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


def worker_env(spec: VariantSpec) -> dict[str, str]:
    """Environment of the measuring process: XLA auto-clustering flags for that variant only."""
    from tasks.runners import XLA_AUTOCLUSTER_FLAGS

    env = dict(os.environ)
    env.pop("TF_XLA_FLAGS", None)
    if spec.params.get("xla_mode") == "autocluster":
        env["TF_XLA_FLAGS"] = XLA_AUTOCLUSTER_FLAGS
    return env


def measure_variant(
    spec: VariantSpec,
    dataset: DatasetArtifact,
    cfg: BenchmarkConfig,
    reference_logits: Path | None = None,
) -> VariantResult:
    """Measure a variant in this process (see `benchmark_variant` for the protocol)."""
    from tasks.input_pipeline import load_split_arrays
    from tasks.runners import GraphRunner, load_runner, predict_batched, softmax

    images, labels = load_split_arrays(dataset.splits["test"].files, dataset.image_size)
    if len(images) == 0:
        raise ValueError("the test split is empty: nothing to benchmark on")
    started = time.perf_counter()
    runner = load_runner(spec, cfg.threads)
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    runner.predict(images[:1])
    first_inference_ms = (time.perf_counter() - started) * 1000.0
    logits = predict_batched(runner, images)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
    agreement = max_diff = None
    if reference_logits is not None:
        reference = np.load(reference_logits)
        agreement = float(np.mean(np.argmax(reference, 1) == np.argmax(logits, 1)))
        max_diff = float(np.max(np.abs(softmax(reference) - softmax(logits))))
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
        accuracy=accuracy,
        latency_ms=latency_stats(samples),
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples),
        load_seconds=load_seconds,
        first_inference_ms=first_inference_ms,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        top1_agreement=agreement,
        max_abs_diff=max_diff,
        path=spec.path,
        extra_files=extra_files,
    )


def _measure_in_subprocess(
    spec: VariantSpec, dataset: DatasetArtifact, cfg: BenchmarkConfig,
    reference_logits: Path | None,
) -> VariantResult:
    with tempfile.TemporaryDirectory(prefix="tfopt-bench-") as tmp:
        request, response = Path(tmp) / "request.json", Path(tmp) / "result.json"
        atomic_write_json(request, {
            "spec": spec.model_dump(mode="json"),
            "dataset": dataset.model_dump(mode="json"),
            "cfg": cfg.model_dump(mode="json"),
            "reference_logits": str(reference_logits) if reference_logits else None,
        })
        completed = subprocess.run(
            [sys.executable, "-m", "tasks.benchmark_variant", str(request), str(response)],
            env=worker_env(spec), capture_output=True, text=True, timeout=_WORKER_TIMEOUT_S,
        )
        if completed.returncode != 0 or not response.exists():
            tail = completed.stderr.strip().splitlines()[-1:] or [f"exit {completed.returncode}"]
            raise RuntimeError(f"benchmark process failed: {tail[0][:500]}")
        return VariantResult.model_validate_json(response.read_text())


@task(name="benchmark_variant", tags=["benchmark"])
def benchmark_variant(
    variant: VariantSpec,
    dataset: DatasetArtifact,
    cfg: BenchmarkConfig,
    reference_logits: Path | None = None,
) -> VariantResult:
    """Measure one variant with the same protocol and the same test inputs as every other.

    Protocol: load (timed), first inference (timed separately: tracing, XLA compilation),
    accuracy and agreement with the float reference over the whole test split, then batch-1
    latency over test examples in order: `warmup_runs` untimed, then `min_runs` timed runs
    within `max_seconds`.

    Args:
        variant: The model file or folder, its format and precision.
        dataset: The sharded data set; its test split is the input.
        cfg: Warm-up, run count, time budget, thread count, process isolation.
        reference_logits: The float model's test-split logits, for top-1 agreement and max
            absolute probability difference.

    Returns:
        The measurements.

    Raises:
        RuntimeError: The measuring process failed.
        ValueError: A variant that needs its own process while `cfg.isolate` is off.
    """
    logger = step_logger()
    if cfg.isolate:
        result = _measure_in_subprocess(variant, dataset, cfg, reference_logits)
    elif variant.params.get("xla_mode") == "autocluster":
        raise ValueError("XLA auto-clustering needs benchmark.isolate=true (process-wide flags)")
    else:
        result = measure_variant(variant, dataset, cfg, reference_logits)
    logger.info(
        "%s: accuracy %.4f, p50 %.3f ms, first inference %.1f ms, peak RSS %.0f MB, %d bytes",
        variant.name, result.accuracy, result.latency_ms.p50, result.first_inference_ms,
        result.peak_rss_mb, result.size_bytes,
    )
    return result


def _worker_main(request_path: str, response_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    reference = request["reference_logits"]
    result = measure_variant(
        VariantSpec.model_validate(request["spec"]),
        DatasetArtifact.model_validate(request["dataset"]),
        BenchmarkConfig.model_validate(request["cfg"]),
        Path(reference) if reference else None,
    )
    atomic_write_json(Path(response_path), result.model_dump(mode="json"))


if __name__ == "__main__":
    import tfopt  # noqa: F401  (environment before TensorFlow)

    _worker_main(*sys.argv[1:3])
