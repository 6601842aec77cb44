"""Variants as MLflow 3 LoggedModels, and the champion in the model registry."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tfopt.tracking.client import set_tags, with_retries
from tfopt.tracking.runs import TrackedRun

VARIANT_MODEL_TYPE = "tfopt-variant"
"""The LoggedModels' ``model_type``: MLflow's Models tab filters and compares by it."""


def log_variant_model(mlflow: MlflowClient, experiment_id: str, run_id: str, result: object,
                      folder: Path, source_params: Mapping[str, object]) -> str:
    """Log a variant's MLflow Model folder as an MLflow 3 LoggedModel of its child run.

    The experiment's Models tab then lists every variant with its parameters (source, runtime,
    format, precision, derived_from, the technique's settings) and the metrics logged with its
    id (accuracy, p50 and interval, p99, throughput, sizes, load scenarios), so the variants
    compare there side by side; the champion is registered from it.

    Returns:
        The LoggedModel's id.
    """
    from tfopt.runtimes import runtime_of

    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    params = {
        "source": data["source"], "runtime": runtime_of(data["format"]).name,
        "format": data["format"], "precision": data["precision"],
        "derived_from": data.get("derived_from") or "none",
        **{f"source.{key}": value for key, value in source_params.items()},
        **{f"runner.{key}": value for key, value in (data.get("runner_params") or {}).items()},
    }
    model = with_retries(lambda: mlflow.create_logged_model(
        experiment_id, name=data["name"], source_run_id=run_id, model_type=VARIANT_MODEL_TYPE,
        params={key: str(value)[:6000] for key, value in params.items()},
        tags={"tfopt.variant": data["name"], "tfopt.runtime": params["runtime"]}))
    with_retries(lambda: mlflow.log_model_artifacts(model.model_id, str(folder)))
    with_retries(lambda: mlflow.finalize_logged_model(model.model_id, "READY"))
    set_tags(mlflow, run_id, {"tfopt.model_id": model.model_id})
    return model.model_id


REGISTERED_MODEL_DESCRIPTION = (
    "Champions of tfopt pipeline runs: each version is the variant (runtime, format, precision) "
    "that won its run's benchmark within the accuracy budget; its description says why and its "
    "tags hold its figures. The alias `champion` points at the newest.")


def register_champion(
    mlflow: MlflowClient, model_name: str, run_id: str, alias: str = "champion",
    tags: Mapping[str, str] | None = None, description: str = "",
) -> str:
    """Register a child run's model as a new model version and point `alias` at it.

    The version comes from the variant's LoggedModel where it has one (its ``tfopt.model_id``
    tag), else from the run's ``model`` artifact; it carries `tags` and `description`, and the
    registered model is described once, when it is created.

    Returns:
        The new version number.
    """
    try:
        with_retries(lambda: mlflow.create_registered_model(
            model_name, description=REGISTERED_MODEL_DESCRIPTION))
    except MlflowException as error:
        if "already exists" not in str(error).lower() and "RESOURCE_ALREADY_EXISTS" not in str(
            error
        ):
            raise
    run = with_retries(lambda: mlflow.get_run(run_id))
    model_id = run.data.tags.get("tfopt.model_id")
    source = f"models:/{model_id}" if model_id else f"{run.info.artifact_uri}/model"
    version = with_retries(lambda: mlflow.create_model_version(
        model_name, source=source, run_id=run_id, model_id=model_id,
        tags={key: str(value) for key, value in (tags or {}).items()},
        description=description or None))
    with_retries(lambda: mlflow.set_registered_model_alias(model_name, alias, version.version))
    set_tags(mlflow, run_id, {"tfopt.champion": "true"})
    return str(version.version)


def log_champion(
    run: TrackedRun, champion: str, child_run_id: str, model_name: str | None,
    version_tags: Mapping[str, str] | None = None, description: str = "",
) -> dict[str, Any] | None:
    """Tag the run with its champion; register the champion's model as `model_name` if given.

    Args:
        run: The pipeline's run.
        champion: The champion variant's name.
        child_run_id: Its child run.
        model_name: The registered model (None: do not register).
        version_tags: The new version's tags (variant, runtime, figures, provenance).
        description: The new version's description (why it won).

    Returns:
        The registered model's name, version, alias and URI (None when not registered).
    """
    set_tags(run.client, run.run_id, {"tfopt.champion": champion})
    if model_name is None:
        return None
    version = register_champion(run.client, model_name, child_run_id, tags=version_tags,
                                description=description)
    return {"name": model_name, "version": version, "alias": "champion",
            "uri": f"models:/{model_name}@champion"}


def note_regressions(run: TrackedRun, champion_model: dict[str, Any] | None,
                     since: dict[str, Any]) -> None:
    """Say the run's regressions since the last one on its registered champion version.

    The version's description gains one line per regression (what moved, and the side-by-side
    figures that confirmed a slowdown), so the registry says what the report and the run's
    ``tfopt.regression`` tag say.
    """
    if not champion_model or not since.get("regressions"):
        return
    from tfopt.report.compare import regression_lines

    name, version = champion_model["name"], champion_model["version"]
    current = with_retries(lambda: run.client.get_model_version(name, version))
    text = "\n".join(["", "", "**Since the last run of this config**:",
                       *regression_lines(since)])
    with_retries(lambda: run.client.update_model_version(
        name, version, description=(current.description or "") + text))
