"""Quantization-aware training's activation ranges set from training images before it starts.

tfmot's activation quantizers (`MovingAverageQuantizer`) start every range at [-6, 6] and move
it toward each training batch's range by an exponential moving average of decay 0.999: a range
forgets where it started only after about a thousand steps (tensorflow/model-optimization issue
368). A quantization-aware fine-tuning of a few epochs on a small data set runs a few dozen
steps and ends with its ranges still near [-6, 6]: a ReLU's outputs in [0, 1] quantized on a
grid several times too coarse, a stem's outputs past 6 clipped, and the int8 file points below
the float model (docs/measurements.md). So before the fine-tuning each range is set to where the
moving average settles: the mean over batches of training images of the range of the tensor it
quantizes, read from the float model the fake-quantized one wraps (the layer of the same name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CALIBRATION_IMAGES = 512
"""Training images the ranges are calibrated from (as the batch-norm re-estimation takes)."""
CALIBRATION_BATCH = 64
"""Images per forward pass: each batch's range weighs the same in the mean, as in tfmot's."""


@dataclass(frozen=True)
class Range:
    """One moving-average quantizer's range variables, and the float layer whose output it sees.

    Attributes:
        layer: The float model's layer whose output the quantizer quantizes.
        low: Its minimum variable (one value, or one per channel).
        high: Its maximum variable.
    """

    layer: str
    low: Any
    high: Any


def moving_average_ranges(model: Any) -> list[Range]:
    """The ranges of the moving-average quantizers that see a float layer's output, in order.

    Found where tfmot keeps them: a `QuantizeWrapper`'s output quantizer and its activation's
    post-activation quantizer (both quantize the wrapped layer's output, activation included).
    The model input's quantizer keeps the range of every value seen and weight quantizers take
    each training step's last value: neither is a moving average. A pre-activation quantizer
    sees no float layer's output and keeps tfmot's start.
    """
    from tensorflow_model_optimization.python.core.quantization.keras.quantizers import (
        MovingAverageQuantizer,
    )

    found: list[Range] = []

    def add(layer: str, quantizer: Any, variables: Any) -> None:
        if isinstance(quantizer, MovingAverageQuantizer) and isinstance(variables, dict):
            found.append(Range(layer, variables["min_var"], variables["max_var"]))

    for layer in model.layers:
        wrapped = getattr(layer, "layer", None)
        if wrapped is None:
            continue
        outputs = getattr(layer, "_output_quantizers", None) or []
        if outputs:
            add(wrapped.name, outputs[0], getattr(layer, "_output_quantizer_vars", None))
        activation = getattr(wrapped, "activation", None)
        add(wrapped.name, getattr(activation, "quantizer", None),
            getattr(activation, "_post_activation_vars", None))
    return found


def _batch_range(values: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """A tensor's range as tfmot's `MovingAvgQuantize` takes it (0 always inside)."""
    axes = tuple(range(values.ndim - 1)) if per_channel else None
    return (np.minimum(np.min(values, axis=axes), 0.0),
            np.maximum(np.max(values, axis=axes), 0.0))


def calibrate_ranges(model: Any, float_model: Any, images: np.ndarray | dict[str, np.ndarray],
                     batch_size: int = CALIBRATION_BATCH) -> list[str]:
    """Set `model`'s moving-average ranges to their tensors' mean batch range over `images`.

    The tensors are read from `float_model` (the model `model` fake-quantizes) in inference
    mode, as the int8 file will run. A range whose layer `float_model` lacks (or whose output is
    not one tensor) keeps tfmot's start.

    Args:
        model: The fake-quantized model (tfmot's ``quantize_apply``); its ranges are set.
        float_model: The float model it was made from, unchanged.
        images: Training images, scaled as the model takes them (array data: its inputs, one
            array or a dict of them by input name).
        batch_size: Examples per forward pass.

    Returns:
        The layers whose output ranges were set.
    """
    import tf_keras as keras

    every = moving_average_ranges(model)
    outputs = _single_outputs(float_model, {r.layer for r in every})
    ranges = [r for r in every if r.layer in outputs]
    if not ranges or not _examples(images):
        return []
    layers = sorted(outputs)
    probe = keras.Model(float_model.inputs, [outputs[name] for name in layers])
    sums: dict[int, list[np.ndarray]] = {}
    batches = 0
    for start in range(0, _examples(images), batch_size):
        batch = _rows(images, start, start + batch_size)
        tensors = dict(zip(layers, _as_list(probe(batch, training=False)), strict=True))
        for index, quantizer in enumerate(ranges):
            low, high = _batch_range(np.asarray(tensors[quantizer.layer]),
                                     per_channel=len(quantizer.low.shape) == 1)
            total = sums.setdefault(index, [np.zeros_like(low, dtype=np.float64),
                                            np.zeros_like(high, dtype=np.float64)])
            total[0] += low
            total[1] += high
        batches += 1
    for index, quantizer in enumerate(ranges):
        quantizer.low.assign(np.broadcast_to(sums[index][0] / batches, quantizer.low.shape)
                             .astype(np.float32))
        quantizer.high.assign(np.broadcast_to(sums[index][1] / batches, quantizer.high.shape)
                              .astype(np.float32))
    return sorted({r.layer for r in ranges})


def _examples(inputs: Any) -> int:
    """How many examples `inputs` hold: an array's rows, or those of a dict's arrays."""
    return len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)


def _rows(inputs: Any, start: int, stop: int) -> Any:
    """Rows `start` to `stop` of an array, or of each of a dict's arrays (named inputs)."""
    if isinstance(inputs, dict):
        return {name: values[start:stop] for name, values in inputs.items()}
    return inputs[start:stop]


def _single_outputs(float_model: Any, names: set[str]) -> dict[str, Any]:
    """The output tensor of each layer of `float_model` named in `names` that has exactly one."""
    found = {}
    for name in names:
        try:
            output = float_model.get_layer(name).output
        except (AttributeError, ValueError):
            continue
        if not isinstance(output, list | tuple):
            found[name] = output
    return found


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, list | tuple) else [outputs]
