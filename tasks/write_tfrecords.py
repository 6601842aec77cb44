"""Prefect task: a folder of labelled images (or TFRecords) -> TFRecord shards and a manifest.

The work is `tfopt.data.sharding.shard_dataset`; this task adds Prefect's result cache, keyed
on the source folder's content and the settings, and retries on transient errors.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import DatasetArtifact
from tfopt.config import DataConfig, ScaleConfig
from tfopt.data.sharding import preprocessing_cache_key, shard_dataset
from tfopt.logs import step_logger
from tfopt.orchestration import retry_if_transient


@task(
    name="write_tfrecords",
    tags=["preprocessing"],
    cache_key_fn=preprocessing_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_if_transient,
)
def write_tfrecords(
    cfg: DataConfig, work_dir: Path, scale: ScaleConfig | None = None
) -> DatasetArtifact:
    """Shard an image folder into TFRecord files with a manifest; resume where a run stopped.

    Prefect caches the result under the source folder's fingerprint and the settings, so an
    unchanged input is not read again; shards already on disk are reused in any case. Where
    the shards are written does not change them, so `scale` is not part of the cache key.

    Args:
        cfg: Source folder, split fractions and shard size.
        work_dir: Root folder; shards go to ``<work_dir>/datasets/<source>-<hash>/``.
        scale: Dask (`task_runner: dask`) or here (None or sequential).

    Returns:
        The shard files per split, the class names and the counts.

    Raises:
        NoUsableDataError: The folder has no usable image, or the training split is empty.
    """
    return shard_dataset(cfg, work_dir, scale, step_logger())
