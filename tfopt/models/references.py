"""Model references: a registered MLflow model version, a pipeline's variant, a file or folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfopt.artifacts import VariantSpec
from tfopt.config import ConfigError
from tfopt.packaging import model_file_of

if TYPE_CHECKING:
    from tfopt.runtimes.base import TensorInfo


def _suffix_formats() -> dict[str, str]:
    """Model file suffixes and the format each is measured as (a Keras file: a TensorFlow graph)."""
    from tfopt.runtimes import model_file_suffixes

    return {suffix: "graph" if kind == "keras" else kind
            for suffix, kind in model_file_suffixes().items()}


_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
_RUN_URI = re.compile(r"^runs:/(?P<run_id>[0-9a-f]{32})/(?P<path>[^\s]+)$")


def detect_format(path: Path) -> tuple[str, Path]:
    """The runner format of a model file or folder, and the path to open.

    An MLflow Model folder written by tfopt (a registered variant) resolves to the model file
    its metadata names; any other folder holding a single model file resolves to that file.

    Raises:
        ValueError: Nothing recognizable at `path`.
    """
    if path.is_dir() and (packaged := model_file_of(path)) is not None:
        return packaged
    suffixes = _suffix_formats()
    if path.is_file() and path.suffix in suffixes:
        return suffixes[path.suffix], path
    if path.is_dir():
        if (path / "saved_model.pb").exists():
            return "savedmodel", path
        candidates = [p for p in path.iterdir() if p.suffix in suffixes or
                      (p / "saved_model.pb").exists()]
        if len(candidates) == 1:
            return detect_format(candidates[0])
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    raise ValueError(f"no model found at {path}: expected a {', '.join(suffixes)} file or a "
                     "SavedModel")


class UnusableModelError(ConfigError):
    """The model to benchmark does not exist, is not registered, or cannot be run."""


def check_model_reference(model: str, tracking_uri: str,
                          ) -> tuple[list[TensorInfo], list[TensorInfo]] | None:
    """Refuse a reference that names nothing, before any flow runs; the model is not opened.

    A ``models:/`` URI must name a registered model and an existing version or alias; a path
    must hold a model file or folder tfopt recognizes, which a probe process opens.

    Returns:
        A path's model's inputs and outputs (None for a registry or run reference).

    Raises:
        UnusableModelError: Naming the reference and what is missing.
    """
    if model.startswith("runs:/"):
        _check_run_reference(model, tracking_uri)
        return None
    match = _MODEL_URI.match(model)
    if not match:
        if not model.startswith("models:/"):
            try:
                model_format, path = detect_format(Path(model))
            except ValueError as error:
                raise UnusableModelError(f"model: {error}") from error
            return probe_signature(model_format, path)
        raise UnusableModelError(
            f"model: {model} is not models:/<name>@<alias> or models:/<name>/<version>")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        if match["alias"]:
            client.get_model_version_by_alias(match["name"], match["alias"])
        else:
            client.get_model_version(match["name"], match["version"])
    except MlflowException as error:
        what = f"alias {match['alias']!r}" if match["alias"] else f"version {match['version']}"
        raise UnusableModelError(
            f"model: {model}: the registry at {tracking_uri} has no registered model "
            f"{match['name']!r} with {what} ({error.error_code})") from error
    return None


def _check_run_reference(model: str, tracking_uri: str) -> None:
    """Refuse a ``runs:/`` URI whose run or artifact does not exist.

    Raises:
        UnusableModelError: Naming what is missing.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    match = _RUN_URI.match(model)
    if not match:
        raise UnusableModelError(f"model: {model} is not runs:/<32-hex run id>/<artifact path>")
    client = MlflowClient(tracking_uri)
    try:
        client.get_run(match["run_id"])
    except MlflowException as error:
        raise UnusableModelError(f"model: {model}: the tracking server at {tracking_uri} has no "
                                 f"run {match['run_id']} ({error.error_code})") from error
    path = match["path"].rstrip("/")
    parent = path.rsplit("/", 1)[0] if "/" in path else None
    if path not in {a.path for a in client.list_artifacts(match["run_id"], parent)}:
        raise UnusableModelError(f"model: {model}: run {match['run_id']} has no artifact {path}")


_PROBE = """
import json, sys, tfopt
from pathlib import Path
from tfopt.artifacts import VariantSpec
from tfopt.runtimes import load_runner
runner = load_runner(VariantSpec(name="probe", source="probe", format=sys.argv[1],
                                 precision="fp32", path=Path(sys.argv[2])))
print(json.dumps({side: [[i.name, list(i.shape), i.dtype] for i in getattr(runner, side)]
                  for side in ("inputs", "outputs")}))
"""


def probe_signature(model_format: str, path: Path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """A model file's inputs and outputs, opened by its runner in a separate process.

    tfopt's own process never opens a user's model (a crash or a hang stays in the probe).

    Raises:
        UnusableModelError: The runner cannot open it, with the runtime's last message.
    """
    from tfopt.runtimes.base import TensorInfo

    done = subprocess.run([sys.executable, "-c", _PROBE, model_format, str(path)],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise UnusableModelError(f"model: {path} cannot be opened as {model_format}: "
                                 f"{lines[-1][:300] if lines else done.returncode}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    sides = ([TensorInfo(name, tuple(shape), dtype) for name, shape, dtype in found[side]]
             for side in ("inputs", "outputs"))
    return next(sides), next(sides)


def resolve_reference(model: str, fmt: str, precision: str, tracking_uri: str,
                      download_dir: Path) -> VariantSpec:
    """The variant a reference names, downloading registered models (see `resolve_model`).

    Raises:
        ValueError: The reference matches no model.
    """
    if model.startswith("runs:/") and not _RUN_URI.match(model):
        raise ValueError(f"model: {model} is not runs:/<32-hex run id>/<artifact path>")
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
    elif run_match := _RUN_URI.match(model):
        import mlflow.artifacts
        from mlflow.tracking import MlflowClient

        run = MlflowClient(tracking_uri).get_run(run_match["run_id"])
        label = run.data.tags.get("tfopt.variant") or run.info.run_name or run.info.run_id
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=model, dst_path=str(download_dir / label), tracking_uri=tracking_uri))
        params = run.data.params
    else:
        local = Path(model)
        if not local.exists():
            raise ValueError(f"model: {model} is neither a models:/ URI nor an existing path")
        label = local.stem if local.is_file() else local.name
    detected, path = detect_format(local)
    if detected in ("graph", "keras") and params.get("format") == "xla":
        detected = "xla"  # an XLA variant's file is its Keras model; its run says XLA
    chosen_format = detected if fmt == "auto" else fmt
    chosen_precision = params.get("precision", "fp32") if precision == "auto" else precision
    runner = {key.removeprefix("runner."): value for key, value in params.items()
              if key.startswith("runner.")}
    return VariantSpec(name=label, source=label, format=chosen_format,
                       precision=chosen_precision, path=path, params={"model": model, **runner})
