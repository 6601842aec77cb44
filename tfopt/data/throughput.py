"""How fast the readers go: naive, tuned, cached, and the decode ceiling, on the same shards."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import tensorflow as tf

from tfopt.artifacts import DatasetArtifact, InputPipelineResult
from tfopt.config import InputConfig
from tfopt.data.pipeline import (
    decode_ceiling_dataset,
    naive_dataset,
    reader_options,
    tuned_dataset,
)


def examples_per_second(dataset: tf.data.Dataset, passes: int = 1) -> tuple[float, int]:
    """Iterate `dataset` `passes` times and return (examples per second, examples seen)."""
    seen = 0
    started = time.perf_counter()
    for _ in range(passes):
        for _images, labels in dataset:
            seen += int(labels.shape[0])
    elapsed = time.perf_counter() - started
    return seen / elapsed, seen


def measure_readers(dataset: DatasetArtifact, batch_size: int, cfg: InputConfig,
                    logger: logging.Logger) -> InputPipelineResult:
    """Each reader's examples per second over `cfg.measure_passes` passes of the training shards.

    - naive: one example at a time in one thread, no parallelism, no prefetch, no cache;
    - tuned: the pipeline training uses, with the cache rule applied, averaged over all passes
      including the first (which fills the cache); `tuned_uncached` is the same reader with
      no cache, what every pass costs when the data does not fit the cache budget;
    - cached: the tuned reader serving decoded images from a filled cache, the ceiling of the
      input pipeline on this machine;
    - decode ceiling: the JPEG bytes already in memory decoded in parallel batches on all
      cores (no file reads, no parsing), the ceiling of any reader that decodes every pass.
    """
    files = dataset.splits["train"].files
    size, passes = dataset.image_size, cfg.measure_passes
    options, decision = reader_options(dataset, "train", cfg, training=False)
    examples = dataset.splits["train"].examples
    naive, seen = examples_per_second(
        naive_dataset(files, size, batch_size, dataset.compression), passes
    )
    uncached, _ = examples_per_second(
        tuned_dataset(files, size, batch_size, options=replace(options, cache="none")), passes
    )
    tuned, _ = examples_per_second(
        tuned_dataset(files, size, batch_size, options=options, examples_hint=examples), passes
    )
    ceiling, _ = examples_per_second(
        decode_ceiling_dataset(files, size, batch_size, dataset.compression), passes)
    cached_dataset = tuned_dataset(files, size, batch_size,
                                   options=replace(options, cache="decoded"),
                                   examples_hint=examples)
    examples_per_second(cached_dataset)
    cached, _ = examples_per_second(cached_dataset, passes)
    logger.info(
        "input pipeline (examples/s, %d passes): naive %.0f, tuned %.0f (%.1fx; cache %s: %s), "
        "tuned without cache %.0f (%.2fx the decode ceiling %.0f), cached %.0f", passes, naive,
        tuned, tuned / naive, options.cache, decision.reason, uncached, uncached / ceiling,
        ceiling, cached,
    )
    return InputPipelineResult(
        naive_examples_per_s=naive,
        tuned_examples_per_s=tuned,
        cached_examples_per_s=cached,
        chosen_batch_size=batch_size,
        examples_measured=seen,
        cache_mode=options.cache,
        cache_reason=decision.reason,
        tuned_uncached_examples_per_s=uncached,
        passes=passes,
        decode_ceiling_examples_per_s=ceiling,
    )
