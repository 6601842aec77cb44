"""Networks tfopt can train: built in code, no downloaded weights. Not a task."""

from __future__ import annotations

import tf_keras as keras


def build_model(
    architecture: str, image_size: int, num_classes: int, width: int = 16
) -> keras.Model:
    """Build an untrained network that maps float images in [0, 1] to class logits.

    Args:
        architecture: Name from the zoo (``small_cnn``).
        image_size: Input side in pixels (square RGB input).
        num_classes: Output logits.
        width: Filters in the first convolution; later layers scale from it.

    Returns:
        An uncompiled tf_keras model whose input is named ``images``.

    Raises:
        ValueError: Unknown architecture.
    """
    if architecture == "small_cnn":
        return _small_cnn(image_size, num_classes, width)
    raise ValueError(f"unknown architecture {architecture!r}; known: small_cnn")


def _small_cnn(image_size: int, num_classes: int, width: int) -> keras.Model:
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = inputs
    for block, filters in enumerate((width, width * 2, width * 4)):
        x = keras.layers.Conv2D(filters, 3, padding="same", name=f"conv{block}")(x)
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{block}")(x)
        x = keras.layers.ReLU(name=f"relu{block}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{block}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(width * 4, activation="relu", name="fc")(x)
    # Logits stay float32 under a mixed-precision policy, for a numerically stable loss.
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="small_cnn")
