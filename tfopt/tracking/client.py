"""The MLflow client, its one retry loop, and the batched calls every writer makes.

MLflow's own HTTP retries are off (the tfopt package sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``):
`with_retries` is the only retry loop, bounded by `retry_seconds`. Metrics and params go out in
batches (`log_batch`), never one call per value.
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tfopt.provenance import mlflow_tracking_uri
from tfopt.services import ServiceError, redact

_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_PARAM_VALUE_LIMIT = 6000
T = TypeVar("T")


def client(tracking_uri: str) -> MlflowClient:
    """Return a client for the tracking server at `tracking_uri`."""
    return MlflowClient(tracking_uri=tracking_uri)


class TrackingUnavailableError(ServiceError):
    """The MLflow server did not answer within the retry bound."""


def with_retries(call: Callable[[], T], within_s: float | None = None,
                 first_delay_s: float = 1.0) -> T:
    """Run `call`, retrying with backoff while the tracking server cannot be reached.

    This is the only retry loop around MLflow: MLflow's own HTTP retries are switched off
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``, set by the tfopt package), so an outage costs at
    most `within_s`, not retries times retries.

    Args:
        call: The MLflow operation.
        within_s: How long to keep trying (default: `retry_seconds`).
        first_delay_s: Wait before the second try; doubled after each failure, at most 15 s.

    Returns:
        What `call` returns.

    Raises:
        TrackingUnavailableError: The server did not answer in time, naming its address.
    """
    bound = retry_seconds() if within_s is None else within_s
    deadline, delay = time.monotonic() + bound, first_delay_s
    while True:
        try:
            return call()
        except (MlflowException, OSError) as error:
            if not _is_transient(error):
                raise
            if time.monotonic() + delay > deadline:
                raise TrackingUnavailableError(
                    f"MLflow at {redact(mlflow_tracking_uri())} did not answer for {bound:.0f} s "
                    f"({type(error).__name__}); start it with `tfopt up` and run again: "
                    "finished steps (shards, the trained baseline) are reused"
                ) from error
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


_retry_seconds: float | None = None


def use_retry_seconds(seconds: float | None) -> None:
    """Set this process's retry bound (a run's ``services.retry_seconds``; None: the default)."""
    global _retry_seconds
    _retry_seconds = seconds


def retry_seconds() -> float:
    """Seconds tfopt keeps retrying a service that does not answer.

    ``services.retry_seconds`` of the running flow, else ``TFOPT_SERVICE_RETRY_SECONDS``, else 60.
    """
    if _retry_seconds is not None:
        return _retry_seconds
    return float(os.environ.get("TFOPT_SERVICE_RETRY_SECONDS", "60"))


def _is_transient(error: Exception) -> bool:
    if isinstance(error, OSError):
        return True
    text = str(error).lower()
    return any(word in text for word in ("connection", "timed out", "max retries", "503", "502"))


_NOT_IN_A_NAME = re.compile(r"[^/\w.\- :]")
"""What MLflow refuses in a param, metric or tag name (its `validate_param_and_metric_name`)."""


def mlflow_name(name: str) -> str:
    """`name` as MLflow takes it: characters it refuses dropped, no path that resolves elsewhere.

    Names carry what tfopt did not choose (a step's ``search_trial (channel_prune 0.75)``, a
    user's layer names): one refused character in a batch fails the whole run at its end
    (seen: a contained crash of a search trial, logged as ``native.<step>``).
    """
    kept = _NOT_IN_A_NAME.sub("", name)
    normal = posixpath.normpath(kept) if kept else kept
    if kept and normal == kept and not normal.startswith(("/", "..")) and normal != ".":
        return kept
    return kept.replace("/", "_").replace("..", "_") or "_"


def flatten_params(tree: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """Flatten nested parameters to dotted keys with string values (MLflow's param shape)."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = str(value)[:_PARAM_VALUE_LIMIT]
    return flat


def log_params(mlflow: MlflowClient, run_id: str, params: Mapping[str, object]) -> None:
    """Log (nested) parameters in batches, each name as MLflow takes it (`mlflow_name`)."""
    items = [Param(mlflow_name(key), value) for key, value in flatten_params(params).items()]
    for start in range(0, len(items), _BATCH_PARAMS):
        chunk = items[start : start + _BATCH_PARAMS]
        with_retries(lambda chunk=chunk: mlflow.log_batch(run_id, params=chunk))


def set_tags(mlflow: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    """Set tags on a run in one batch, each name as MLflow takes it (`mlflow_name`)."""
    batch = [RunTag(mlflow_name(key), str(value)) for key, value in tags.items()]
    with_retries(lambda: mlflow.log_batch(run_id, tags=batch))


def log_metrics(
    mlflow: MlflowClient, run_id: str, metrics: Mapping[str, float], step: int = 0,
    model_id: str | None = None,
) -> None:
    """Log a set of scalar metrics at one step, in batches (linked to a LoggedModel if given)."""
    now = int(time.time() * 1000)
    log_metric_points(
        mlflow, run_id,
        (Metric(mlflow_name(k), float(v), now, step, model_id=model_id)
         for k, v in metrics.items()))


def log_metric_history(
    mlflow: MlflowClient, run_id: str, history: Mapping[str, Iterable[float]]
) -> None:
    """Log per-step series (e.g. training curves: one value per epoch) in batches."""
    now = int(time.time() * 1000)
    points = (
        Metric(mlflow_name(name), float(value), now, step)
        for name, values in history.items()
        for step, value in enumerate(values)
    )
    log_metric_points(mlflow, run_id, points)


def log_metric_points(mlflow: MlflowClient, run_id: str, points: Iterable[Metric]) -> None:
    """Send metric points in batches of at most 1,000 (MLflow's limit per call)."""
    batch: list[Metric] = []
    for point in points:
        batch.append(point)
        if len(batch) == _BATCH_METRICS:
            _send_metrics(mlflow, run_id, batch)
            batch = []
    if batch:
        _send_metrics(mlflow, run_id, batch)


def _send_metrics(mlflow: MlflowClient, run_id: str, batch: list[Metric]) -> None:
    with_retries(lambda: mlflow.log_batch(run_id, metrics=batch))


def log_artifact(
    mlflow: MlflowClient, run_id: str, path: Path, artifact_path: str | None = None
) -> None:
    """Upload a file or a whole folder to the run's artifacts."""
    if path.is_dir():
        with_retries(lambda: mlflow.log_artifacts(run_id, str(path), artifact_path))
    else:
        with_retries(lambda: mlflow.log_artifact(run_id, str(path), artifact_path))


def download_run_artifacts(tracking_uri: str, run_id: str, artifact_path: str,
                           dst: Path) -> Path:
    """Download a run's artifact (file or folder) under `dst`, retried; return its local path."""
    import mlflow.artifacts

    return Path(with_retries(lambda: mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=artifact_path, dst_path=str(dst),
        tracking_uri=tracking_uri)))
