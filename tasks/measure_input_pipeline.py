"""Prefect task: measure examples per second of the naive, tuned and cached readers."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import DatasetArtifact, InputPipelineResult
from tfopt.config import InputConfig
from tfopt.data.throughput import measure_readers
from tfopt.logs import step_logger


@task(name="measure_input_pipeline", tags=["input-pipeline"])
def measure_input_pipeline(
    dataset: DatasetArtifact, batch_size: int, cfg: InputConfig | None = None
) -> InputPipelineResult:
    """Read the training shards with each reader and report examples per second.

    All three read the same shards for `measure_passes` passes each (as training's epochs do):

    - naive: one example at a time in one thread, no parallelism, no prefetch, no cache;
    - tuned: the pipeline training uses, with the cache rule applied, averaged over all passes
      including the first (which fills the cache); `tuned_uncached` is the same reader with
      no cache, what every pass costs when the data does not fit the cache budget;
    - cached: the tuned reader serving decoded images from a filled cache, the ceiling of the
      input pipeline on this machine;
    - decode ceiling: the JPEG bytes already in memory decoded in parallel batches on all
      cores (no file reads, no parsing), the ceiling of any reader that decodes every pass.

    Args:
        dataset: The sharded data set (its training split is read).
        batch_size: Batch size of every reader.
        cfg: Passes per reader, interleave, threads, determinism.

    Returns:
        The three rates and the batch size used.
    """
    return measure_readers(dataset, batch_size, cfg or InputConfig(), step_logger())
