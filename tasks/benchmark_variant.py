"""Benchmark one variant: accuracy on the test split, batch-1 latency, throughput, size."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from prefect import task

from tasks.input_pipeline import load_split_arrays
from tasks.runners import load_runner, predict_batched
from tfopt.artifacts import DatasetArtifact, LatencyStats, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.fileio import gzip_size_bytes, path_size_bytes
from tfopt.logs import step_logger


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


@task(name="benchmark_variant", tags=["benchmark"])
def benchmark_variant(
    variant: VariantSpec, dataset: DatasetArtifact, cfg: BenchmarkConfig
) -> VariantResult:
    """Measure one variant with the same protocol and the same test inputs as every other.

    Args:
        variant: The model file or folder, its format and precision.
        dataset: The sharded data set; its test split is the input.
        cfg: Warm-up, run count and time budget, thread count.

    Returns:
        Accuracy on the whole test split, batch-1 latency statistics (warm-up excluded),
        throughput, size and gzip size.
    """
    logger = step_logger()
    images, labels = load_split_arrays(dataset.splits["test"].files, dataset.image_size)
    if len(images) == 0:
        raise ValueError("the test split is empty: nothing to benchmark on")
    started = time.perf_counter()
    runner = load_runner(variant.format, variant.path, cfg.threads)
    load_seconds = time.perf_counter() - started
    logits = predict_batched(runner, images)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
    singles = [images[i : i + 1] for i in range(len(images))]
    samples = time_runs(
        lambda i: runner.predict(singles[i % len(singles)]),
        cfg.warmup_runs, cfg.min_runs, cfg.max_seconds,
    )
    stats = latency_stats(samples)
    result = VariantResult(
        name=variant.name,
        source=variant.source,
        format=variant.format,
        precision=variant.precision,
        status="ok",
        size_bytes=path_size_bytes(variant.path),
        gzip_bytes=gzip_size_bytes(variant.path),
        accuracy=accuracy,
        latency_ms=stats,
        throughput_per_s=float(len(samples) / (samples.sum() / 1000.0)),
        timed_runs=len(samples),
        load_seconds=load_seconds,
        path=variant.path,
    )
    logger.info(
        "%s: accuracy %.4f, p50 %.3f ms, %d bytes", variant.name, accuracy, stats.p50,
        result.size_bytes,
    )
    return result
