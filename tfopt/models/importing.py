"""Take in a user's trained model that is not a tf_keras model: a SavedModel, .tflite or .onnx.

What each kind can go through (the README's table says the same):

- a tf_keras model (``.keras``, ``.h5``, a SavedModel folder written by tf_keras): everything;
  `tfopt.models.sources` loads it, nothing here.
- a plain SavedModel (no Keras metadata, e.g. from ``tf.saved_model.save`` or a subclassed
  model): re-exported with tfopt's serving signature, then every runtime's conversions and
  benchmarks; no Keras graph or XLA form, and the compression techniques are skipped.
- a file a runtime measures as it is (``.tflite``, ``.onnx``: `Runtime.file_suffixes`):
  benchmarked with that runtime as it is.

Every kind is checked against the data before any work: one image input ``[batch, S, S, C]``
with S the data's image size, one output per class, and its ``labels.txt`` if it has one.
"""

from __future__ import annotations

from pathlib import Path

from tfopt.artifacts import DatasetArtifact, ModelArtifact, VariantSpec
from tfopt.config import ModelConfig, model_kind
from tfopt.models.sources import ModelSourceError, check_class_order
from tfopt.runtimes import runtime_of
from tfopt.runtimes.base import Runner
from tfopt.serving import write_labels


def import_model_file(model_cfg: ModelConfig, dataset: DatasetArtifact,
                      out_dir: Path) -> ModelArtifact:
    """Check a model file against the data and take it in as the baseline, in its own format.

    Raises:
        ModelSourceError: The file cannot be read, or does not fit the data (naming both values).
    """
    path = Path(str(model_cfg.path))
    kind = model_kind(path)
    if kind == "keras":
        raise ModelSourceError(f"model.path: {path} is a keras model; train_model loads those")
    check_class_order(path, dataset.class_names)
    runtime = runtime_of(kind)
    try:
        runner = runtime.load_runner(VariantSpec(name="import", source="import", format=kind,
                                                 precision="fp32", path=path))
        check_io(path, runner, dataset)
        final, precision = runtime.import_file(path, out_dir, dataset.class_names)
    except ModelSourceError:
        raise
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
        params={"source": str(path), "kind": kind},
    )


def check_io(path: Path, runner: Runner, dataset: DatasetArtifact) -> None:
    """Refuse a model whose input is not ``[batch, S, S, 3]`` for the data's S, or misses classes.

    Raises:
        ModelSourceError: Naming the model's value and the data's.
    """
    if len(runner.inputs) != 1:
        raise ModelSourceError(
            f"model.path: {path} takes {len(runner.inputs)} inputs "
            f"({', '.join(i.name for i in runner.inputs)}), not one image tensor")
    shape = runner.inputs[0].shape
    if len(shape) != 4 or shape[3] != 3:
        raise ModelSourceError(
            f"model.path: {path} takes input {list(shape)}, not one [batch, height, width, 3] "
            "image tensor (NHWC)")
    if shape[1:3] != (dataset.image_size, dataset.image_size):
        raise ModelSourceError(
            f"model.path: {path}'s input is {shape[1]}x{shape[2]} but data.image_size is "
            f"{dataset.image_size}: set data.image_size to the model's input size")
    scores = next(o for o in runner.outputs if o.name == runner.scores_output)
    outputs = scores.shape[-1] if scores.shape else None
    if outputs != dataset.num_classes:
        raise ModelSourceError(
            f"model.path: {path} has {outputs} outputs but the data folder has "
            f"{dataset.num_classes} classes")
