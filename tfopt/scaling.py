"""Where work fans out past this process: one Dask set-up for every task runner tfopt uses.

`scale.task_runner: dask` sends the compression techniques (Prefect's `DaskTaskRunner`) and the
pending TFRecord shards (a Dask client) to the same kind of cluster: the scheduler at
`scale.dask_address`, or a local cluster of `scale.dask_workers` processes with one thread
each (two TensorFlow jobs never share one interpreter's global Keras state). A local cluster's
workers are not daemonic processes, so a native step there (`tfopt.native`) starts from a fork
server that imported TensorFlow once, not from a fresh interpreter importing it again (seconds per
step); the workers of a scheduler of your own get the same with
``DASK_DISTRIBUTED__WORKER__DAEMON=False`` in their environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tfopt.config import ScaleConfig

if TYPE_CHECKING:
    from distributed import LocalCluster
    from prefect.task_runners import TaskRunner

WORKERS_MAY_FORK = {"distributed.worker.daemon": False}
"""Dask's setting that starts worker processes as non-daemonic: they may have children."""


def local_cluster_kwargs(workers: int) -> dict[str, object]:
    """Keyword arguments of a local Dask cluster of `workers` single-threaded processes.

    Also sets `WORKERS_MAY_FORK` in this process's Dask config, which the cluster's nannies read
    when they start its workers.
    """
    import dask

    dask.config.set(WORKERS_MAY_FORK)
    return {"n_workers": workers, "threads_per_worker": 1, "processes": True}


def local_cluster(workers: int) -> LocalCluster:
    """A local Dask cluster of `workers` single-threaded, non-daemonic processes, no dashboard."""
    from distributed import LocalCluster

    return LocalCluster(dashboard_address=None, **local_cluster_kwargs(workers))


def task_runner(scale: ScaleConfig) -> TaskRunner:
    """The Prefect task runner `scale` asks for: Dask, or one task at a time in this process."""
    if scale.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if scale.dask_address:
            return DaskTaskRunner(address=scale.dask_address)
        return DaskTaskRunner(cluster_kwargs=local_cluster_kwargs(scale.dask_workers))
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=1)


@contextmanager
def dask_client(scale: ScaleConfig) -> Iterator:
    """A Dask client of the scheduler at `scale.dask_address`, or of a local cluster."""
    from distributed import Client

    if scale.dask_address:
        with Client(scale.dask_address) as client:
            yield client
        return
    with local_cluster(scale.dask_workers) as cluster, Client(cluster) as client:
        yield client
