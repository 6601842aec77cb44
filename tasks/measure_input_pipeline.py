"""Measure examples per second of the naive, tuned and cached readers on the same shards."""

from __future__ import annotations

import time
from dataclasses import replace

import tensorflow as tf
from prefect import task

from tasks.input_pipeline import naive_dataset, reader_options, tuned_dataset
from tfopt.artifacts import DatasetArtifact, InputPipelineResult
from tfopt.config import InputConfig
from tfopt.logs import step_logger


def examples_per_second(dataset: tf.data.Dataset, passes: int = 1) -> tuple[float, int]:
    """Iterate `dataset` `passes` times and return (examples per second, examples seen)."""
    seen = 0
    started = time.perf_counter()
    for _ in range(passes):
        for _images, labels in dataset:
            seen += int(labels.shape[0])
    elapsed = time.perf_counter() - started
    return seen / elapsed, seen


@task(name="measure_input_pipeline", tags=["input-pipeline"])
def measure_input_pipeline(
    dataset: DatasetArtifact, batch_size: int, cfg: InputConfig | None = None
) -> InputPipelineResult:
    """Read the training shards with each reader and report examples per second.

    The naive reader parses one example at a time in one thread with no prefetch; the tuned
    reader interleaves shards in parallel, parses in vectorized blocks, decodes with AUTOTUNE
    and prefetches, here without its cache, so it pays for every decode as a first epoch (or a
    data set too large to cache) does; the cached figure is the tuned reader reading its
    in-memory cache of decoded images after a filling pass: the ceiling of the input pipeline on
    this machine, and what training gets from the second epoch on when the cache rule allows.

    Args:
        dataset: The sharded data set (its training split is read).
        batch_size: Batch size of every reader.
        cfg: Passes per reader, interleave, threads, determinism.

    Returns:
        The three rates and the batch size used.
    """
    logger = step_logger()
    cfg = cfg or InputConfig()
    files = dataset.splits["train"].files
    size, passes = dataset.image_size, cfg.measure_passes
    options, decision = reader_options(dataset, "train", cfg, training=False)
    uncached = replace(options, cache="none")
    naive, seen = examples_per_second(
        naive_dataset(files, size, batch_size, dataset.compression), passes
    )
    tuned, _ = examples_per_second(tuned_dataset(files, size, batch_size, options=uncached),
                                   passes)
    cached_dataset = tuned_dataset(files, size, batch_size,
                                   options=replace(options, cache="decoded"))
    examples_per_second(cached_dataset)
    cached, _ = examples_per_second(cached_dataset, passes)
    logger.info(
        "input pipeline (examples/s): naive %.0f, tuned %.0f (%.1fx), cached %.0f",
        naive, tuned, tuned / naive, cached,
    )
    return InputPipelineResult(
        naive_examples_per_s=naive,
        tuned_examples_per_s=tuned,
        cached_examples_per_s=cached,
        chosen_batch_size=batch_size,
        examples_measured=seen,
        cache_mode=options.cache,
        cache_reason=decision.reason,
    )
