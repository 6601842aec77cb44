"""Where the baseline comes from: a zoo network, the user's builder, or the user's file.

Each source is checked against the data (input size, classes and their order) before any
training, with errors naming both values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import tf_keras as keras

from tfopt.config import ConfigError, ModelConfig
from tfopt.models.keras_io import (
    import_code,
    is_keras_model,
    keras_flavor_of_file,
    keras_version_of,
    load_keras_model,
)
from tfopt.models.zoo import build_model
from tfopt.serving import LABELS_FILE, read_labels


def build_configured(model_cfg: ModelConfig, image_size: int, num_classes: int) -> keras.Model:
    """The configured zoo network for this image size and number of classes."""
    return build_model(
        model_cfg.architecture, image_size, num_classes, width=model_cfg.width,
        alpha=model_cfg.alpha, data_format=model_cfg.data_format, weights=model_cfg.weights,
    )


class ModelSourceError(ConfigError):
    """The configured model cannot be the baseline: missing, unreadable, or not fitting the data."""


def load_builder(spec: str) -> Callable[[int, int], keras.Model]:
    """The function ``"my_model.py:build"`` (a file) or ``"my_package.models:build"`` names.

    Raises:
        ModelSourceError: No such file, module or function, or the module fails to import.
    """
    target, _, name = spec.rpartition(":")
    if target.endswith(".py") and not Path(target).is_file():
        raise ModelSourceError(f"model.builder: {target} does not exist")
    try:
        module = import_code(spec)
    except Exception as error:
        raise ModelSourceError(
            f"model.builder: importing {target} failed: {type(error).__name__}: {error}"
        ) from error
    builder = getattr(module, name, None)
    if not callable(builder):
        raise ModelSourceError(f"model.builder: {target} has no function {name!r}")
    return builder


def build_with(spec: str, image_size: int, num_classes: int) -> keras.Model:
    """Call the user's builder and check that it returned a tf_keras model.

    Raises:
        ModelSourceError: The builder raised, or returned something else than a tf_keras model.
    """
    builder = load_builder(spec)
    try:
        model = builder(image_size, num_classes)
    except Exception as error:
        raise ModelSourceError(
            f"model.builder: {spec} raised {type(error).__name__}: {error}"
        ) from error
    if not is_keras_model(model):
        raise ModelSourceError(
            f"model.builder: {spec} returned a {type(model).__module__}.{type(model).__name__}, "
            "not a Keras model (keras.Model of Keras 3, or tf_keras.Model)"
        )
    return model


def load_model_file(path: Path) -> keras.Model:
    """Load the user's trained model file with the Keras that saved it, or say why not.

    Raises:
        ModelSourceError: Missing or not loadable, naming the Keras that tried.
    """
    if not (path.is_file() or (path / "keras_metadata.pb").is_file()):
        raise ModelSourceError(f"model.path: {path} does not exist")
    saved_by = keras_version_of(path)
    flavor = keras_flavor_of_file(path)
    try:
        return load_keras_model(path)
    except Exception as error:
        keras_name = "Keras 3" if flavor == "keras3" else "tf_keras (Keras 2)"
        said = f" (saved by Keras {saved_by})" if saved_by else ""
        raise ModelSourceError(
            f"model.path: {path}{said} cannot be loaded by {keras_name}: "
            f"{type(error).__name__}: {_first_line(error)}"
        ) from error


def _first_line(error: BaseException) -> str:
    """An exception's message, first line, at most 300 characters."""
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


def source_stamp(model_cfg: ModelConfig) -> list[str | int]:
    """What identifies the user's model file or builder file on disk (path, size, mtime).

    Part of the training folder's key, so an edited file is trained again, not reused.
    """
    target = model_cfg.path if model_cfg.source == "file" else None
    if model_cfg.source == "builder" and str(model_cfg.builder).rpartition(":")[0].endswith(".py"):
        target = Path(str(model_cfg.builder).rpartition(":")[0])
    if target is None or not target.exists():
        return []
    files = sorted(p for p in target.rglob("*") if p.is_file()) if target.is_dir() else [target]
    return [str(target.resolve()), *(value for f in files
                                     for value in (f.stat().st_size, f.stat().st_mtime_ns))]


def baseline_factory(
    model_cfg: ModelConfig, image_size: int, num_classes: int,
    class_names: Sequence[str] = (),
) -> Callable[[], keras.Model]:
    """A function that makes a fresh baseline: zoo network, user's builder or user's file.

    A file's model comes with its trained weights, and with its class order when a
    ``labels.txt`` lies beside it (checked against `class_names`, the data's). The first model
    is made and checked now, so a model that does not fit the data is refused before any
    training.

    Raises:
        ModelSourceError: The model cannot be made, or its input, outputs or class order
            disagree with the data (naming both values).
    """
    makers: dict[str, Callable[[], keras.Model]] = {
        "zoo": lambda: build_configured(model_cfg, image_size, num_classes),
        "builder": lambda: build_with(str(model_cfg.builder), image_size, num_classes),
        "file": lambda: load_model_file(Path(str(model_cfg.path))),
    }
    make = makers[model_cfg.source]
    if model_cfg.source == "file" and class_names:
        check_class_order(Path(str(model_cfg.path)), class_names)
    checked = [make()]
    check_fits(checked[0], image_size, num_classes, model_cfg.source)
    # The checked model is the first one handed out, so a file is not loaded twice.
    return lambda: checked.pop() if checked else make()


def labels_of(path: Path) -> list[str] | None:
    """The class order a model file or folder comes with, None when it has no ``labels.txt``.

    Looked for inside a folder (its root, then ``assets/``, where tfopt's SavedModels keep it)
    and beside a file.
    """
    places = [path / LABELS_FILE, path / "assets" / LABELS_FILE] if path.is_dir() else [
        path.with_name(LABELS_FILE)]
    found = next((place for place in places if place.is_file()), None)
    return read_labels(found) if found else None


def check_class_order(path: Path, class_names: Sequence[str]) -> None:
    """Refuse a model whose ``labels.txt`` names other classes, or the same in another order.

    Raises:
        ModelSourceError: Naming the model's classes and the data folder's.
    """
    labels = labels_of(path)
    if labels is None or labels == list(class_names):
        return
    what = "in another order" if sorted(labels) == sorted(class_names) else "other classes"
    raise ModelSourceError(
        f"model.path: {path}'s labels.txt lists {what} than the data folder: model "
        f"{labels[:20]}, data {list(class_names)[:20]}; the outputs would be read as the wrong "
        "classes (rename the class folders or fix labels.txt)"
    )


IMAGE_CHANNELS = (1, 3)
"""Channels an image model may take: grayscale or RGB (the data is decoded to the model's)."""


def io_shapes(model: keras.Model, image_size: int) -> tuple[object, object]:
    """A Keras model's input and output shapes.

    A subclassed model has none until called: it is called once on a batch of zeros, RGB
    first, then grayscale.

    Raises:
        ModelSourceError: A subclassed model that takes neither.
    """
    try:
        return model.input_shape, model.output_shape
    except AttributeError:
        pass
    import numpy as np

    for channels in reversed(IMAGE_CHANNELS):
        try:
            output = model(np.zeros((1, image_size, image_size, channels), np.float32))
        except Exception:
            continue
        return (None, image_size, image_size, channels), (None, *tuple(output.shape)[1:])
    raise ModelSourceError(
        f"model: {model.name} is a subclassed model that takes neither [1, {image_size}, "
        f"{image_size}, 3] nor [1, {image_size}, {image_size}, 1] images")


def input_channels(model: keras.Model, image_size: int) -> int:
    """The channels of a Keras model's image input (1 or 3; `check_fits` refuses others)."""
    shape, _ = io_shapes(model, image_size)
    return int(shape[-1]) if not isinstance(shape, list) and shape and shape[-1] else 3


def check_fits(model: keras.Model, image_size: int, num_classes: int, source: str) -> None:
    """Refuse a model whose input is not ``[batch, S, S, C]`` (C 1 or 3) or misses classes.

    Raises:
        ModelSourceError: Naming the model's value, the data's, and what was expected.
    """
    field = {"file": "model.path", "builder": "model.builder"}.get(source, "model")
    input_shape, output_shape = io_shapes(model, image_size)
    shape = tuple(input_shape) if not isinstance(input_shape, list) else None
    if shape is None or len(shape) != 4 or shape[3] not in IMAGE_CHANNELS:
        raise ModelSourceError(
            f"{field}: the model's input is {input_shape}; expected one image tensor [batch, height, "
            "width, channels] with 1 (grayscale) or 3 (RGB) channels, channels last"
        )
    if shape[1:3] != (image_size, image_size):
        raise ModelSourceError(
            f"{field}: the model's input is {shape[1]}x{shape[2]} but data.image_size is "
            f"{image_size}: set data.image_size to the model's input size"
        )
    outputs = output_shape[-1] if not isinstance(output_shape, list) else None
    if outputs != num_classes:
        raise ModelSourceError(
            f"{field}: the model has {outputs} outputs but the data folder has {num_classes} "
            "classes (model.head: replace puts a new classification layer on it)"
        )
