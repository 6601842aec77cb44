"""The preprocessing step: list the source, plan the shards, write what is missing, the manifest."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from tfopt.artifacts import DatasetArtifact
from tfopt.config import DataConfig, ScaleConfig
from tfopt.data.shards import (
    dataset_dir_for,
    load_complete_shard,
    plan_shards,
    shard_path,
    write_manifest,
)
from tfopt.data.sources import list_source, source_fingerprint
from tfopt.data.writers import write_pending_shards


def shard_dataset(
    cfg: DataConfig, work_dir: Path, scale: ScaleConfig | None, logger: logging.Logger
) -> DatasetArtifact:
    """Shard `cfg.source_dir` into ``<work_dir>/datasets/<source>-<hash>/``; resume a stopped run.

    Shards already on disk whose sidecar matches the plan and whose bytes match their checksum
    are kept; the others are written (here, by local processes or by Dask, see
    `tfopt.data.writers`).

    Raises:
        NoUsableDataError: The folder has no usable image, or the training split is empty.
    """
    listing = list_source(cfg)
    if (coarse := cfg.val_note(len(listing.images))) is not None:
        logger.warning(coarse)
    if listing.empty_classes:
        logger.warning("class folders with no usable file names, left out: %s",
                       listing.empty_classes)
    out_dir = dataset_dir_for(cfg, work_dir, listing.images)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".*.tmp"):
        # Left by a writer that was killed (one writer per dataset folder at a time).
        stale.unlink(missing_ok=True)
    plans = plan_shards(listing.images, int(cfg.shard_size_mb * 1024 * 1024))
    metas: dict[str, dict] = {}
    pending = []
    for plan in plans:
        meta = load_complete_shard(plan, shard_path(out_dir, plan, cfg))
        if meta is None:
            pending.append(plan)
        else:
            metas[plan.file_name] = meta
    written, writers = write_pending_shards(pending, cfg, listing.class_names, out_dir, scale)
    metas.update({plan.file_name: meta for plan, meta in zip(pending, written, strict=True)})
    logger.info("%d shards in %s (%d reused from an earlier run, %d written by %s)",
                len(plans), out_dir, len(plans) - len(pending), len(pending), writers)
    return write_manifest(cfg, out_dir, listing.class_names,
                          [metas[plan.file_name] for plan in plans], listing.skipped,
                          listing.val_fraction, listing.select_fraction, listing.arrays)


def preprocessing_cache_key(_context: object, parameters: dict) -> str | None:
    """Prefect cache key of `write_tfrecords`: the source folder's content and the settings.

    Not time: an unchanged folder with unchanged settings hits the cache however old it is.
    """
    cfg: DataConfig = parameters["cfg"]
    if not cfg.source_dir.is_dir():
        return None
    settings = json.dumps([cfg.model_dump(mode="json"), str(Path(parameters["work_dir"]).resolve()),
                           str(cfg.source_dir.resolve())])
    return "write_tfrecords-" + hashlib.sha256(
        f"{settings}|{source_fingerprint(cfg.source_dir)}".encode()
    ).hexdigest()[:32]
