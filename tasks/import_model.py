"""Take in a user's trained model that is not a tf_keras model: a SavedModel, .tflite or .onnx.

What each kind can go through (the README's table says the same):

- a tf_keras model (``.keras``, ``.h5``, a SavedModel folder written by tf_keras): everything;
  `tasks/train_model.py` loads it, nothing here.
- a plain SavedModel (no Keras metadata, e.g. from ``tf.saved_model.save`` or a subclassed
  model): re-exported with tfopt's serving signature, then TFLite conversions, ONNX export
  and benchmarks; no Keras graph or XLA form, and pruning, distillation and QAT are skipped.
- a ``.tflite`` file: benchmarked with LiteRT as it is.
- an ``.onnx`` file: benchmarked with ONNX Runtime as it is.

Every kind is checked against the data before any work: one image input ``[batch, S, S, 3]``
with S the data's image size, one output per class, and its ``labels.txt`` if it has one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from prefect import task

from tasks.keras_models import ModelSourceError, check_class_order
from tfopt.artifacts import DatasetArtifact, ModelArtifact, Precision
from tfopt.config import ModelConfig, ModelKind, model_kind
from tfopt.fileio import atomic_write_bytes
from tfopt.serving import OUTPUT_LOGITS, SIGNATURE_KEY, write_labels

WHAT_EACH_KIND_GETS: dict[ModelKind, str] = {
    "keras": "training or fine-tuning, every conversion and export, every technique, benchmarks",
    "savedmodel": "TFLite conversions, ONNX export, benchmarks (no Keras graph: no XLA form, "
                  "no pruning, distillation or QAT)",
    "tflite": "LiteRT benchmarks of the file as it is",
    "onnx": "ONNX Runtime benchmarks of the file as it is",
}


@task(name="import_model", tags=["training"])
def import_model(
    model_cfg: ModelConfig, dataset: DatasetArtifact, out_dir: Path
) -> ModelArtifact:
    """Check a SavedModel, ``.tflite`` or ``.onnx`` file against the data and make it the baseline.

    Args:
        model_cfg: ``model.source: file`` with a non-Keras ``model.path``.
        dataset: The data the model must fit (image size, classes and their order).
        out_dir: Folder for the baseline (``baseline-savedmodel/``, ``baseline.tflite`` or
            ``baseline.onnx``) and its ``labels.txt``.

    Returns:
        The baseline, in its own format.

    Raises:
        ModelSourceError: The file cannot be read, or does not fit the data (naming both values).
    """
    path = Path(str(model_cfg.path))
    kind = model_kind(path)
    check_class_order(path, dataset.class_names)
    importers = {"savedmodel": _import_savedmodel, "tflite": _import_tflite,
                 "onnx": _import_onnx}
    if kind not in importers:
        raise ModelSourceError(f"model.path: {path} is a {kind} model; train_model loads those")
    try:
        baseline, precision = importers[kind](path, dataset, out_dir)
    except ModelSourceError:
        raise
    except Exception as error:
        raise ModelSourceError(
            f"model.path: {path} cannot be read as a {kind} model: {type(error).__name__}: "
            f"{str(error)[:300]}"
        ) from error
    write_labels(out_dir, dataset.class_names)
    return ModelArtifact(
        name="baseline", path=baseline, format=kind, precision=precision,
        image_size=dataset.image_size, num_classes=dataset.num_classes,
        class_names=dataset.class_names, input_scale=model_cfg.input_scale,
        params={"source": str(path), "kind": kind},
    )


def check_io(path: Path, input_shape: tuple, outputs: int | None, dataset: DatasetArtifact,
             ) -> None:
    """Refuse an input that is not ``[batch, S, S, 3]`` for the data's S, or missing classes.

    Raises:
        ModelSourceError: Naming the model's value and the data's.
    """
    shape = tuple(None if d in (None, -1) or isinstance(d, str) else int(d) for d in input_shape)
    if len(shape) != 4 or shape[3] != 3:
        raise ModelSourceError(
            f"model.path: {path} takes input {list(input_shape)}, not one [batch, height, "
            "width, 3] image tensor (NHWC)"
        )
    if shape[1:3] != (dataset.image_size, dataset.image_size):
        raise ModelSourceError(
            f"model.path: {path}'s input is {shape[1]}x{shape[2]} but data.image_size is "
            f"{dataset.image_size}: set data.image_size to the model's input size"
        )
    if outputs != dataset.num_classes:
        raise ModelSourceError(
            f"model.path: {path} has {outputs} outputs but the data folder has "
            f"{dataset.num_classes} classes"
        )


def _import_savedmodel(path: Path, dataset: DatasetArtifact, out_dir: Path,
                       ) -> tuple[Path, Precision]:
    import tensorflow as tf

    from tasks.export_savedmodel import save_serving_function

    loaded = tf.saved_model.load(str(path))
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ModelSourceError(f"model.path: {path} has no serving signature to call")
    key = SIGNATURE_KEY if SIGNATURE_KEY in signatures else sorted(signatures)[0]
    serve = signatures[key]
    inputs = serve.structured_input_signature[1]
    if len(inputs) != 1:
        raise ModelSourceError(
            f"model.path: {path}'s signature {key!r} takes {sorted(inputs)}, not one image tensor")
    input_name, spec = next(iter(inputs.items()))
    outputs = serve.structured_outputs
    output_name = OUTPUT_LOGITS if OUTPUT_LOGITS in outputs else sorted(outputs)[0]
    check_io(path, tuple(spec.shape), outputs[output_name].shape[-1], dataset)
    final = out_dir / "baseline-savedmodel"
    save_serving_function(
        loaded, lambda images: serve(**{input_name: tf.cast(images, spec.dtype)})[output_name],
        dataset.image_size, final, dataset.class_names)
    return final, "fp32"


def _import_tflite(path: Path, dataset: DatasetArtifact, out_dir: Path,
                   ) -> tuple[Path, Precision]:
    from tasks.runners import TFLiteRunner

    runner = TFLiteRunner(path)
    check_io(path, tuple(runner.input_detail["shape"]), int(runner.output_detail["shape"][-1]),
             dataset)
    final = out_dir / "baseline.tflite"
    atomic_write_bytes(final, path.read_bytes())
    return final, tflite_precision(runner)


def tflite_precision(runner: object) -> Precision:
    """What a ``.tflite`` file holds: int16x8, int8, float16, dynamic or fp32.

    int16x8 means int16 activations; int8 integer activations (an integer input, or a QUANTIZE
    op after a float input); float16 and dynamic are float16 or int8 weights with float
    activations.
    """
    interpreter = runner.interpreter  # type: ignore[attr-defined]
    ops = {op["op_name"] for op in interpreter._get_ops_details()}  # no public API lists the ops
    dtypes = {np.dtype(t["dtype"]) for t in interpreter.get_tensor_details()}
    if np.dtype(np.int16) in dtypes:
        return "int16x8"
    if np.dtype(runner.input_dtype).kind in "iu" or "QUANTIZE" in ops:  # type: ignore[attr-defined]
        return "int8"
    if np.dtype(np.float16) in dtypes:
        return "float16"
    return "dynamic" if np.dtype(np.int8) in dtypes else "fp32"


def _import_onnx(path: Path, dataset: DatasetArtifact, out_dir: Path) -> tuple[Path, Precision]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (model_input, *more) = session.get_inputs()
    if more:
        raise ModelSourceError(f"model.path: {path} takes {1 + len(more)} inputs, not one image")
    outputs = session.get_outputs()
    chosen = next((o for o in outputs if OUTPUT_LOGITS in o.name), outputs[0])
    classes = chosen.shape[-1] if isinstance(chosen.shape[-1], int) else None
    check_io(path, tuple(model_input.shape), classes, dataset)
    final = out_dir / "baseline.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, final.with_suffix(".onnx.tmp"))
    final.with_suffix(".onnx.tmp").replace(final)
    return final, "fp32"

