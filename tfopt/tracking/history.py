"""Reading a config's earlier runs back: the last summary, the champion's history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from tfopt.tracking.client import download_run_artifacts, with_retries
from tfopt.tracking.runs import TrackedRun


def _finished_runs_of(run: TrackedRun, config_name: str, limit: int = 50) -> list[Any]:
    """The experiment's finished pipeline runs of `config_name` other than `run`, newest first."""
    found = with_retries(lambda: run.client.search_runs(
        [run.experiment_id],
        filter_string=(f"tags.`tfopt.config` = '{config_name}' and tags.`tfopt.role` = "
                       "'pipeline' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=limit + 1))
    return [each for each in found if each.info.run_id != run.run_id][:limit]


def previous_summary(run: TrackedRun, config_name: str, scratch: Path) -> dict[str, Any] | None:
    """The summary JSON of the last finished run of the same config, or None (first run).

    A run whose summary cannot be read (deleted artifacts) is passed over for the one before.
    """
    for earlier in _finished_runs_of(run, config_name, limit=5):
        try:
            local = download_run_artifacts(run.tracking_uri, earlier.info.run_id,
                                           "report/summary.json", scratch / earlier.info.run_id)
            return json.loads(local.read_text())
        except (MlflowException, OSError, ValueError):
            continue
    return None


def champion_history(run: TrackedRun, config_name: str) -> list[dict[str, Any]]:
    """The champion's p50 and accuracy of the config's earlier finished runs, oldest first."""
    points = []
    for earlier in reversed(_finished_runs_of(run, config_name)):
        metrics = earlier.data.metrics
        if "champion_p50_ms" in metrics:
            points.append({"run_id": earlier.info.run_id,
                           "start_time": earlier.info.start_time,
                           "champion": earlier.data.tags.get("tfopt.champion", ""),
                           "p50_ms": metrics["champion_p50_ms"],
                           "accuracy": metrics.get("champion_accuracy")})
    return points


def variant_p50_history(run: TrackedRun, config_name: str,
                        limit: int = 10) -> dict[str, list[float]]:
    """Each variant's p50 (ms) in the config's last finished runs on this machine, oldest first.

    Read from the variants' child runs (their ``latency_p50_ms``); another machine's
    measurements of a run (`tfopt benchmark --run`) are left out.
    """
    earlier = _finished_runs_of(run, config_name, limit=limit)
    if not earlier:
        return {}
    order = {each.info.run_id: index for index, each in enumerate(reversed(earlier))}
    children = with_retries(lambda: run.client.search_runs(
        [run.experiment_id],
        filter_string=(f"tags.`tfopt.config` = '{config_name}' and "
                       "attributes.status = 'FINISHED'"),
        max_results=5000))
    found: dict[str, list[tuple[int, float]]] = {}
    for child in children:
        parent = child.data.tags.get("mlflow.parentRunId")
        variant = child.data.tags.get("tfopt.variant")
        p50 = child.data.metrics.get("latency_p50_ms")
        if parent in order and variant and p50 is not None and (
                child.data.tags.get("tfopt.role") != "machine-benchmark"):
            found.setdefault(variant, []).append((order[parent], p50))
    return {variant: [p50 for _, p50 in sorted(points)] for variant, points in found.items()}


def previous_variant_file(tracking_uri: str, previous_run_id: str, variant: str,
                          scratch: Path) -> Path | None:
    """The model file a variant had in an earlier pipeline run, downloaded (None: gone).

    The file is the one that run measured: its child run's ``model`` artifact (the MLflow
    Model folder tfopt packaged, or the file itself).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        parent = with_retries(lambda: client.get_run(previous_run_id))
        children = with_retries(lambda: client.search_runs(
            [parent.info.experiment_id],
            filter_string=(f"tags.mlflow.parentRunId = '{previous_run_id}' and "
                           f"tags.`tfopt.variant` = '{variant}'"), max_results=5))
        child = next(c for c in children if c.data.tags.get("tfopt.role") != "machine-benchmark")
        folder = download_run_artifacts(tracking_uri, child.info.run_id, "model",
                                        scratch / variant)
    except (MlflowException, OSError, StopIteration):
        return None
    return _model_in(folder)


def _model_in(folder: Path) -> Path:
    """The model a downloaded ``model`` artifact holds.

    An MLflow Model folder or a SavedModel as they are, else the one file inside it (a
    ``.tflite`` or ``.onnx`` logged as it is).
    """
    if (folder / "MLmodel").is_file() or (folder / "saved_model.pb").is_file():
        return folder
    entries = [entry for entry in folder.iterdir() if not entry.name.startswith(".")]
    return entries[0] if len(entries) == 1 else folder
