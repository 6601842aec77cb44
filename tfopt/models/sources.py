"""Where the baseline comes from: a zoo network, the user's builder, or the user's file.

Each source is checked against the data (input size, classes and their order) before any
training, with errors naming both values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tf_keras as keras

from tfopt.config import ConfigError
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import (
    is_keras_model,
    is_layer_graph,
    keras_flavor_of_file,
    keras_of,
    keras_version_of,
    load_keras_model,
)
from tfopt.models.zoo import build_model
from tfopt.serving import LABELS_FILE, read_labels
from tfopt.user_code import CodeNotAllowedError, import_code


def build_configured(model_cfg: ModelConfig, image_size: int, num_classes: int) -> keras.Model:
    """The configured zoo network for this image size and number of classes."""
    return build_model(
        model_cfg.architecture, image_size, num_classes, width=model_cfg.width,
        alpha=model_cfg.alpha, data_format=model_cfg.data_format, weights=model_cfg.weights,
        input_scale=model_cfg.input_scale,
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
    except CodeNotAllowedError as error:
        raise ModelSourceError(str(error)) from error
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


OutputKind = Literal["logits", "softmax", "scores"]
"""What a model's output is: logits, a softmax's probabilities (tfopt uses the tensor before
it), or scores of a model whose inside cannot be reached (a subclassed model)."""


@dataclass
class BaselineMaker:
    """Makes fresh baselines: zoo network, user's builder or user's file, as logits models.

    Attributes:
        make: Returns a fresh model (the first call hands out the one checked on creation).
        output_kind: What the model's output was before tfopt took its logits.
        channels: The model's image channels.
        head_replaced: The name of the classification layer `model.head: replace` swapped out.
    """

    make: Callable[[], keras.Model]
    output_kind: OutputKind
    channels: int
    head_replaced: str | None = None

    def __call__(self) -> keras.Model:
        """A fresh baseline model."""
        return self.make()


def baseline_factory(
    model_cfg: ModelConfig, image_size: int, num_classes: int,
    class_names: Sequence[str] = (),
) -> BaselineMaker:
    """What makes a fresh baseline: zoo network, user's builder or user's file.

    A file's model comes with its trained weights, and with its class order when a
    ``labels.txt`` lies beside it (checked against `class_names`, the data's, unless its head
    is replaced). A model ending in a softmax is taken up to the tensor before it (`to_logits`);
    with ``model.head: replace`` its classification layer is swapped for a new one with the
    data's classes (`replace_head`). The first model is made and checked now, so a model that
    does not fit the data is refused before any training.

    Raises:
        ModelSourceError: The model cannot be made, or its input, outputs or class order
            disagree with the data (naming both values and what was expected).
    """
    makers: dict[str, Callable[[], keras.Model]] = {
        "zoo": lambda: build_configured(model_cfg, image_size, num_classes),
        "builder": lambda: build_with(str(model_cfg.builder), image_size, num_classes),
        "file": lambda: load_model_file(Path(str(model_cfg.path))),
    }
    load = makers[model_cfg.source]
    replace = model_cfg.head == "replace"
    if model_cfg.source == "file" and class_names and not replace:
        check_class_order(Path(str(model_cfg.path)), class_names)

    def make() -> tuple[keras.Model, OutputKind, str | None]:
        model, kind = to_logits(load())
        if not replace:
            return model, kind, None
        new_model, replaced = replace_head(model, num_classes, model_cfg.source)
        return new_model, kind, replaced

    first, output_kind, replaced = make()
    check_fits(first, image_size, num_classes, model_cfg.source)
    # The checked model is the first one handed out, so a file is not loaded twice.
    checked = [first]
    return BaselineMaker(make=lambda: checked.pop() if checked else make()[0],
                         output_kind=output_kind, channels=input_channels(first, image_size),
                         head_replaced=replaced)


def _is_softmax(activation: object) -> bool:
    return getattr(activation, "__name__", None) == "softmax"


def to_logits(model: keras.Model) -> tuple[keras.Model, OutputKind]:
    """A model of logits: one ending in a softmax is taken up to the tensor before it.

    A last layer with a softmax activation (``Dense(..., activation="softmax")``) is switched to
    a linear one; a final ``Softmax`` or ``Activation("softmax")`` layer is cut off. Training
    (cross-entropy of logits), distillation, agreement and int8 debugging then see logits, and
    the served model's ``probabilities`` are the original's softmax. A subclassed model cannot
    be opened up: its outputs are taken as they are (``scores``).
    """
    if not is_layer_graph(model) or len(model.outputs) != 1:
        return model, "scores" if not is_layer_graph(model) else "logits"
    last = model.layers[-1]
    module = keras_of(model)
    if type(last).__name__ == "Softmax" or (type(last).__name__ == "Activation"
                                             and _is_softmax(last.activation)):
        return module.Model(model.inputs, last.input, name=model.name), "softmax"
    if _is_softmax(getattr(last, "activation", None)):
        last.activation = module.activations.get("linear")
        return model, "softmax"
    return model, "logits"


CLASSIFIER_LAYERS = ("Dense", "Conv2D")
"""Layers `replace_head` can swap: a dense classifier, or a convolution that classifies each
position before a global pooling (the all-convolutional heads of mini-Xception, SqueezeNet)."""


def replace_head(model: keras.Model, num_classes: int, source: str) -> tuple[keras.Model, str]:
    """The model with a new classification layer of `num_classes` logits in place of its own.

    The classification layer is the last layer with weights on the way back from the output;
    the weight-free layers after it (a global pooling, a flatten, a reshape) are applied again
    after the new one, which takes the same settings with `num_classes` units or filters and
    new weights.

    Returns:
        The new model, and the name of the layer it replaced.

    Raises:
        ModelSourceError: A subclassed model, or one whose last weighted layer is not a Dense
            or Conv2D layer (or is reached through a layer with several inputs), named.
    """
    field = {"file": "model.path", "builder": "model.builder"}.get(source, "model")
    if not is_layer_graph(model) or len(model.outputs) != 1:
        raise ModelSourceError(
            f"model.head: replace needs a functional or sequential model with one output "
            f"({field}); {model.name} is a {type(model).__name__}: put the new head on in your "
            "builder instead")
    tail: list[object] = []
    layer = model.outputs[0]._keras_history[0]
    while not layer.weights:
        tail.append(layer)
        layer = _only_inbound(layer, field)
    if type(layer).__name__ not in CLASSIFIER_LAYERS:
        raise ModelSourceError(
            f"model.head: replace swaps the model's classification layer (Dense or Conv2D), "
            f"but the last layer with weights in {field} is {layer.name} ({type(layer).__name__})")
    names = {each.name for each in model.layers}
    config = {**layer.get_config(),
              "name": next(n for n in ("logits", "new_logits", f"{layer.name}_replaced")
                           if n not in names),
              "units" if type(layer).__name__ == "Dense" else "filters": num_classes,
              "activation": "linear", "dtype": "float32"}
    outputs = type(layer).from_config(config)(layer.input)
    for after in reversed(tail):
        outputs = type(after).from_config(after.get_config())(outputs)
    return keras_of(model).Model(model.inputs, outputs, name=model.name), layer.name


def _only_inbound(layer: object, field: str) -> object:
    """The one layer feeding `layer`.

    Raises:
        ModelSourceError: It has several inputs or none (the head cannot be followed back).
    """
    try:
        feeding = layer.input
    except (AttributeError, ValueError) as error:
        raise ModelSourceError(
            f"model.head: replace follows the output back to the classification layer, but "
            f"{layer.name} in {field} has no single input") from error
    if isinstance(feeding, list | tuple | dict):
        raise ModelSourceError(
            f"model.head: replace follows the output back to the classification layer, but "
            f"{layer.name} ({type(layer).__name__}) in {field} takes several inputs")
    return feeding._keras_history[0]


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
            f"{field}: the model's input is {input_shape}; expected one image tensor [batch, "
            "height, width, channels] with 1 (grayscale) or 3 (RGB) channels, channels last"
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
