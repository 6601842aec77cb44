"""Package every variant as an MLflow Model, loadable by URI and servable over HTTP.

Keras variants use MLflow's TensorFlow flavor (Keras model type), SavedModels its TF2-module
type, ONNX files the ONNX flavor, and ``.tflite`` files the pyfunc model of
`tasks/tflite_pyfunc.py`. Each model folder carries a tensor signature (``float32 [-1, H, W,
C]`` in, the model's outputs out), an input example, the class order (``labels.txt`` and the
``class_names`` metadata) and ``metadata.tfopt`` (format, precision, the model file inside the
folder), which `tasks/resolve_model.py` reads to benchmark a registered model again.

Pip requirements are pinned from the installed packages: MLflow would otherwise infer them by
loading every model in a subprocess, about 5 s each.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantResult
from tfopt.logs import step_logger
from tfopt.serving import INPUT_NAME, OUTPUT_LOGITS, SIGNATURE_KEY, write_labels

METADATA_KEY = "tfopt"
_TFLITE_PYFUNC = Path(__file__).with_name("tflite_pyfunc.py")
_MODEL_FILES = {
    "keras": "data/model.keras",
    "savedmodel": "tf2model",
    "onnx": "model.onnx",
}


@dataclass(frozen=True)
class ServingContract:
    """What every variant of one run takes and answers: images in, class scores out.

    Attributes:
        class_names: The output order.
        input_scale: How pixel values are scaled before they reach the model.
        example: A few input images, float32 ``[N, H, W, C]``, already scaled.
    """

    class_names: Sequence[str]
    input_scale: str
    example: np.ndarray


@task(name="package_models", tags=["export"])
def package_models(
    variants: Sequence[VariantResult], inputs: BenchmarkInputs, class_names: Sequence[str],
    input_scale: str, out_dir: Path,
) -> dict[str, Path]:
    """Write every ok variant as an MLflow Model folder under `out_dir`, named after it.

    A variant that cannot be packaged is logged and left out (its raw file is uploaded
    instead); a folder left by an earlier attempt of the same run is reused.

    Args:
        variants: The benchmarked variants.
        inputs: The benchmark inputs; their first two images are the input example.
        class_names: The data's classes, in output order.
        input_scale: The run's ``model.input_scale``.
        out_dir: Parent folder of the model folders.

    Returns:
        Variant name to its MLflow Model folder.
    """
    contract = ServingContract(class_names, input_scale,
                               np.load(inputs.images, mmap_mode="r")[:2].copy())
    folders = {}
    for variant in variants:
        if variant.status != "ok" or variant.path is None:
            continue
        dst = out_dir / variant.name
        try:
            if not (dst / "MLmodel").is_file():
                _save_atomically(variant, contract, dst)
            folders[variant.name] = dst
        except Exception as error:  # one variant's packaging must not stop the rest
            step_logger().warning("%s: not packaged as an MLflow model: %s: %s",
                                     variant.name, type(error).__name__, error)
    return folders


def _save_atomically(variant: VariantResult, contract: ServingContract, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    save_variant_model(Path(variant.path), variant.format, variant.precision, contract, tmp)
    tmp.replace(dst)


def save_variant_model(
    path: Path, model_format: str, precision: str, contract: ServingContract, dst: Path
) -> Path:
    """Write the variant at `path` as an MLflow Model folder `dst` (which must not exist).

    Args:
        path: The variant's model file or folder.
        model_format: Its runner format (graph, xla, keras, savedmodel, tflite, onnx).
        precision: Its precision, recorded in the metadata.
        contract: Input example, class order and input scale of the run.
        dst: The folder to create.

    Returns:
        `dst`.

    Raises:
        ValueError: A format with no MLflow flavor.
    """
    metadata = {
        METADATA_KEY: {"format": model_format, "precision": precision,
                       "input_scale": contract.input_scale},
        "class_names": list(contract.class_names),
    }
    example = contract.example.astype(np.float32)
    if model_format in ("graph", "xla", "keras"):
        inner = _save_keras(path, example, metadata, dst)
    elif model_format == "savedmodel":
        inner = _save_savedmodel(path, example, metadata, dst)
    elif model_format == "onnx":
        inner = _save_onnx(path, example, metadata, dst)
    elif model_format == "tflite":
        inner = _save_tflite(path, example, metadata, dst)
    else:
        raise ValueError(f"no MLflow flavor for format {model_format!r}")
    _record_model_file(dst, inner)
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


def _record_model_file(dst: Path, inner: str) -> None:
    from mlflow.models import Model

    model = Model.load(str(dst))
    model.metadata[METADATA_KEY]["file"] = inner
    model.save(str(dst / "MLmodel"))


def _signature(example: np.ndarray, outputs: dict[str, int] | int) -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(width: int, name: str | None = None) -> TensorSpec:
        return TensorSpec(np.dtype(np.float32), (-1, width), name)

    out = (Schema([spec(width, name) for name, width in outputs.items()])
           if isinstance(outputs, dict) else Schema([spec(outputs)]))
    return ModelSignature(Schema([TensorSpec(np.dtype(np.float32), (-1, *example.shape[1:]))]),
                          out)


def _pinned(*distributions: str) -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in ("mlflow", *distributions)]


def _save_keras(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.tensorflow

    from tasks.keras_models import load_keras_model

    model = load_keras_model(path)
    mlflow.tensorflow.save_model(
        model, str(dst), signature=_signature(example, int(model.output_shape[-1])),
        input_example=example, metadata=metadata,
        pip_requirements=_pinned("tensorflow-cpu", "tf-keras"),
    )
    # MLflow records "tensorflow.keras", which is Keras 3 unless TF_USE_LEGACY_KERAS is set in
    # the loading process; naming tf_keras makes the model load anywhere it is installed.
    (dst / "data" / "keras_module.txt").write_text("tf_keras")
    return _MODEL_FILES["keras"]


def _save_savedmodel(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.tensorflow
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    serve = loaded.signatures[SIGNATURE_KEY]
    spec = serve.structured_input_signature[1][INPUT_NAME]
    images = tf.TensorSpec(spec.shape, spec.dtype, name=INPUT_NAME)
    module = tf.Module()
    module.loaded = loaded
    # MLflow's TF2-module pyfunc calls the module itself; the serving signature stays as it was
    # so the folder benchmarks like any tfopt SavedModel.
    module.__call__ = tf.function(lambda images: serve(images=images)[OUTPUT_LOGITS],
                                  input_signature=[images])
    module.serve = tf.function(lambda images: serve(images=images), input_signature=[images])
    mlflow.tensorflow.save_model(
        module, str(dst), signature=_signature(example, int(serve.structured_outputs[
            OUTPUT_LOGITS].shape[-1])),
        input_example=example, metadata=metadata,
        saved_model_kwargs={"signatures": {SIGNATURE_KEY: module.serve}},
        pip_requirements=_pinned("tensorflow-cpu"),
    )
    return _MODEL_FILES["savedmodel"]


def _save_onnx(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.onnx
    import onnx

    model = onnx.load(str(path))
    outputs = {output.name: output.type.tensor_type.shape.dim[-1].dim_value
               for output in model.graph.output}
    mlflow.onnx.save_model(
        model, str(dst), signature=_signature(example, outputs), input_example=example,
        metadata=metadata, pip_requirements=_pinned("onnx", "onnxruntime"),
    )
    return _MODEL_FILES["onnx"]


def _save_tflite(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.pyfunc

    from tasks.runners import TFLiteRunner

    runner = TFLiteRunner(path)
    classes = int(runner.output_detail["shape"][-1])
    mlflow.pyfunc.save_model(
        str(dst), python_model=str(_TFLITE_PYFUNC), artifacts={"tflite": str(path)},
        model_config={"signature": runner.signature_key, "input": runner.input_name,
                      "output": runner.output_name},
        signature=_signature(example, classes), input_example=example, metadata=metadata,
        pip_requirements=_pinned("ai-edge-litert", "numpy"),
    )
    return f"artifacts/{path.name}"

