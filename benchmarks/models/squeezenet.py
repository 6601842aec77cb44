"""A SqueezeNet in Keras 3 (fire modules: a 1x1 squeeze, then 1x1 and 3x3 expands concatenated).

``model.builder: benchmarks/models/squeezenet.py:build``: a model nobody tuned tfopt for, whose
branches meet in concatenations rather than additions. SqueezeNet 1.1's layout (Iandola et al.,
2016) at a quarter of its widths, batch normalization after each convolution, global pooling
into a dense layer of logits.
"""

from __future__ import annotations

import keras


def _conv(x: keras.KerasTensor, filters: int, kernel: int, name: str,
          strides: int = 1) -> keras.KerasTensor:
    x = keras.layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                            name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _fire(x: keras.KerasTensor, squeeze: int, expand: int, name: str) -> keras.KerasTensor:
    x = _conv(x, squeeze, 1, f"{name}_squeeze")
    return keras.layers.Concatenate(name=f"{name}_concat")(
        [_conv(x, expand, 1, f"{name}_expand1"), _conv(x, expand, 3, f"{name}_expand3")])


def build(image_size: int, num_classes: int) -> keras.Model:
    """The network for `image_size` x `image_size` RGB images and `num_classes` logits."""
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = _conv(inputs, 32, 3, "stem", strides=2)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool1")(x)
    x = _fire(x, 8, 32, "fire2")
    x = _fire(x, 8, 32, "fire3")
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool3")(x)
    x = _fire(x, 16, 64, "fire4")
    x = _fire(x, 16, 64, "fire5")
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool5")(x)
    x = _fire(x, 24, 96, "fire6")
    x = _fire(x, 24, 96, "fire7")
    x = _fire(x, 32, 128, "fire8")
    x = _fire(x, 32, 128, "fire9")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="squeezenet")
