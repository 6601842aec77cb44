"""Batch-norm statistics re-estimated from training images before a model is judged.

A network trained for few steps (a small data set, a short fine-tuning, a model just rebuilt by
channel or depth pruning) carries moving averages of its batch-norm layers that lag far behind
the statistics of its activations: in training mode it is right, in inference mode it can score
near chance. NNCF's BatchNorm adaptation is the cure this follows: run training images through
the model in training mode with the moving averages turned into a plain mean over those images,
then judge it. Before each validation of a training (`ReestimateBatchNorm`, which `fit` adds),
the model is scored on the split the training validates on (the selection split where there is
one) with its moving statistics as they are and as re-estimated, and keeps whichever is better:
the plateau, the best epoch, and every file made from the kept weights see statistics that match
the data.

Models whose layers tensorflow-model-optimization wraps (pruning, clustering, QAT) are
re-estimated too, their batch-norm layers found inside the wrappers; their wrappers keep state
of their own (masks, quantization ranges) that a forward pass in training mode moves, so every
variable but the batch-norm statistics is put back after it. A quantization-aware fine-tuning
needs it most: its few steps move the weights and leave the statistics behind, and its int8
file lost points it kept once re-estimated (docs/measurements.md). A model without batch
normalization is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from tfopt.artifacts import TrainingData

REESTIMATION_IMAGES = 512
"""Training images the statistics are re-estimated from (NNCF's default is a few hundred)."""
REESTIMATION_BATCH = 64
"""Images per forward pass: each pass's statistics weigh the same in the mean."""


def _layers_of(model: Any) -> Iterator[Any]:
    """Every layer under `model`, wrapped ones (``wrapper.layer``) and nested models included."""
    seen: set[int] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        stack.extend(getattr(layer, "layers", None) or [])
        inner = getattr(layer, "layer", None)
        if inner is not None:
            stack.append(inner)


def _is_batch_norm(layer: Any) -> bool:
    return any(cls.__name__ in ("BatchNormalization", "SyncBatchNormalization")
               for cls in type(layer).__mro__)


def _is_wrapped_by_tfmot(layer: Any) -> bool:
    return type(layer).__module__.startswith("tensorflow_model_optimization")


def batch_norm_layers(model: Any) -> list[Any]:
    """The trainable batch-norm layers whose statistics can be re-estimated, wrapped ones too.

    Empty for a model without any, and when a batch-norm layer is frozen (a head trained
    alone keeps them as they came).
    """
    found = [layer for layer in list(_layers_of(model))[1:] if _is_batch_norm(layer)]
    if any(not layer.trainable for layer in found):
        return []
    return found


def reestimate(model: Any, layers: list[Any], images: np.ndarray,
               batch_size: int = REESTIMATION_BATCH) -> None:
    """Set the moving mean and variance of `layers` to their mean over `images`, in place.

    One forward pass per batch in training mode, the k-th with momentum (k - 1) / k: each
    batch's statistics weigh the same, the old moving averages nothing. In a model tfmot
    wraps, every other variable (masks, quantization ranges) is put back afterwards.
    """
    momenta = [layer.momentum for layer in layers]
    others = _wrapper_state(model, layers)
    try:
        for count, start in enumerate(range(0, len(images), batch_size), start=1):
            for layer in layers:
                layer.momentum = (count - 1) / count
            model(images[start:start + batch_size], training=True)
    finally:
        for layer, momentum in zip(layers, momenta, strict=True):
            layer.momentum = momentum
        for variable, value in others:
            variable.assign(value)


def _wrapper_state(model: Any, layers: list[Any]) -> list[tuple[Any, np.ndarray]]:
    """Every variable of a tfmot-wrapped `model` but `layers`' statistics, with its value.

    Trainable ones too: in training mode a pruning wrapper's mask update writes the masked
    kernel back.
    """
    if not any(_is_wrapped_by_tfmot(layer) for layer in _layers_of(model)):
        return []
    statistics = {id(variable) for layer in layers
                  for variable in (layer.moving_mean, layer.moving_variance)}
    return [(variable, variable.numpy()) for variable in model.weights
            if id(variable) not in statistics]


def moving_statistics(layers: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The moving mean and variance of each layer, copied (`restore_statistics` puts them back)."""
    return [(np.array(layer.moving_mean), np.array(layer.moving_variance)) for layer in layers]


def restore_statistics(layers: list[Any], kept: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Set each layer's moving mean and variance back to what `moving_statistics` copied."""
    for layer, (mean, variance) in zip(layers, kept, strict=True):
        layer.moving_mean.assign(mean)
        layer.moving_variance.assign(variance)


def accuracy(model: Any, images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of `model` in inference mode."""
    logits = np.concatenate([np.asarray(model(images[start:start + 256], training=False))
                             for start in range(0, len(images), 256)])
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def reestimated_if_better(model: Any, layers: list[Any], train_images: np.ndarray,
                          val_images: np.ndarray, val_labels: np.ndarray) -> dict[str, float]:
    """Re-estimate the statistics and keep them only if the validation accuracy is not lower.

    Returns:
        ``bn_val_accuracy_before``, ``bn_val_accuracy_after`` and ``bn_reestimated`` (1.0 when
        the re-estimated statistics were kept, else 0.0).
    """
    before = accuracy(model, val_images, val_labels)
    stale = moving_statistics(layers)
    reestimate(model, layers, train_images)
    after = accuracy(model, val_images, val_labels)
    if after < before:
        restore_statistics(layers, stale)
    return {"bn_val_accuracy_before": before, "bn_val_accuracy_after": after,
            "bn_reestimated": float(after >= before)}


def distributed(model: Any) -> bool:
    """Whether several worker processes train `model` (a pass in one misses the others)."""
    strategy = getattr(model, "distribute_strategy", None)
    return strategy is not None and "MultiWorker" in type(strategy).__name__


BN_KEYS = ("bn_reestimated", "bn_val_accuracy_before", "bn_val_accuracy_after")
"""The per-epoch figures of a training whose statistics were re-estimated (its curves)."""


def kept_epoch_figures(curves: dict[str, list[float]], best_epoch: int | None) -> dict[str, float]:
    """The re-estimation's figures at the epoch a training kept (its last when unjudged).

    Empty when the training re-estimated nothing (no batch norm, no validation split).
    """
    if not all(curves.get(key) for key in BN_KEYS):
        return {}
    epoch = -1 if best_epoch is None else best_epoch
    figures = {key: float(curves[key][epoch]) for key in BN_KEYS}
    return {} if any(math.isnan(value) for value in figures.values()) else figures


def _keras_callback_base(model: Any) -> type:
    from tfopt.models.keras_io import keras_of

    return keras_of(model).callbacks.Callback


def reestimating_callback(model: Any, data: TrainingData, target: Any = None) -> Any | None:
    """A Keras callback that re-estimates `target`'s statistics before each validation.

    `target` is the model whose batch norm is judged (the student of a distiller; default
    `model`). None when it has no batch norm to re-estimate or the run has no held-out split.

    The callback scores the split Keras validates on (the selection split where there is one:
    `DatasetArtifact.selection_split`) before and after (`reestimated_if_better`) when
    Keras starts validating, and adds both accuracies and whether the new statistics were kept
    to the epoch's logs (``bn_val_accuracy_before``, ``bn_val_accuracy_after``,
    ``bn_reestimated``), so they land in the training's curves.
    """
    target = model if target is None else target
    layers = batch_norm_layers(target)
    held_out = data.dataset.selection_split
    if not layers or not data.dataset.examples(held_out) or distributed(target):
        return None
    from tfopt.data.pipeline import load_split

    def images() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        train, _ = load_split(data.dataset, "train", REESTIMATION_IMAGES, data.input_scale)
        val, labels = load_split(data.dataset, held_out, scale=data.input_scale)
        return train, val, labels

    class ReestimateBatchNorm(_keras_callback_base(model)):
        """Re-estimates the batch-norm statistics before each validation; see the module."""

        def __init__(self) -> None:
            super().__init__()
            self._images: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
            self._judged: dict[str, float] = {}
            self._validating = False

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self._validating = True

        def on_test_begin(self, logs: dict | None = None) -> None:
            if not self._validating:
                return
            self._validating = False
            if self._images is None:
                self._images = images()
            self._judged = reestimated_if_better(target, layers, *self._images)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            # Every epoch the same keys, so a history file a resumed training appends to keeps
            # its columns (NaN: no validation ran this epoch).
            if logs is not None:
                logs.update({key: self._judged.get(key, math.nan) for key in BN_KEYS})
            self._judged = {}

    return ReestimateBatchNorm()
