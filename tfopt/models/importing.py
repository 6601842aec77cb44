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
has one. With array data (``data.source_format: npz``) a SavedModel, ``.tflite`` or ``.onnx``
file is taken as it is, its own signature kept: its inputs matched to the arrays by name
(`match_inputs`), the output its metric scores found (`inspect_array_model`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tfopt.artifacts import (
    KERAS_FILE,
    ArraySpec,
    DatasetArtifact,
    ModelArtifact,
    ModelFacts,
    VariantSpec,
)
from tfopt.config import EvalConfig
from tfopt.models.config import ModelConfig
from tfopt.models.sources import IMAGE_CHANNELS, ModelSourceError, check_class_order
from tfopt.native import NativeStep
from tfopt.runtimes import model_kind, runtime_of
from tfopt.runtimes.base import Runner, TensorInfo, scores_output
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


def match_inputs(path: Path, inputs: Sequence[TensorInfo],
                 arrays: Mapping[str, ArraySpec]) -> dict[str, str]:
    """Which array feeds each of a model's inputs: the same name (``x`` for a model of one).

    Raises:
        ModelSourceError: An input no array feeds, an array no input takes, or an array whose
            example shape does not fit its input's (naming both).
    """
    from tfopt.data.arrays import ONE_INPUT, TRUTH

    given = {name: spec for name, spec in arrays.items() if name != TRUTH}
    names = [info.name for info in inputs]
    if len(inputs) == 1 and list(given) == [ONE_INPUT]:
        pairs = {names[0]: ONE_INPUT}
    elif sorted(given) == sorted(names):
        pairs = {name: name for name in names}
    else:
        wanted = ", ".join(f"{info.name} {list(info.shape)}" for info in inputs)
        raise ModelSourceError(f"model.path: {path} takes {wanted}; the data's arrays are "
                               f"{sorted(given)} (name each after the input it feeds; x for a "
                               "model of one input)")
    for info in inputs:
        shape = given[pairs[info.name]].shape
        fits = len(shape) == len(info.shape) - 1 and all(
            want is None or want == have for want, have in zip(info.shape[1:], shape, strict=True))
        if not fits:
            raise ModelSourceError(
                f"model.path: {path}'s input {info.name} takes {list(info.shape)} but the "
                f"data's {pairs[info.name]} holds examples of shape {shape} (the batch first)")
    return pairs


def inspect_array_model(model_cfg: ModelConfig, arrays: Mapping[str, ArraySpec],
                        output: str | None) -> ModelFacts:
    """Open a model file taken as it is with array data and check it against the arrays.

    A Keras file is judged by the SavedModel of its own signature the run will export.

    Raises:
        ModelSourceError: The file cannot be read, its inputs do not fit the arrays, or it has
            no output named `output`.
    """
    import tempfile

    path = Path(str(model_cfg.path))
    kind = model_kind(path)
    if kind != "keras":
        return _checked(path, _open(path, kind), kind, arrays, output)
    with tempfile.TemporaryDirectory(prefix="tfopt-inspect-") as folder:
        exported = _own_savedmodel(path, Path(folder) / "savedmodel")
        return _checked(path, _open(exported, "savedmodel"), "savedmodel", arrays, output)


def _checked(path: Path, runner: Runner, kind: str, arrays: Mapping[str, ArraySpec],
             output: str | None) -> ModelFacts:
    """The facts of `path` opened as `runner`, its inputs matched to the arrays.

    Raises:
        ModelSourceError: As `inspect_array_model`.
    """
    match_inputs(path, runner.inputs, arrays)
    names = [info.name for info in runner.outputs]
    scored = output or scores_output(names)
    if scored not in names:
        raise ModelSourceError(f"eval.output: {path} has no output {scored!r} (its outputs: "
                               f"{', '.join(names)})")
    return ModelFacts(kind=kind, channels=0, output=scored)


def _own_savedmodel(path: Path, final: Path) -> Path:
    """A Keras file as a plain SavedModel of its own signature at `final` (`save_own_signature`).

    Raises:
        ModelSourceError: The file cannot be loaded (naming the Keras that tried).
    """
    from tfopt.models.serving_export import save_own_signature
    from tfopt.models.sources import load_model_file

    save_own_signature(load_model_file(path), final)
    return final


def fine_tuning_loss(model_cfg: ModelConfig, loss: str | None) -> str | dict | None:
    """The loss a model of array data is fine-tuned with (None: none known).

    `loss` (``train.loss``), else the one its Keras file was compiled with.
    """
    from tfopt.models.keras_io import file_loss

    if loss is not None or model_cfg.path is None:
        return loss
    path = Path(str(model_cfg.path))
    return file_loss(path) if model_kind(path) == "keras" else None


def import_array_model(model_cfg: ModelConfig, dataset: DatasetArtifact, out_dir: Path,
                       judged_by: EvalConfig | None = None) -> ModelArtifact:
    """A SavedModel, ``.tflite``, ``.onnx`` or Keras file taken in as the baseline, as it is.

    A SavedModel keeps its own signature (no image serving signature is made for it); a Keras
    file becomes a plain SavedModel of its own signature (`save_own_signature`), and its
    figures by `judged_by` (the run's metric) on the held-out splits join its metrics
    (`tfopt.models.training.held_out_figures`): what its compressed models' fine-tunings and
    files are judged against (`tfopt.models.baseline.array_targets`).

    Raises:
        ModelSourceError: As `inspect_array_model`.
    """
    import shutil

    from tfopt.fileio import replace_dir, staging_dir_for

    path = Path(str(model_cfg.path))
    keras_file, figures = {}, {}
    if model_kind(path) == "keras":  # exported once, and checked as exported
        final, precision = _own_savedmodel(path, out_dir / "baseline-savedmodel"), "fp32"
        facts = _checked(path, _open(final, "savedmodel"), "savedmodel", dataset.arrays, None)
        keras_file = {KERAS_FILE: str(path)}
        if judged_by is not None:
            from tfopt.models.keras_io import load_keras_model
            from tfopt.models.training import held_out_figures

            figures = held_out_figures(load_keras_model(path), dataset, judged_by)
    elif (facts := inspect_array_model(model_cfg, dataset.arrays, None)).kind == "savedmodel":
        final, precision = out_dir / "baseline-savedmodel", "fp32"
        staging = staging_dir_for(final)
        shutil.copytree(path, staging)
        replace_dir(staging, final)
    else:
        final, precision = runtime_of(facts.kind).import_file(path, out_dir)
    return ModelArtifact(
        name="baseline", path=final, format=facts.kind, precision=precision,
        image_size=dataset.image_size, num_classes=0, input_scale=model_cfg.input_scale,
        params={"source": str(path), "kind": facts.kind, "taken_as_it_is": True, **keras_file},
        metrics=figures)
