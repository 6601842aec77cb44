"""Where the baseline comes from: a zoo network, the user's builder, or the user's file.

Each source is checked against the data (input size, classes and their order) before any
training, with errors naming both values.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import tf_keras as keras

from tfopt.config import ConfigError, ModelConfig
from tfopt.models.keras_io import keras_version_of, load_keras_model
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
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ModelSourceError(f"model.builder: {path} does not exist")
            module_spec = importlib.util.spec_from_file_location(f"tfopt_builder_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ModelSourceError:
        raise
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
    if not isinstance(model, keras.Model):
        raise ModelSourceError(
            f"model.builder: {spec} returned a {type(model).__module__}.{type(model).__name__}, "
            "not a tf_keras.Model (build it with `import tf_keras`, not Keras 3)"
        )
    return model


def load_model_file(path: Path) -> keras.Model:
    """Load the user's trained model file, with a clear error when it cannot be.

    Raises:
        ModelSourceError: Missing, corrupt, or saved by Keras 3 (tfmot needs tf_keras).
    """
    if not (path.is_file() or (path / "keras_metadata.pb").is_file()):
        raise ModelSourceError(f"model.path: {path} does not exist")
    saved_by = keras_version_of(path)
    if saved_by and not saved_by.startswith("2."):
        raise ModelSourceError(
            f"model.path: {path} was saved by Keras {saved_by}; tfopt needs a tf_keras (Keras 2) "
            "model, since tensorflow-model-optimization works with Keras 2 only: rebuild or "
            "re-save it with `import tf_keras as keras`"
        )
    try:
        return load_keras_model(path)
    except Exception as error:
        raise ModelSourceError(
            f"model.path: {path} cannot be loaded as a tf_keras model: "
            f"{type(error).__name__}: {str(error)[:300]}"
        ) from error


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


def check_fits(model: keras.Model, image_size: int, num_classes: int, source: str) -> None:
    """Refuse a model whose input is not ``[batch, S, S, 3]`` or whose outputs miss classes.

    Raises:
        ModelSourceError: Naming the model's value and the data's.
    """
    shape = tuple(model.input_shape) if not isinstance(model.input_shape, list) else None
    if shape is None or len(shape) != 4 or shape[3] != 3:
        raise ModelSourceError(
            f"model ({source}): input {model.input_shape} is not one [batch, height, width, 3] "
            "image tensor"
        )
    if shape[1:3] != (image_size, image_size):
        raise ModelSourceError(
            f"model ({source}): input is {shape[1]}x{shape[2]} but data.image_size is "
            f"{image_size}: set data.image_size to the model's input size"
        )
    outputs = model.output_shape[-1] if not isinstance(model.output_shape, list) else None
    if outputs != num_classes:
        raise ModelSourceError(
            f"model ({source}): {outputs} outputs but the data folder has {num_classes} classes"
        )
