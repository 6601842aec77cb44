"""Every variant as an MLflow Model folder, loadable by URI and servable over HTTP.

Each runtime writes its own flavor (`Runtime.package`); this module adds what every folder
carries: a tensor signature (``float32 [-1, H, W, C]`` in, the model's outputs out; a model of
array data's named inputs and outputs, `named_signature`), an input example, the class order
(``labels.txt`` and the ``class_names`` metadata; none for array data) and
``metadata.tfopt`` (format, precision, the model file inside the folder), which
`tfopt.models.references` reads to benchmark a registered model again. Pip requirements are
pinned from the installed packages: MLflow would otherwise infer them by loading every model in
a subprocess, about 5 s each.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.artifacts import BenchmarkInputs, VariantResult, VariantSpec
from tfopt.data.arrays import TRUTH, feeds_for
from tfopt.serving import write_labels

METADATA_KEY = "tfopt"


def mlflow_signature(example: np.ndarray, outputs: dict[str, int] | int) -> Any:
    """An MLflow tensor signature: float32 inputs shaped like `example`, float32 outputs."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(width: int, name: str | None = None) -> TensorSpec:
        return TensorSpec(np.dtype(np.float32), (-1, width), name)

    out = (Schema([spec(width, name) for name, width in outputs.items()])
           if isinstance(outputs, dict) else Schema([spec(outputs)]))
    return ModelSignature(Schema([TensorSpec(np.dtype(np.float32), (-1, *example.shape[1:]))]),
                          out)


QUANTIZED_DTYPES = ("int8", "uint8", "int16")
"""Tensor types a quantized model computes in: its MLflow model takes and answers float32 there
(its own scales applied), as every variant of the run does."""


def served_dtype(dtype: str) -> str:
    """The type a packaged model takes or answers for a tensor the runtime holds as `dtype`."""
    return "float32" if dtype in QUANTIZED_DTYPES else dtype


def named_signature(runner: Any) -> Any:
    """An MLflow tensor signature of a runner's named inputs and outputs (any batch)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def specs(infos: Sequence[Any]) -> Schema:
        return Schema([TensorSpec(np.dtype(served_dtype(info.dtype)),
                                  (-1, *(-1 if size is None else size for size in info.shape[1:])),
                                  info.name) for info in infos])

    return ModelSignature(specs(runner.inputs), specs(runner.outputs))


def named_example(example: Mapping[str, np.ndarray], runner: Any) -> dict[str, np.ndarray]:
    """`example`'s arrays by the runner's input names, in the types its signature takes.

    ``x`` feeds a model of one input, as in the data.
    """
    fed = feeds_for([info.name for info in runner.inputs], example)
    return {info.name: np.asarray(fed[info.name]).astype(served_dtype(info.dtype))
            for info in runner.inputs}


def serving_example(inputs: BenchmarkInputs) -> np.ndarray | dict[str, np.ndarray]:
    """A packaged model's input example: two test images, or two rows of each named input."""
    if inputs.images is not None:
        return np.load(inputs.images, mmap_mode="r")[:2].copy()
    with np.load(inputs.feeds) as feeds:
        return {name: feeds[name][:2] for name in feeds.files if name != TRUTH}


def pinned(*distributions: str) -> list[str]:
    """Pip requirements pinned to the installed versions (MLflow's own first)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in ("mlflow", *distributions)]


def save_variant_model(path: Path, model_format: str, precision: str, contract: Any,
                       dst: Path) -> Path:
    """Write the variant at `path` as an MLflow Model folder `dst` (which must not exist).

    Args:
        path: The variant's model file or folder.
        model_format: Its format (the runtime that packages it).
        precision: Its precision, recorded in the metadata.
        contract: Input example, class order and input scale of the run (`ServingContract`).
        dst: The folder to create.

    Returns:
        `dst`.

    Raises:
        ValueError: A format with no MLflow flavor.
    """
    from mlflow.models import Model

    from tfopt.runtimes import runtime_of

    metadata = {
        METADATA_KEY: {"format": model_format, "precision": precision,
                       "input_scale": contract.input_scale},
        "class_names": list(contract.class_names),
    }
    spec = VariantSpec(name=dst.name, source=dst.name, format=model_format,
                       precision=precision, path=path)
    inner = runtime_of(model_format).package(spec, contract, metadata, dst)
    model = Model.load(str(dst))
    model.metadata[METADATA_KEY]["file"] = inner
    model.save(str(dst / "MLmodel"))
    if contract.class_names:
        write_labels(dst, contract.class_names)
    return dst


def model_file_of(folder: Path) -> tuple[str, Path] | None:
    """The format and model file inside an MLflow Model folder tfopt wrote (None otherwise)."""
    from mlflow.models import Model

    if not (folder / "MLmodel").is_file():
        return None
    info = (Model.load(str(folder)).metadata or {}).get(METADATA_KEY) or {}
    if "format" not in info or "file" not in info:
        return None
    return str(info["format"]), folder / str(info["file"])


def package_variants(variants: Sequence[VariantResult], contract: Any, out_dir: Path,
                     logger: logging.Logger,
                     threads: Mapping[str, int] | None = None) -> dict[str, Path]:
    """Every ok variant as an MLflow Model folder ``out_dir/<name>``; a failure is logged.

    A variant that cannot be packaged is left out (its raw file is uploaded instead); a folder
    left by an earlier attempt of the same run is reused. A variant named in `threads` serves
    with that many threads (its run-off pick), the others with the contract's.
    """
    folders: dict[str, Path] = {}
    by_file: dict[tuple[str, str, int], Path] = {}
    for variant in variants:
        if variant.status != "ok" or variant.path is None:
            continue
        dst = out_dir / variant.name
        served = replace(contract, threads=(threads or {}).get(variant.name, contract.threads))
        key = (variant.format, str(variant.path), served.threads)
        try:
            if not (dst / "MLmodel").is_file():
                _save_atomically(variant, served, dst, by_file.get(key))
            by_file.setdefault(key, dst)
            folders[variant.name] = dst
        except Exception as error:  # one variant's packaging must not stop the rest
            logger.warning("%s: not packaged as an MLflow model: %s: %s", variant.name,
                           type(error).__name__, error)
    return folders


def _save_atomically(variant: VariantResult, contract: Any, dst: Path,
                     same_file: Path | None) -> None:
    """Package `variant` as `dst`; a copy of `same_file`, the folder of the same model file.

    Variants of one file in one format (the Keras graph and its bfloat16 rewrite, XLA's two
    modes) differ only in how they run: their folders are a copy with their precision (loading
    and saving a large model again took 15 s each).
    """
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if same_file is None:
        save_variant_model(Path(variant.path), variant.format, variant.precision, contract, tmp)
    else:
        from mlflow.models import Model

        shutil.copytree(same_file, tmp)
        model = Model.load(str(tmp))
        model.metadata[METADATA_KEY]["precision"] = variant.precision
        model.model_uuid = uuid.uuid4().hex
        model.save(str(tmp / "MLmodel"))
    tmp.replace(dst)
