"""Take in a user's trained model that is not a tf_keras model: a SavedModel, .tflite or .onnx.

What each kind can go through (docs/own-models.md's table says the same):

- a tf_keras model (``.keras``, ``.h5``, a SavedModel folder written by tf_keras): everything;
  `tfopt.models.sources` loads it, nothing here.
- a plain SavedModel (no Keras metadata, e.g. from ``tf.saved_model.save`` or a subclassed
  model): re-exported with tfopt's serving signature, then every runtime's conversions and
  benchmarks; no Keras graph or XLA form, and the compression techniques are skipped.
- a file a runtime measures as it is (``.tflite``, ``.onnx``: `Runtime.file_suffixes`):
  benchmarked with that runtime as it is.

Every kind is checked against the data before any work: one image input ``[batch, S, S, C]``
with S the data's image size and C 1 or 3, one output per class, and its ``labels.txt`` if it
has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfopt.artifacts import DatasetArtifact, ModelArtifact, ModelFacts, VariantSpec
from tfopt.models.config import ModelConfig
from tfopt.models.sources import IMAGE_CHANNELS, ModelSourceError, check_class_order
from tfopt.native import NativeStep
from tfopt.runtimes import model_kind, runtime_of
from tfopt.runtimes.base import Runner
from tfopt.serving import write_labels

IMPORT_STEP = NativeStep("import_model", "opening the model file with its runtime")


def inspect_model_file(path: Path, image_size: int, class_names: Sequence[str]) -> ModelFacts:
    """Open a model file a runtime measures as it is and check it against the data.

    Raises:
        ModelSourceError: The file cannot be opened, or does not fit the data.
    """
    kind = model_kind(path)
    check_class_order(path, class_names)
    runner = _open(path, kind)
    check_io(path, runner, image_size, len(class_names))
    return ModelFacts(kind=kind, channels=int(runner.inputs[0].shape[-1]), output="")


def _open(path: Path, kind: str) -> Runner:
    """The file opened by its runtime.

    Raises:
        ModelSourceError: The runtime cannot open it.
    """
    try:
        return runtime_of(kind).load_runner(VariantSpec(
            name="import", source="import", format=kind, precision="fp32", path=path))
    except Exception as error:
        raise ModelSourceError(
            f"model.path: {path} cannot be read as a {kind} model: {type(error).__name__}: "
            f"{str(error)[:300]}"
        ) from error


def import_model_file(model_cfg: ModelConfig, dataset: DatasetArtifact,
                      out_dir: Path) -> ModelArtifact:
    """Check a model file against the data and take it in as the baseline, in its own format.

    Its output is judged on the test split: rows of non-negative scores summing to one are a
    softmax's probabilities (``output: softmax``); a SavedModel's re-exported logits are then
    their logarithm, so its served probabilities are the model's own.

    Raises:
        ModelSourceError: The file cannot be read, or does not fit the data (naming both values).
    """
    path = Path(str(model_cfg.path))
    kind = model_kind(path)
    if kind == "keras":
        raise ModelSourceError(f"model.path: {path} is a keras model; train_model loads those")
    facts = inspect_model_file(path, dataset.image_size, dataset.class_names)
    runner = _open(path, kind)
    output = output_kind(runner, dataset, model_cfg.input_scale)
    try:
        final, precision = runtime_of(kind).import_file(path, out_dir, dataset.class_names,
                                                        output)
    except Exception as error:
        raise ModelSourceError(
            f"model.path: {path} cannot be read as a {kind} model: {type(error).__name__}: "
            f"{str(error)[:300]}"
        ) from error
    write_labels(out_dir, dataset.class_names)
    return ModelArtifact(
        name="baseline", path=final, format=kind, precision=precision,
        image_size=dataset.image_size, num_classes=dataset.num_classes,
        class_names=dataset.class_names, input_scale=model_cfg.input_scale,
        channels=facts.channels, params={"source": str(path), "kind": kind, "output": output},
    )


def output_kind(runner: Runner, dataset: DatasetArtifact, scale: str) -> str:
    """``softmax`` when the model's scores on test images are probabilities, else ``logits``."""
    import numpy as np

    from tfopt.data.pipeline import load_split
    from tfopt.runtimes.base import predict_batched

    images, _ = load_split(dataset, "test", 64, scale=scale)
    if not len(images):
        return "logits"
    scores = predict_batched(runner, images).astype(np.float64)
    sums_to_one = np.allclose(scores.sum(axis=-1), 1.0, atol=1e-3)
    return "softmax" if sums_to_one and float(scores.min()) >= 0.0 else "logits"


def check_io(path: Path, runner: Runner, image_size: int, num_classes: int) -> None:
    """Refuse a model whose input is not ``[batch, S, S, C]`` (C 1 or 3) or misses classes.

    Raises:
        ModelSourceError: Naming the model's value, the data's and what was expected.
    """
    if len(runner.inputs) != 1:
        raise ModelSourceError(
            f"model.path: {path} takes {len(runner.inputs)} inputs "
            f"({', '.join(i.name for i in runner.inputs)}); expected one image tensor "
            "(tfopt benchmark --model measures models of any inputs)")
    shape = runner.inputs[0].shape
    if len(shape) != 4 or shape[3] not in IMAGE_CHANNELS:
        raise ModelSourceError(
            f"model.path: {path} takes input {list(shape)}; expected one image tensor [batch, "
            "height, width, channels] with 1 (grayscale) or 3 (RGB) channels, channels last "
            "(NHWC)")
    if shape[1:3] != (image_size, image_size):
        raise ModelSourceError(
            f"model.path: {path}'s input is {shape[1]}x{shape[2]} but data.image_size is "
            f"{image_size}: set data.image_size to the model's input size")
    scores = next(o for o in runner.outputs if o.name == runner.scores_output)
    outputs = scores.shape[-1] if scores.shape else None
    if outputs != num_classes:
        raise ModelSourceError(
            f"model.path: {path} has {outputs} outputs but the data folder has "
            f"{num_classes} classes")
