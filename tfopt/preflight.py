"""Everything a run needs, checked before any work: each refusal one line naming the field.

`tfopt run` calls `check_run` after the config validated and before the servers are even asked:
the data folder (classes, images per split, at least one readable image per class), the names
that become folders or MLflow names, the free space the run needs in the work folder, and the
model (opened once and checked against the data's classes and image size). What it finds is
what the run's first steps would find, minutes earlier, without a traceback.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfopt.artifacts import ArraySpec, ModelFacts
from tfopt.config import ConfigError, DataConfig, EvalConfig, check_writable
from tfopt.models.config import ModelConfig
from tfopt.runtimes import model_kind

MODEL_SPACE_FACTOR = 40
"""Work-folder bytes a run writes per byte of its model file: the variants (TFLite, ONNX,
OpenVINO at several precisions), their MLflow copies, the techniques' models and their exports
(docs/measurements.md)."""
MIN_FREE_MB = 200.0
"""Headroom every run needs besides its shards and models (reports, logs, temporary files)."""
SHARD_OVERHEAD = 1.1
"""TFRecord shards hold the JPEG bytes plus a small header per example."""


@dataclass(frozen=True)
class DataFacts:
    """What the data folder holds, as the run will shard it."""

    class_names: list[str]
    per_split: dict[str, int]
    source_bytes: int
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    """An npz source's arrays by name (`tfopt.data.arrays`)."""


def check_data(cfg: DataConfig) -> DataFacts:
    """The data folder's classes and split sizes, refused when the run could not use them.

    Raises:
        ConfigError: No folder, fewer than two classes with images, a split left empty by the
            fractions, or a class none of whose files is a readable image (naming it).
    """
    from tfopt.data.sources import NoUsableDataError, list_source

    try:
        listing = list_source(cfg)
    except NoUsableDataError as error:
        raise ConfigError(str(error)) from error
    if cfg.source_format == "image_folder":
        _check_readable(cfg.source_dir, listing)
    per_split = Counter(image.split for image in listing.images)
    counts = {split: per_split.get(split, 0) for split in ("train", "val", "test")}
    shares = {"train": 1.0, "val": listing.val_fraction, "test": cfg.test_fraction}
    if listing.select_fraction > 0:
        counts["select"] = per_split.get("select", 0)
        shares["select"] = listing.select_fraction
    empty = [split for split, count in counts.items() if count == 0 and shares[split] > 0]
    if empty:
        kind = {"image_folder": "files", "tfrecord": "records"}.get(cfg.source_format,
                                                                     "examples")
        raise ConfigError(
            f"data.source_dir: {cfg.source_dir} has {len(listing.images)} {kind}, which leave "
            f"the {' and '.join(empty)} split empty (train {counts['train']}, val "
            f"{counts['val']}, test {counts['test']}, select {counts.get('select', 0)} with "
            f"val_fraction {listing.val_fraction}, test_fraction {cfg.test_fraction} and "
            f"select_fraction {listing.select_fraction}); add images (a few per class per split at "
            "least)")
    return DataFacts(class_names=listing.class_names, per_split=counts,
                     source_bytes=sum(image.size_bytes for image in listing.images),
                     arrays=listing.arrays)


def _check_readable(source_dir: Path, listing: Any) -> None:
    """Refuse a class of which no file is a readable image (files are tried until one is)."""
    from tfopt.data.shards import validate_image

    readable: set[int] = set()
    tried: Counter[int] = Counter()
    for image in listing.images:
        if image.label in readable:
            continue
        tried[image.label] += 1
        try:
            validate_image((source_dir / image.relative_path).read_bytes())
        except (OSError, ValueError):
            continue
        readable.add(image.label)
    unreadable = [listing.class_names[label] for label in sorted(tried) if label not in readable]
    if unreadable and not readable:
        raise ConfigError(
            f"data.source_dir: {source_dir} has {len(listing.images)} files and none of them is "
            "a decodable image (JPEG, PNG, BMP, GIF, WebP ...)")
    if unreadable:
        shown = ", ".join(f"{name} ({tried[listing.class_names.index(name)]} files)"
                          for name in unreadable[:5])
        raise ConfigError(
            f"data.source_dir: {source_dir}: no file of class {shown} is a readable image "
            "(JPEG, PNG, BMP, GIF, WebP ...)")


def check_free_space(work_dir: Path, data: DataFacts, model_bytes: int) -> None:
    """Refuse a run whose work folder's disk cannot hold what the run writes.

    The estimate: the shards (the images' bytes), the variants and their copies
    (`MODEL_SPACE_FACTOR` times the model file, or 20 MB for a network tfopt builds) and
    `MIN_FREE_MB` of headroom.

    Raises:
        ConfigError: Naming the folder, the free space and the estimate.
    """
    model_mb = (model_bytes / 1e6 if model_bytes else 0.5) * MODEL_SPACE_FACTOR
    needed_mb = data.source_bytes * SHARD_OVERHEAD / 1e6 + model_mb + MIN_FREE_MB
    free_mb = shutil.disk_usage(_existing(work_dir)).free / 1e6
    if free_mb < needed_mb:
        raise ConfigError(
            f"work_dir: {work_dir} has {free_mb:,.0f} MB free; this run needs about "
            f"{needed_mb:,.0f} MB (shards {data.source_bytes * SHARD_OVERHEAD / 1e6:,.0f} MB, "
            f"models and variants {model_mb:,.0f} MB, {MIN_FREE_MB:.0f} MB headroom): free "
            "space or point work_dir at another disk")


def _existing(path: Path) -> Path:
    """The nearest folder of `path` that exists (the disk it will be created on)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _model_bytes(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_paths(config: Any) -> None:
    """Refuse a run whose data folder is missing or whose work folder cannot be written.

    Raises:
        ConfigError: Naming the field, the path and what is wrong with it.
    """
    source = config.data.source_dir
    if not source.is_dir():
        raise ConfigError(f"data.source_dir: {source} does not exist or is not a folder")
    model = getattr(config, "model", None)
    if isinstance(model, ModelConfig) and model.path is not None:
        _check_model_path(model.path, config)
    if isinstance(model, ModelConfig) and model.weights is not None and (
            not model.weights.is_file()):
        raise ConfigError(f"model.weights: {model.weights} does not exist or is not a file")
    if isinstance(model, ModelConfig) and model.builder:
        target = model.builder.rpartition(":")[0]
        if target.endswith(".py") and not Path(target).is_file():
            raise ConfigError(f"model.builder: {target} does not exist")
    check_writable(config.work_dir)


def _check_model_path(path: Path, config: Any) -> None:
    """The model file exists, and is a kind that can be trained if training is asked for."""
    if not (path.is_file() or (path / "saved_model.pb").is_file()):
        raise ConfigError(
            f"model.path: {path} does not exist or is neither a model file nor a SavedModel folder")
    kind = model_kind(path)
    epochs = getattr(getattr(config, "train", None), "epochs", 0)
    if kind != "keras" and epochs:
        raise ConfigError(
            f"train.epochs: {epochs} fine-tunes the model, but model.path {path} is a {kind} "
            "model, which tfopt cannot train (only tf_keras models): set train.epochs: 0"
        )


def check_array_metric(judged_by: EvalConfig, arrays: dict[str, ArraySpec]) -> None:
    """Refuse a metric array data cannot score a pipeline's variants by, in one line.

    A fidelity metric needs no labels: the baseline's own outputs are its truth.

    Raises:
        ConfigError: The user's function cannot be loaded; a metric that needs labels or
            targets without ``y`` in the arrays.
    """
    from tfopt.data.arrays import TRUTH
    from tfopt.eval.metrics import MetricError

    try:
        metric = judged_by.resolve(class_scores=False)
    except MetricError as error:
        raise ConfigError(str(error)) from error
    if metric.needs_labels and TRUTH not in arrays:
        raise ConfigError(f"eval.metric: {judged_by.metric} needs labels or targets: an array "
                          f"{TRUTH} beside the inputs in every .npz file (or judge the model "
                          "against its own outputs: eval.metric fidelity)")


def check_run(config: Any) -> tuple[DataFacts, ModelFacts]:
    """Check a pipeline run's data, names, space and model before any work.

    The model is opened in a child process (`tfopt.native`): one that crashes TensorFlow is a
    one-line error. The fork server that child comes from is the one the run's steps use next.

    Raises:
        ConfigError: The first problem found, in one line naming the field.
    """
    from tfopt.models.importing import inspect_array_model
    from tfopt.models.inspection import INSPECT_STEP, inspect_model
    from tfopt.native import NativeCrashError, run_native

    check_paths(config)
    data = check_data(config.data)
    if data.arrays:
        check_array_metric(config.eval, data.arrays)
    check_free_space(config.work_dir, data, _model_bytes(config.model.path))
    try:
        facts = (run_native(INSPECT_STEP, inspect_array_model, config.model, data.arrays,
                            config.eval.output)
                 if data.arrays else
                 run_native(INSPECT_STEP, inspect_model, config.model, config.data.image_size,
                            data.class_names))
    except NativeCrashError as error:
        raise ConfigError(f"model: opening or building it crashed TensorFlow ({error})") from error
    return data, facts


def check_reference(config: Any, signature: tuple[list, list] | None) -> None:
    """Refuse a reference model (``--reference``) that cannot be the truth for this model.

    A path must hold a model (opened in a probe process) taking the same named inputs, with an
    output of the name the metric scores (outputs are matched by name). A registered reference
    is checked when the flow downloads it.

    Raises:
        ConfigError: Naming the reference and what does not match.
    """
    from tfopt.models.references import UnusableModelError, check_model_reference
    from tfopt.runtimes.base import scores_output

    if config.reference is None or config.reference.startswith(("models:/", "runs:/")):
        return
    try:
        found = check_model_reference(config.reference, tracking_uri="")
    except UnusableModelError as error:
        raise ConfigError(f"reference: {str(error).removeprefix('model: ')}") from error
    if signature is None or found is None:
        return
    names = sorted(info.name for info in signature[0])
    if sorted(info.name for info in found[0]) != names:
        raise ConfigError(f"reference: {config.reference} takes "
                          f"{', '.join(sorted(i.name for i in found[0]))}; the model takes "
                          f"{', '.join(names)}")
    outputs = [info.name for info in signature[1]]
    scored = config.eval.output or scores_output(outputs)
    theirs = [info.name for info in found[1]]
    if scored not in theirs:
        raise ConfigError(f"reference: {config.reference} has no output {scored!r} (its "
                          f"outputs: {', '.join(theirs)}); outputs are matched by name")


def check_benchmark_inputs(config: Any, signature: tuple[list, list] | None) -> None:
    """Refuse inputs that cannot be made for the model, or a missing data folder, in one line.

    Args:
        config: The benchmark flow's parameters.
        signature: The model's inputs and outputs (None: a registered model, checked by the
            flow once downloaded).

    Raises:
        ConfigError: Naming the input or the folder and what to give.
    """
    from tfopt.eval.metrics import MetricError
    from tfopt.measurement.feeds import FeedsError, read_feeds, read_truth, request_shapes
    from tfopt.measurement.inputs import check_judged, takes_images

    setting = config.inputs
    classifier = signature is None or takes_images(*signature)
    referenced = config.reference is not None
    check_reference(config, signature)
    try:
        if setting == "data" or (setting == "auto" and classifier and signature is not None):
            if not config.data.source_dir.is_dir():
                raise ConfigError(
                    f"data.source_dir: {config.data.source_dir} is not a folder (a model "
                    "measured on inputs generated from its signature: --inputs random)")
            check_judged(config.eval, labelled=True, referenced=referenced)
            return
        if signature is None:
            return
        outputs = [output.name for output in signature[1]]
        if config.eval.output is not None and config.eval.output not in outputs:
            raise ConfigError(f"eval.output: the model has no output {config.eval.output!r}; "
                              f"its outputs: {', '.join(outputs)}")
        labelled = False
        if setting in ("auto", "random"):
            request_shapes(signature[0], config.shapes)
        elif setting.endswith(".npz"):
            read_feeds(Path(setting), signature[0])
            labelled = read_truth(Path(setting), signature[0]) is not None
        check_judged(config.eval, labelled, referenced)
    except MetricError as error:
        raise ConfigError(str(error)) from error
    except (FeedsError, OSError) as error:
        raise ConfigError(f"inputs: {error}") from error
