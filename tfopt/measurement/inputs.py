"""The benchmark's inputs: the test split decoded once, the float model's outputs on it.

Beside them, the validation split the run's choices are made on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, VariantSpec
from tfopt.config import BenchmarkConfig, EvalConfig, InputScale
from tfopt.data.pipeline import load_split
from tfopt.fileio import atomic_save_array, atomic_write_json
from tfopt.measurement.floor import build_floor_models
from tfopt.native import NativeStep
from tfopt.runtimes import load_runner
from tfopt.runtimes.base import TensorInfo, predict_batched

INPUTS_INDEX = "inputs.json"
INPUTS_ARTIFACT = "benchmark-inputs"
"""Where a pipeline's MLflow run keeps its benchmark inputs (`BenchmarkConfig.share_inputs`)."""

INPUTS_STEP = NativeStep("prepare_benchmark_inputs",
                         "the reference model's forward pass over the test split")


def prepare_inputs(reference: VariantSpec | None, dataset: DatasetArtifact, out_dir: Path,
                   batch_size: int, input_scale: InputScale) -> BenchmarkInputs:
    """Save the decoded test split and the reference model's logits on it (see the task).

    An array data set's test split is saved as named feeds (with its ``y``), and the
    reference's outputs on them by output name (`reference_outputs`).

    Raises:
        ValueError: The test split is empty.
    """
    if dataset.arrays:
        return _array_inputs(reference, dataset, out_dir, batch_size)
    images, labels = load_split(dataset, "test", scale=input_scale)
    if len(images) == 0:
        raise ValueError("the test split is empty: nothing to benchmark on")
    out_dir.mkdir(parents=True, exist_ok=True)
    reference_logits = None
    if reference is not None:
        reference_logits = out_dir / f"{reference.name}-reference-logits.npy"
        atomic_save_array(reference_logits, predict_batched(load_runner(reference), images))
    inputs = BenchmarkInputs(
        images=out_dir / "test-images.npy",
        labels=out_dir / "test-labels.npy",
        reference_logits=reference_logits,
        examples=len(images),
        batch_size=batch_size,
        floor_models=build_floor_models(images.shape[1:], out_dir / "harness-floor")
        if images.ndim == 4 and images.shape[1] == images.shape[2] else {},
    )
    atomic_save_array(inputs.images, images)
    atomic_save_array(inputs.labels, labels)
    return with_selection_split(inputs, dataset, input_scale)


def _array_inputs(reference: VariantSpec | None, dataset: DatasetArtifact, out_dir: Path,
                  batch_size: int) -> BenchmarkInputs:
    """An array data set's test and validation splits as feeds (``y`` beside them).

    The run's choices are made on the validation feeds; the reference's outputs are its
    outputs on the test feeds.
    """
    from tfopt.data.arrays import load_split_feeds
    from tfopt.measurement.feeds import count_of, save_feeds

    feeds = load_split_feeds(dataset, "test")
    if count_of(feeds) == 0:
        raise ValueError("the test split is empty: nothing to benchmark on")
    validation = load_split_feeds(dataset, "val") if dataset.examples("val") else {}
    inputs = BenchmarkInputs(
        images=None, labels=None, reference_logits=None, examples=count_of(feeds),
        batch_size=batch_size, feeds=save_feeds(out_dir / "test-feeds.npz", feeds),
        selection_feeds=save_feeds(out_dir / "val-feeds.npz", validation) if validation
        else None)
    return inputs if reference is None else reference_outputs(reference, inputs, out_dir)


def with_selection_split(inputs: BenchmarkInputs, dataset: DatasetArtifact,
                         input_scale: InputScale) -> BenchmarkInputs:
    """`inputs` with the decoded validation split saved beside them (unchanged: it is empty)."""
    images, labels = load_split(dataset, "val", scale=input_scale)
    if len(images) == 0:
        return inputs
    folder = inputs.images.parent
    selection = inputs.model_copy(update={"selection_images": folder / "val-images.npy",
                                          "selection_labels": folder / "val-labels.npy"})
    atomic_save_array(selection.selection_images, images)
    atomic_save_array(selection.selection_labels, labels)
    return selection


def takes_images(inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> bool:
    """Whether a signature is an image classifier's (what a data folder can be fed to).

    One float ``[N, S, S, C]`` input (C 1 or 3), and a first output of scores ``[N, classes]``.
    """
    if len(inputs) != 1 or not outputs:
        return False
    shape, dtype = inputs[0].shape, inputs[0].dtype
    return (len(shape) == 4 and shape[1] == shape[2] and shape[3] in (1, 3)
            and dtype.startswith("float") and len(outputs[0].shape) == 2)


def feeds_inputs(spec: VariantSpec, setting: str, shapes: Mapping[str, Sequence[int]],
                 examples: int, batch_size: int, data_dir: Path, out_dir: Path,
                 judged_by: EvalConfig | None = None, referenced: bool = False,
                 ) -> BenchmarkInputs | None:
    """The inputs a model is measured on without its data, or None to measure it on the data.

    The model's signature is read in a probe process (`probe_signature`), so this process never
    opens it. ``auto`` picks the data's test split for an image classifier when `data_dir` is
    a folder, else inputs generated from the signature; ``random`` generates them (each open
    dimension from `shapes`); a path names the user's ``.npz``. The generated inputs are
    written by the measuring process to ``<out_dir>/generated-feeds.npz``. `judged_by` scores
    the model against the ``.npz``'s ``y``, or a reference model's outputs where `referenced`
    (`check_judged`).

    Raises:
        UnusableModelError: The model cannot be opened, the inputs do not fit it (one line
            naming the input and how to give its shape), or they cannot be scored.
    """
    from tfopt.eval.metrics import MetricError
    from tfopt.measurement.feeds import (
        FeedsError,
        count_of,
        read_feeds,
        read_truth,
        request_shapes,
    )
    from tfopt.models.references import UnusableModelError, probe_signature

    judged_by = judged_by or EvalConfig()

    if setting == "data":
        return None
    model_inputs, outputs = probe_signature(spec.format, spec.path)
    if setting == "auto":
        if takes_images(model_inputs, outputs) and data_dir.is_dir():
            return None
        setting = "random"
    try:
        if setting == "random":
            request_shapes(model_inputs, shapes)
            check_judged(judged_by, labelled=False, referenced=referenced)
            return BenchmarkInputs(
                images=None, labels=None, reference_logits=None, examples=examples,
                batch_size=batch_size, feeds=out_dir / "generated-feeds.npz",
                generate={name: list(dims) for name, dims in shapes.items()},
                judged_by=judged_by)
        given = Path(setting)
        count = count_of(read_feeds(given, model_inputs))
        check_judged(judged_by, labelled=read_truth(given, model_inputs) is not None,
                     referenced=referenced)
    except MetricError as error:
        raise UnusableModelError(str(error)) from error
    except (FeedsError, OSError, ValueError) as error:
        raise UnusableModelError(f"inputs: {error}") from error
    return BenchmarkInputs(images=None, labels=None, reference_logits=None, examples=count,
                           batch_size=batch_size, feeds=given, judged_by=judged_by)


REFERENCE_STEP = NativeStep("reference_outputs",
                            "the reference model's forward pass over the inputs")


def reference_outputs(reference: VariantSpec, inputs: BenchmarkInputs,
                      out_dir: Path) -> BenchmarkInputs:
    """`inputs` with the reference model's outputs on their feeds (`reference_outputs`).

    Feeds still to be generated from the signature are generated here and written to
    `inputs.feeds` first, so the reference and the model measured see the same inputs. The
    outputs on the selection feeds, where there are some, are saved too (a fidelity metric's
    truth on the validation split: `selection_reference_outputs`).

    Raises:
        FeedsError: The feeds do not fit the reference model.
    """
    from tfopt.measurement.feeds import generated_feeds, read_feeds, save_feeds
    from tfopt.runtimes.base import outputs_batched

    runner = load_runner(reference)
    if inputs.generate is not None:
        feeds = generated_feeds(runner.inputs, inputs.generate, inputs.examples)
        save_feeds(inputs.feeds, feeds)
        inputs = inputs.model_copy(update={"generate": None})
    else:
        feeds = read_feeds(inputs.feeds, runner.inputs)
    path = save_feeds(out_dir / "reference-outputs.npz", outputs_batched(runner, feeds))
    inputs = inputs.model_copy(update={"reference_outputs": path})
    if inputs.selection_feeds is None:
        return inputs
    selection = outputs_batched(runner, read_feeds(inputs.selection_feeds, runner.inputs))
    return inputs.model_copy(update={"selection_reference_outputs": save_feeds(
        out_dir / "val-reference-outputs.npz", selection)})


def check_judged(judged_by: EvalConfig, labelled: bool, referenced: bool = False) -> None:
    """Refuse a metric a benchmarked model cannot be scored by, in one line.

    The user's function is imported now. A metric other than the default (top-1 accuracy,
    scored where there are labels, else left empty) needs labels or targets (`labelled`: the
    data's, or an ``.npz``'s ``y``); a fidelity metric needs a reference model (`referenced`).

    Raises:
        MetricError: Naming the metric and what is missing.
    """
    from tfopt.eval.metrics import MetricError
    from tfopt.measurement.feeds import TRUTH

    metric = judged_by.resolve()
    if judged_by.metric == EvalConfig.model_fields["metric"].default:
        return
    if not metric.needs_labels:
        if not referenced:
            raise MetricError(f"eval.metric: {judged_by.metric} compares a model with a "
                              "reference model: name one (--reference PATH)")
        return
    if not labelled:
        raise MetricError(f"eval.metric: {judged_by.metric} needs labels or targets: an .npz "
                          f"with {TRUTH} beside the inputs (--inputs FILE.npz)")


def write_inputs_index(inputs: BenchmarkInputs, protocol: BenchmarkConfig) -> Path:
    """Describe the inputs folder and the benchmark protocol, so another machine can repeat it.

    The pipeline logs the folder to MLflow; `read_inputs_index` on a machine that downloaded it
    gives the same arrays and the protocol the pipeline measured with. Paths are stored relative
    to the folder.

    Returns:
        The index file (in the folder of ``inputs.images``, or of ``inputs.feeds``).
    """
    folder = (inputs.images or inputs.feeds).parent

    def relative(path: Path | None) -> str | None:
        return None if path is None else str(path.relative_to(folder))

    index = {
        "images": relative(inputs.images), "labels": relative(inputs.labels),
        "feeds": relative(inputs.feeds), "reference_outputs": relative(inputs.reference_outputs),
        "selection_feeds": relative(inputs.selection_feeds),
        "selection_reference_outputs": relative(inputs.selection_reference_outputs),
        "judged_by": inputs.judged_by.model_dump(mode="json"),
        "reference_logits": (relative(inputs.reference_logits)
                             if inputs.reference_logits else None),
        "selection_images": (relative(inputs.selection_images)
                             if inputs.selection_images else None),
        "selection_labels": (relative(inputs.selection_labels)
                             if inputs.selection_labels else None),
        "examples": inputs.examples, "batch_size": inputs.batch_size,
        "floor_models": {kind: relative(path) for kind, path in inputs.floor_models.items()},
        "protocol": protocol.model_dump(mode="json"),
    }
    atomic_write_json(folder / INPUTS_INDEX, index)
    return folder / INPUTS_INDEX


def read_inputs_index(folder: Path) -> tuple[BenchmarkInputs, BenchmarkConfig]:
    """The inputs and the protocol `write_inputs_index` described, found under `folder`.

    Raises:
        FileNotFoundError: `folder` holds no index (not a pipeline's benchmark inputs).
    """
    index = json.loads((folder / INPUTS_INDEX).read_text(encoding="utf-8"))
    inputs = BenchmarkInputs(
        images=_optional(folder, index["images"]), labels=_optional(folder, index["labels"]),
        feeds=_optional(folder, index.get("feeds")),
        selection_feeds=_optional(folder, index.get("selection_feeds")),
        reference_outputs=_optional(folder, index.get("reference_outputs")),
        selection_reference_outputs=_optional(folder, index.get("selection_reference_outputs")),
        judged_by=EvalConfig.model_validate(index.get("judged_by") or {}),
        reference_logits=folder / index["reference_logits"] if index["reference_logits"]
        else None,
        selection_images=_optional(folder, index.get("selection_images")),
        selection_labels=_optional(folder, index.get("selection_labels")),
        examples=index["examples"], batch_size=index["batch_size"],
        floor_models={kind: folder / path for kind, path in index["floor_models"].items()},
    )
    return inputs, BenchmarkConfig.model_validate(index["protocol"])


def _optional(folder: Path, relative: str | None) -> Path | None:
    return None if relative is None else folder / relative
