"""Networks tfopt can train: built in code, no downloaded weights. Not a task.

Every model takes float images in [0, 1], NHWC (``[batch, size, size, 3]``, the serving
contract), and returns class logits. With ``data_format="channels_first"`` the model transposes
its input once and runs every layer in NCHW, so both layouts can be measured on one device.
"""

from __future__ import annotations

from collections.abc import Callable

import tf_keras as keras

ARCHITECTURES = ("small_cnn", "mobilenet_v2", "small_student")
DataFormat = str


def build_model(
    architecture: str,
    image_size: int,
    num_classes: int,
    width: int = 16,
    alpha: float = 0.35,
    data_format: DataFormat = "channels_last",
) -> keras.Model:
    """Build an untrained network that maps float images in [0, 1] to class logits.

    Args:
        architecture: ``small_cnn``, ``mobilenet_v2`` (inverted residual blocks with depthwise
            convolutions, MobileNetV2's layout) or ``small_student`` (small_cnn without its hidden
            dense layer, meant to be distilled from a larger teacher).
        image_size: Input side in pixels (square RGB input).
        num_classes: Output logits.
        width: Filters in the first convolution (small_cnn, small_student).
        alpha: Width multiplier (mobilenet_v2).
        data_format: ``channels_last`` (NHWC) or ``channels_first`` (NCHW) inside the model.

    Returns:
        An uncompiled tf_keras model whose input is named ``images``.

    Raises:
        ValueError: Unknown architecture or data format.
    """
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"unknown data_format {data_format!r}")
    builders: dict[str, Callable[[_Layers, keras.layers.Layer], keras.layers.Layer]] = {
        "small_cnn": lambda ops, x: _small_cnn(ops, x, width),
        "mobilenet_v2": lambda ops, x: _mobilenet_v2(ops, x, alpha),
        "small_student": lambda ops, x: _small_student(ops, x, width),
    }
    if architecture not in builders:
        known = ", ".join(ARCHITECTURES)
        raise ValueError(f"unknown architecture {architecture!r}; known: {known}")
    ops = _Layers(data_format)
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = keras.layers.Permute((3, 1, 2), name="to_nchw")(inputs) if ops.nchw else inputs
    x = builders[architecture](ops, x)
    # Logits stay float32 under a mixed-precision policy, for a numerically stable loss.
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=architecture)


class _Layers:
    """Layer factories that share one data format."""

    def __init__(self, data_format: DataFormat) -> None:
        self.data_format = data_format
        self.nchw = data_format == "channels_first"

    def conv(self, filters: int, kernel: int, name: str, strides: int = 1) -> keras.layers.Layer:
        return keras.layers.Conv2D(filters, kernel, strides=strides, padding="same",
                                   use_bias=False, data_format=self.data_format, name=name)

    def depthwise(self, strides: int, name: str) -> keras.layers.Layer:
        return keras.layers.DepthwiseConv2D(3, strides=strides, padding="same", use_bias=False,
                                            data_format=self.data_format, name=name)

    def bn(self, name: str) -> keras.layers.Layer:
        return keras.layers.BatchNormalization(axis=1 if self.nchw else -1, momentum=0.9,
                                               name=name)

    def pool(self, name: str) -> keras.layers.Layer:
        return keras.layers.MaxPooling2D(2, data_format=self.data_format, name=name)

    def channels(self, x: keras.layers.Layer) -> int:
        return int(x.shape[1] if self.nchw else x.shape[-1])


def _conv_bn_relu(ops: _Layers, x, filters: int, name: str, strides: int = 1, relu6=False):
    x = ops.conv(filters, 3, f"{name}_conv", strides)(x)
    x = ops.bn(f"{name}_bn")(x)
    return keras.layers.ReLU(6.0 if relu6 else None, name=f"{name}_relu")(x)


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


def _make_divisible(value: float, divisor: int = 8) -> int:
    return max(divisor, int(value + divisor / 2) // divisor * divisor)


def _inverted_residual(ops: _Layers, x, expansion: int, filters: int, strides: int, name: str):
    in_channels = ops.channels(x)
    y = x
    if expansion != 1:
        y = ops.conv(in_channels * expansion, 1, f"{name}_expand")(y)
        y = ops.bn(f"{name}_expand_bn")(y)
        y = keras.layers.ReLU(6.0, name=f"{name}_expand_relu")(y)
    y = ops.depthwise(strides, f"{name}_depthwise")(y)
    y = ops.bn(f"{name}_depthwise_bn")(y)
    y = keras.layers.ReLU(6.0, name=f"{name}_depthwise_relu")(y)
    y = ops.conv(filters, 1, f"{name}_project")(y)
    y = ops.bn(f"{name}_project_bn")(y)
    if strides == 1 and in_channels == filters:
        y = keras.layers.Add(name=f"{name}_add")([x, y])
    return y


# MobileNetV2's (expansion, channels, repeats, first stride) table.
_MOBILENET_V2_BLOCKS = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _mobilenet_v2(ops: _Layers, x, alpha: float):
    x = _conv_bn_relu(ops, x, _make_divisible(32 * alpha), "stem", strides=2, relu6=True)
    index = 0
    for expansion, channels, repeats, stride in _MOBILENET_V2_BLOCKS:
        for repeat in range(repeats):
            x = _inverted_residual(ops, x, expansion, _make_divisible(channels * alpha),
                                   stride if repeat == 0 else 1, f"block{index}")
            index += 1
    head = _make_divisible(1280 * max(1.0, alpha))
    x = ops.conv(head, 1, "head_conv")(x)
    x = ops.bn("head_bn")(x)
    return _pooled(ops, keras.layers.ReLU(6.0, name="head_relu")(x))
