"""Who writes the pending shards: this process, a pool of local processes, or Dask workers."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tfopt.config import DataConfig, ScaleConfig
from tfopt.data.shards import ShardPlan, shard_path, write_shard
from tfopt.scaling import dask_client


_PARALLEL_WRITE_BYTES = 256 * 1024 * 1024


def writer_processes(cfg: DataConfig, pending: list[ShardPlan]) -> int:
    """How many processes write the pending shards (see `DataConfig.write_workers`)."""
    if cfg.write_workers:
        return max(1, min(cfg.write_workers, len(pending)))
    pending_bytes = sum(image.size_bytes for plan in pending for image in plan.images)
    if pending_bytes < _PARALLEL_WRITE_BYTES or len(pending) < 2:
        return 1
    return max(1, min(os.cpu_count() or 1, len(pending)))


def write_pending_shards(
    pending: list[ShardPlan], cfg: DataConfig, class_names: list[str], out_dir: Path,
    scale: ScaleConfig | None = None,
) -> tuple[list[dict], str]:
    """Write shards here, in parallel processes when that pays, or as Dask tasks.

    Local processes are spawned (no forked TensorFlow); Dask is used when `scale` asks for it.

    Returns:
        The shards' sidecars in the order of `pending`, and who wrote them.
    """
    paths = [shard_path(out_dir, plan, cfg) for plan in pending]
    if scale is not None and scale.task_runner == "dask" and pending:
        return _write_on_dask(pending, cfg, class_names, paths, scale)
    workers = writer_processes(cfg, pending)
    if workers == 1:
        return [write_shard(plan, cfg, class_names, path)
                for plan, path in zip(pending, paths, strict=True)], "1 process"
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(write_shard, plan, cfg, class_names, path)
                   for plan, path in zip(pending, paths, strict=True)]
        return [future.result() for future in futures], f"{workers} processes"


def _write_on_dask(pending: list[ShardPlan], cfg: DataConfig, class_names: list[str],
                   paths: list[Path], scale: ScaleConfig) -> tuple[list[dict], str]:
    with dask_client(scale) as client:
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        # pure=False: a shard is written for its side effect, never taken from Dask's cache.
        futures = client.map(write_shard, pending, [cfg] * len(pending),
                             [class_names] * len(pending), paths, pure=False)
        metas = client.gather(futures)
        return metas, f"{workers} Dask workers at {client.scheduler.address}"
