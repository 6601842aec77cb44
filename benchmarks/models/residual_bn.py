"""A small residual CNN in Keras 3, batch norm in every block: a model nobody tuned for tfopt.

``model.builder: benchmarks/models/residual_bn.py:build``. Five blocks of convolution, batch
normalization (Keras 3's defaults: momentum 0.99) and ReLU, the last four residual, then global
pooling and a dense layer of logits. Trained on a few thousand images, its batch-norm moving
statistics lag far behind its activations' (see `tfopt.models.batch_norm`).
"""

from __future__ import annotations

import keras


def _block(x: keras.KerasTensor, filters: int, name: str, residual: bool) -> keras.KerasTensor:
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv")(x)
    y = keras.layers.BatchNormalization(name=f"{name}_bn")(y)
    if residual:
        y = keras.layers.Add(name=f"{name}_add")([x, y])
    return keras.layers.ReLU(name=f"{name}_relu")(y)


def build(image_size: int, num_classes: int) -> keras.Model:
    """The network for `image_size` x `image_size` RGB images and `num_classes` logits."""
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = _block(inputs, 32, "stem", residual=False)
    x = keras.layers.MaxPooling2D(name="stem_pool")(x)
    for index in range(4):
        x = _block(x, 32, f"block{index + 1}", residual=True)
        if index % 2 == 1:
            x = keras.layers.MaxPooling2D(name=f"pool{index + 1}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="residual_bn")
