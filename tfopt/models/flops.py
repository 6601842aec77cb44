"""FLOPs per example of a Keras model, read from its layers (tfmot's wrappers looked through)."""

from __future__ import annotations

from typing import Any

import numpy as np


def keras_flops(model: object) -> float:
    """FLOPs per example of a Keras model (tfmot's wrappers are looked through).

    FLOPs count 2 x the multiply-accumulates of convolutions, depthwise convolutions and fully
    connected layers (see `tfopt.measurement.profiles`).
    """
    total = 0.0
    for layer in _keras_layers(model):
        kind = type(layer).__name__
        kernel = getattr(layer, "depthwise_kernel", None)
        if kind == "DepthwiseConv2D" and kernel is not None:
            kh, kw, _, _ = kernel.shape
            total += 2.0 * kh * kw * _per_example(_output_shape(layer))
        elif kind in ("Conv2D", "Conv1D", "Conv3D") and getattr(layer, "kernel", None) is not None:
            *window, channels_in, _ = layer.kernel.shape
            total += 2.0 * float(np.prod(window)) * channels_in * _per_example(_output_shape(layer))
        elif kind == "Dense" and getattr(layer, "kernel", None) is not None:
            total += 2.0 * layer.kernel.shape[0] * _per_example(_output_shape(layer))
    return total


def _keras_layers(model: object) -> list[object]:
    found = []
    for layer in getattr(model, "layers", []):
        inner = getattr(layer, "layer", None)  # PruneLowMagnitude, QuantizeWrapper, Cluster...
        if inner is not None:
            found.append(inner)
        elif hasattr(layer, "layers"):
            found += _keras_layers(layer)
        else:
            found.append(layer)
    return found


def _per_example(shape: object) -> float:
    """Elements per example of a layer's output shape ``(None, ...)``."""
    if isinstance(shape, list):
        shape = shape[0]
    return float(np.prod([d for d in shape[1:] if d is not None]))


def _output_shape(layer: Any) -> object:
    """A layer's output shape (tf_keras has ``output_shape``; Keras 3 its output's shape)."""
    try:
        return layer.output_shape
    except AttributeError:
        return tuple(layer.output.shape)
