"""Find a model to benchmark: a registered MLflow model version, or a file or folder."""

from __future__ import annotations

import re
from pathlib import Path

from prefect import task

from tasks.package_models import model_file_of
from tfopt.artifacts import VariantSpec
from tfopt.orchestration import retry_if_transient

_SUFFIX_FORMATS = {".tflite": "tflite", ".onnx": "onnx", ".keras": "graph"}
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


def detect_format(path: Path) -> tuple[str, Path]:
    """The runner format of a model file or folder, and the path to open.

    An MLflow Model folder written by tfopt (a registered variant) resolves to the model file
    its metadata names; any other folder holding a single model file resolves to that file.

    Raises:
        ValueError: Nothing recognizable at `path`.
    """
    if path.is_dir() and (packaged := model_file_of(path)) is not None:
        return packaged
    if path.is_file() and path.suffix in _SUFFIX_FORMATS:
        return _SUFFIX_FORMATS[path.suffix], path
    if path.is_dir():
        if (path / "saved_model.pb").exists():
            return "savedmodel", path
        candidates = [p for p in path.iterdir() if p.suffix in _SUFFIX_FORMATS or
                      (p / "saved_model.pb").exists()]
        if len(candidates) == 1:
            return detect_format(candidates[0])
    raise ValueError(
        f"no model found at {path}: expected a .tflite, .onnx or .keras file or a SavedModel"
    )


@task(
    name="resolve_model",
    tags=["benchmark"],
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_if_transient,
)
def resolve_model(
    model: str, fmt: str, precision: str, tracking_uri: str, download_dir: Path
) -> VariantSpec:
    """Turn a model reference into a variant to benchmark, downloading registered models.

    Args:
        model: ``models:/<name>@<alias>``, ``models:/<name>/<version>`` or a local path.
        fmt: The format, or ``auto`` to detect it.
        precision: The precision, or ``auto`` (the registered run's param, else fp32).
        tracking_uri: MLflow server holding the registry.
        download_dir: Where registered models are downloaded.

    Returns:
        The variant, named after the registered version or the file.

    Raises:
        ValueError: The reference matches no model.
    """
    params: dict[str, str] = {}
    match = _MODEL_URI.match(model)
    if match:
        import mlflow.artifacts
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        name = match["name"]
        version = (client.get_model_version_by_alias(name, match["alias"]) if match["alias"]
                   else client.get_model_version(name, match["version"]))
        target = download_dir / f"{name}-v{version.version}"
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=version.source, dst_path=str(target), tracking_uri=tracking_uri))
        if version.run_id:
            params = client.get_run(version.run_id).data.params
        label = f"{name}-v{version.version}"
    else:
        local = Path(model)
        if not local.exists():
            raise ValueError(f"model: {model} is neither a models:/ URI nor an existing path")
        label = local.stem if local.is_file() else local.name
    detected, path = detect_format(local)
    chosen_format = detected if fmt == "auto" else fmt
    chosen_precision = params.get("precision", "fp32") if precision == "auto" else precision
    return VariantSpec(name=label, source=label, format=chosen_format,
                       precision=chosen_precision, path=path, params={"model": model})
