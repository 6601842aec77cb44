"""A run's life in MLflow: its experiment, its start and end, its address, and runs left behind.

Every function takes the run explicitly: MLflow's "active run" is thread-local and Prefect runs
tasks on worker threads, so nothing here relies on `mlflow.active_run()`. Flows open their run
with `tracked_run`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict

from tfopt.processes import left_by_dead_process, process_identity
from tfopt.provenance import git_commit
from tfopt.services import redact
from tfopt.tracking.client import (
    TrackingUnavailableError,
    client,
    log_params,
    set_tags,
    with_retries,
)

# Marks the experiment as model training ("custom model development") for MLflow 3's UI; the
# view it opens in is chosen by the address (see `experiment_url`).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(mlflow: MlflowClient, name: str) -> str:
    """Return the id of experiment `name`, creating it if needed, tagged as model training."""
    existing = with_retries(lambda: mlflow.get_experiment_by_name(name))
    if existing is not None:
        experiment_id = existing.experiment_id
    else:
        try:
            experiment_id = mlflow.create_experiment(name, tags=EXPERIMENT_KIND)
        except MlflowException:
            # Another process created it between our look-up and our create.
            experiment_id = mlflow.get_experiment_by_name(name).experiment_id
    if existing is None or existing.tags.get("mlflow.experimentKind") is None:
        for key, value in EXPERIMENT_KIND.items():
            with_retries(lambda key=key, value=value: mlflow.set_experiment_tag(
                experiment_id, key, value))
    return experiment_id


def start_run(
    mlflow: MlflowClient,
    experiment_id: str,
    run_name: str,
    params: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
) -> str:
    """Create a run (a child run when `parent_run_id` is given) and log its params and tags.

    Returns:
        The new run's id.
    """
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = with_retries(
        lambda: mlflow.create_run(experiment_id, run_name=run_name, tags=all_tags)
    )
    if params:
        log_params(mlflow, run.info.run_id, params)
    return run.info.run_id


def end_run(mlflow: MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    """Mark a run FINISHED, FAILED or KILLED."""
    with_retries(lambda: mlflow.set_terminated(run_id, status=status))


# MLflow 3's UI opens an experiment in its GenAI view unless the address asks for model training.
_TRAINING_VIEW = "workflowType=machine_learning"


def experiment_url(tracking_uri: str, experiment_id: str) -> str:
    """Address of an experiment's runs table in the MLflow UI (its model-training view)."""
    return (f"{redact(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs?"
            f"{_TRAINING_VIEW}")


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Address of a run in the MLflow UI (its model-training view)."""
    return (f"{redact(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
            f"?{_TRAINING_VIEW}")


class RunRef(BaseModel):
    """Where a run lives, as a step in another process or task is handed it (no client)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tracking_uri: str
    experiment_id: str
    run_id: str


@dataclass(frozen=True)
class TrackedRun:
    """An open MLflow run and where it lives."""

    client: MlflowClient
    tracking_uri: str
    experiment_id: str
    run_id: str

    @property
    def url(self) -> str:
        """The run's address in the MLflow UI."""
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)

    @property
    def ref(self) -> RunRef:
        """The run as a step elsewhere is handed it (`RunRef`)."""
        return RunRef(tracking_uri=self.tracking_uri, experiment_id=self.experiment_id,
                      run_id=self.run_id)


@contextmanager
def tracked_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, object],
    tags: Mapping[str, str],
) -> Iterator[TrackedRun]:
    """An MLflow run for the length of a block: FINISHED when it ends, FAILED when it raises.

    The run is created with the params, the tags and the code's git commit, and MLflow's
    system metrics (``system/*``: CPU, memory, disk and network, sampled with psutil every
    `SYSTEM_METRICS_INTERVAL_S`) follow it while it lasts: the baseline's training and the
    compression are the run's own time. An error in the block marks it FAILED, tags it with the
    error's first line (``tfopt.error``), and is raised on.

    Args:
        tracking_uri: The MLflow server.
        experiment: Experiment name (created if missing).
        run_name: The run's name.
        params: Nested parameters (flattened to dotted keys).
        tags: Tags, e.g. the Prefect flow run id and the run's role.
    """
    mlflow = client(tracking_uri)
    experiment_id = ensure_experiment(mlflow, experiment)
    run_id = start_run(mlflow, experiment_id, run_name, params=params,
                       tags={**tags, "mlflow.source.git.commit": git_commit(),
                             **process_identity()})
    monitor = _system_metrics(tracking_uri, run_id)
    try:
        try:
            yield TrackedRun(mlflow, tracking_uri, experiment_id, run_id)
        finally:
            if monitor is not None:
                monitor.finish()  # its last samples logged while the run still runs
    except TrackingUnavailableError:
        raise  # the run cannot be marked now; the next `tfopt run` reconciles it
    except BaseException as error:
        # The reason the Prefect flow run shows, on the MLflow run too.
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        set_tags(mlflow, run_id, {"tfopt.error": reason[:5000]})
        end_run(mlflow, run_id, "FAILED")
        raise
    end_run(mlflow, run_id, "FINISHED")


SYSTEM_METRICS_INTERVAL_S = 10.0
"""Seconds between two samples of a run's system metrics (MLflow's default)."""


def _system_metrics(tracking_uri: str, run_id: str) -> Any:
    """MLflow's system metrics monitor, started for `run_id` (None: it could not start).

    It samples and logs on a thread of its own; MLflow's HTTP retries are off, so an outage
    ends it instead of holding the run's end.
    """
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    try:
        monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                       tracking_uri=tracking_uri)
        monitor.start()
    except Exception:  # system metrics are an extra: a run never fails for them
        return None
    return monitor


def reconcile_orphans(tracking_uri: str) -> list[dict[str, str]]:
    """Mark KILLED every RUNNING run whose tfopt process on this machine is gone.

    A run killed with its process (or cut off by an outage) stays RUNNING in MLflow forever;
    the next `tfopt run` calls this. Runs of other machines, and of live processes, are left
    alone.

    Returns:
        The runs marked, with their Prefect flow run ids (to mark those crashed too).
    """
    mlflow = client(tracking_uri)
    host = process_identity()["tfopt.host"]
    experiments = [e.experiment_id for e in with_retries(lambda: mlflow.search_experiments())]
    running = with_retries(lambda: mlflow.search_runs(
        experiments, filter_string=f"attributes.status = 'RUNNING' and tags.`tfopt.host` = "
                                   f"'{host}'", max_results=1000)) if experiments else []
    marked = []
    for run in running:
        if not left_by_dead_process(run.data.tags):
            continue
        set_tags(mlflow, run.info.run_id,
                 {"tfopt.reconciled": f"process {run.data.tags['tfopt.pid']} was gone"})
        end_run(mlflow, run.info.run_id, "KILLED")
        marked.append({"run_id": run.info.run_id, "name": run.info.run_name or "",
                       "flow_run_id": run.data.tags.get("prefect.flow_run_id", "")})
    return marked
