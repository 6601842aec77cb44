"""Networks tfopt can train: built in code, no downloaded weights. Not a task.

Every model takes images ``[batch, size, size, 3]`` (NHWC, the serving contract; pixel scale
per ``model.input_scale``) and returns class logits. Where tf_keras ships the architecture
(MobileNetV2/V3, EfficientNetB0, ResNet50) it is ``tf_keras.applications`` built with
``weights=None`` (or the user's local weights file) on tfopt's input, flat in one functional
model, so pruning and quantization see every layer. The small networks are written here. With
``data_format="channels_first"`` the model transposes its input once and runs every layer in
NCHW, so both layouts can be measured on one device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import tf_keras as keras

HANDWRITTEN = ("small_cnn", "small_student")
APPLICATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "mobilenet_v2": ("MobileNetV2", {}),
    "mobilenet_v3_small": ("MobileNetV3Small", {"include_preprocessing": False}),
    "mobilenet_v3_large": ("MobileNetV3Large", {"include_preprocessing": False}),
    "efficientnet_b0": ("EfficientNetB0", {}),
    "resnet50": ("ResNet50", {}),
}
"""tfopt's name, the ``tf_keras.applications`` constructor and its fixed arguments."""
WIDTH_MULTIPLIED = frozenset({"mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large"})
ARCHITECTURES = (*HANDWRITTEN[:1], *APPLICATIONS, *HANDWRITTEN[1:])
MIN_APPLICATION_SIZE = 32
"""tf_keras.applications refuse smaller inputs."""
DataFormat = str


def build_model(
    architecture: str,
    image_size: int,
    num_classes: int,
    width: int = 16,
    alpha: float = 0.35,
    data_format: DataFormat = "channels_last",
    weights: Path | None = None,
    channels: int = 3,
    input_scale: str = "unit",
) -> keras.Model:
    """Build an untrained (or locally initialized) network that maps images to class logits.

    Args:
        architecture: One of `ARCHITECTURES`: ``small_cnn``, ``small_student`` (small_cnn without
            its hidden dense layer, meant to be distilled from a larger teacher), or a
            tf_keras.applications network (``mobilenet_v2``, ``mobilenet_v3_small``,
            ``mobilenet_v3_large``, ``efficientnet_b0``, ``resnet50``) without its top.
        image_size: Input side in pixels (square input; at least 32 for applications).
        num_classes: Output logits.
        width: Filters in the first convolution (small_cnn, small_student).
        alpha: Width multiplier (the MobileNets).
        data_format: ``channels_last`` (NHWC) or ``channels_first`` (NCHW) inside the model.
        weights: A local weights file to start from: for an application, its feature
            extractor's weights (Keras' ``weights=`` argument, e.g. an ImageNet "no top" file);
            for a small network, the whole model's (``save_weights`` of the same network).
        channels: Input channels: 3 (RGB) or 1 (grayscale, e.g. a student of a grayscale
            teacher).
        input_scale: The pixels the model is fed (``unit``, ``symmetric`` or ``raw``): an
            application whose stem rescales raw pixels itself (EfficientNet) is made to map
            these to 0..1 (`rescale_stem`).

    Returns:
        An uncompiled tf_keras model whose input is named ``images``.

    Raises:
        ValueError: Unknown architecture or data format, or an input too small.
    """
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"unknown data_format {data_format!r}")
    if architecture not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise ValueError(f"unknown architecture {architecture!r}; known: {known}")
    ops = _Layers(data_format)
    inputs = keras.Input((image_size, image_size, channels), name="images")
    x = keras.layers.Permute((3, 1, 2), name="to_nchw")(inputs) if ops.nchw else inputs
    if architecture in APPLICATIONS:
        x = _application(architecture, x, ops, alpha, weights, input_scale)
    else:
        handwritten: dict[str, Callable[[_Layers, Any], Any]] = {
            "small_cnn": lambda ops, x: _small_cnn(ops, x, width),
            "small_student": lambda ops, x: _small_student(ops, x, width),
        }
        x = handwritten[architecture](ops, x)
    # Logits stay float32 under a mixed-precision policy, for a numerically stable loss.
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    model = keras.Model(inputs, outputs, name=architecture)
    if weights is not None and architecture not in APPLICATIONS:
        model.load_weights(weights)
    return model


FROM_SCRATCH_BN_MOMENTUM = 0.9
"""Batch-norm momentum of an application trained from scratch. The applications' 0.99-0.999 suit
fine-tuning from ImageNet statistics; from random weights on a few thousand images (a few hundred
steps) their moving statistics stay near the initial ones, and a network right on its training
images scores near chance on validation."""


STEM_TO_UNIT = {"raw": (1.0 / 255.0, 0.0), "unit": (1.0, 0.0), "symmetric": (0.5, 0.5)}
"""Scale and offset that take the pixels tfopt feeds (``model.input_scale``) to 0..1."""


def rescale_stem(base: keras.Model, input_scale: str) -> None:
    """Make the stem's ``Rescaling(1/255)`` of `base` map the pixels it is fed to 0..1.

    EfficientNet divides by 255 in its first layer, expecting raw pixels. Fed 0..1 pixels
    (tfopt's default), its stem convolution's outputs span a 255th of their range: float
    training copes (batch norm rescales them), but 8-bit fake quantization, whose ranges start
    at +-6, rounds them all to one value: QAT scored chance (0.09-0.12) on EfficientNetB0.
    """
    for layer in base.layers:
        if isinstance(layer, keras.layers.Rescaling):
            if abs(float(layer.scale) - 1.0 / 255.0) < 1e-9 and not layer.offset:
                layer.scale, layer.offset = STEM_TO_UNIT[input_scale]
            return


def _application(architecture: str, x: Any, ops: _Layers, alpha: float,
                 weights: Path | None, input_scale: str = "unit") -> Any:
    """The application's pooled features, built on `x` so its layers join tfopt's model."""
    constructor_name, fixed = APPLICATIONS[architecture]
    constructor = getattr(keras.applications, constructor_name)
    side = int(x.shape[2])
    if side < MIN_APPLICATION_SIZE:
        raise ValueError(f"{architecture} needs images of at least {MIN_APPLICATION_SIZE}x"
                         f"{MIN_APPLICATION_SIZE} pixels, not {side}x{side}")
    arguments = {**fixed, **({"alpha": alpha} if architecture in WIDTH_MULTIPLIED else {})}
    previous = keras.backend.image_data_format()
    keras.backend.set_image_data_format(ops.data_format)
    try:
        base = constructor(input_tensor=x, include_top=False, pooling="avg",
                           weights=str(weights) if weights else None, **arguments)
    finally:
        keras.backend.set_image_data_format(previous)
    if weights is None:
        for layer in base.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = FROM_SCRATCH_BN_MOMENTUM
    rescale_stem(base, input_scale)
    return base.output


class _Layers:
    """Layer factories that share one data format."""

    def __init__(self, data_format: DataFormat) -> None:
        self.data_format = data_format
        self.nchw = data_format == "channels_first"

    def conv(self, filters: int, kernel: int, name: str, strides: int = 1) -> keras.layers.Layer:
        return keras.layers.Conv2D(filters, kernel, strides=strides, padding="same",
                                   use_bias=False, data_format=self.data_format, name=name)

    def bn(self, name: str) -> keras.layers.Layer:
        return keras.layers.BatchNormalization(axis=1 if self.nchw else -1, momentum=0.9,
                                               name=name)

    def pool(self, name: str) -> keras.layers.Layer:
        return keras.layers.MaxPooling2D(2, data_format=self.data_format, name=name)


def _conv_bn_relu(ops: _Layers, x, filters: int, name: str):
    x = ops.conv(filters, 3, f"{name}_conv")(x)
    x = ops.bn(f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _pooled(ops: _Layers, x):
    return keras.layers.GlobalAveragePooling2D(data_format=ops.data_format, name="gap")(x)


def _small_cnn(ops: _Layers, x, width: int):
    for block, filters in enumerate((width, width * 2, width * 4)):
        x = _conv_bn_relu(ops, x, filters, f"block{block}")
        x = ops.pool(f"pool{block}")(x)
    return keras.layers.Dense(width * 4, activation="relu", name="fc")(_pooled(ops, x))


def _small_student(ops: _Layers, x, width: int):
    for block, filters in enumerate((width, width * 2, width * 4)):
        x = _conv_bn_relu(ops, x, filters, f"block{block}")
        x = ops.pool(f"pool{block}")(x)
    return _pooled(ops, x)
