"""Where work fans out past this process: one Dask set-up for every task runner tfopt uses.

`scale.task_runner: dask` sends the compression techniques (Prefect's `DaskTaskRunner`) and the
pending TFRecord shards (a Dask client) to the same kind of cluster: the scheduler at
`scale.dask_address`, or a local cluster of `scale.dask_workers` processes with one thread
each (two TensorFlow jobs never share one interpreter's global Keras state).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tfopt.config import ScaleConfig

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner


def local_cluster_kwargs(workers: int) -> dict[str, object]:
    """Keyword arguments of a local Dask cluster of `workers` single-threaded processes."""
    return {"n_workers": workers, "threads_per_worker": 1, "processes": True}


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
    from distributed import Client, LocalCluster

    if scale.dask_address:
        with Client(scale.dask_address) as client:
            yield client
        return
    with LocalCluster(dashboard_address=None,
                      **local_cluster_kwargs(scale.dask_workers)) as cluster, \
            Client(cluster) as client:
        yield client
