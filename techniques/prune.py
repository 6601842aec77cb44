"""Magnitude pruning with tensorflow-model-optimization: prune, fine-tune, strip."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tf_keras as keras
from prefect import task
from pydantic import Field

from techniques.base import (
    KERAS_ONLY,
    LABELS,
    NotApplicable,
    Technique,
    TechniqueSection,
    Tuning,
    kernels,
    resolved,
    tfmot_model,
    tuning_of,
)
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.fileio import gzip_size_bytes
from tfopt.logs import step_logger
from tfopt.models.keras_io import copy_model, is_layer_graph, keras_model_path, save_keras_model
from tfopt.models.training import (
    Fitted,
    KeepBestWeights,
    fit,
    recovery,
    steps_per_epoch,
)
from tfopt.search import Knob


class PruneConfig(TechniqueSection):
    """Magnitude pruning (tfmot ``prune_low_magnitude``), fine-tuning, then stripping."""

    target_sparsity: Annotated[float, Field(ge=0.05, le=0.95)] | Literal["auto"] = Field(
        0.8,
        description="Share of prunable weights set to zero; auto: the strongest share whose "
                    "fine-tuned model stays within the accuracy budget, searched among 50% to "
                    "95% (tfopt.search).",
    )
    structured_2_4: bool = Field(
        False,
        description="Prune 2 of every 4 weights (2:4 structured sparsity, 50%) instead of "
                    "ramping to target_sparsity.",
    )
    policy: Literal["all", "xnnpack_latency"] = Field(
        "all",
        description=(
            "Which layers to prune: all (every layer tfmot can prune) or xnnpack_latency "
            "(tfmot's PruneForLatencyOnXNNPack: only the 1x1 convolutions XNNPACK's sparse "
            "kernels run, on models laid out as XNNPACK's sparse inference needs: a "
            "ZeroPadding2D + 3x3 stride-2 VALID Conv2D on the 3-channel input, a "
            "GlobalAveragePooling2D(keepdims=True) at the end; other models are skipped with "
            "tfmot's reason)."
        ),
    )
    epochs: int = Field(
        10, ge=1, le=1000,
        description="Fine-tuning epochs while pruning (fewer when the time budget holds "
                    "fewer): the ramp to the target takes the first 70%; the best validation "
                    "epoch after it is kept.")
    learning_rate: float = Field(
        5e-4, gt=0.0, le=1.0, description="Adam learning rate of the pruning fine-tuning."
    )

_TWO_OF_FOUR = 0.5


def pruned_name(cfg: PruneConfig) -> str:
    """``pruned-<percent>`` (e.g. ``pruned-80``), or ``pruned-2of4`` for 2:4 sparsity.

    The latency-aware policy adds ``-xnnpack`` (``pruned-80-xnnpack``).
    """
    if cfg.structured_2_4:
        name = "pruned-2of4"
    elif cfg.target_sparsity == "auto":
        name = "pruned-auto"
    else:
        name = f"pruned-{round(cfg.target_sparsity * 100)}"
    return f"{name}-xnnpack" if cfg.policy == "xnnpack_latency" else name


def effective_sparsity(cfg: PruneConfig) -> float:
    """The sparsity the settings aim at: 0.5 for 2:4, else the target."""
    return _TWO_OF_FOUR if cfg.structured_2_4 else cfg.target_sparsity


def pruning_params(cfg: PruneConfig, total_steps: int) -> dict:
    """Tfmot's pruning arguments: a polynomial ramp to the target, or constant 2:4 sparsity.

    The ramp ends at 70% of the fine-tuning steps, so the last steps recover accuracy at the
    final sparsity.
    """
    import tensorflow_model_optimization as tfmot

    sparsity = tfmot.sparsity.keras
    frequency = max(1, total_steps // 20)
    if cfg.structured_2_4:
        return {
            "pruning_schedule": sparsity.ConstantSparsity(_TWO_OF_FOUR, begin_step=0,
                                                          frequency=frequency),
            "sparsity_m_by_n": (2, 4),
        }
    return {
        "pruning_schedule": sparsity.PolynomialDecay(
            initial_sparsity=0.0, final_sparsity=cfg.target_sparsity, begin_step=0,
            end_step=ramp_end_step(cfg, total_steps), frequency=frequency,
        )
    }


def ramp_end_step(cfg: PruneConfig, total_steps: int) -> int:
    """The step at which the sparsity reaches its target (0 for 2:4, which starts there)."""
    return 0 if cfg.structured_2_4 else max(1, int(total_steps * 0.7))


def first_sparse_epoch(cfg: PruneConfig, per_epoch: int, epochs: int) -> int:
    """The first (0-based) epoch that ends at the target sparsity: the first candidate to keep."""
    end = ramp_end_step(cfg, per_epoch * epochs)
    return min(epochs - 1, max(0, math.ceil(end / per_epoch) - 1))


def kernel_sparsity(model: keras.Model) -> dict[str, float]:
    """Share of zero weights in each layer's kernel."""
    return {name: float(np.mean(values == 0.0)) for name, values in kernels(model)}


def overall_sparsity(model: keras.Model) -> float:
    """Share of zero weights over all kernels together."""
    sizes = [(int(np.sum(values == 0.0)), values.size) for _, values in kernels(model)]
    total = sum(size for _, size in sizes)
    return sum(zeros for zeros, _ in sizes) / total if total else 0.0


def wrap_for_xnnpack(model: keras.Model, params: dict) -> keras.Model:
    """`model` wrapped by tfmot's `PruneForLatencyOnXNNPack` policy (its 1x1 convolutions only).

    Raises:
        NotApplicable: The model is not laid out as the policy requires (tfmot's reason).
    """
    import tensorflow_model_optimization as tfmot

    sparsity = tfmot.sparsity.keras
    try:
        return sparsity.prune_low_magnitude(
            model, pruning_policy=sparsity.PruneForLatencyOnXNNPack(), **params)
    except ValueError as error:
        raise NotApplicable(f"PruneForLatencyOnXNNPack refuses {model.name}: {error}") from error


def wrap_prunable_layers(model: keras.Model, params: dict) -> keras.Model:
    """`model` with tfmot's pruning wrapper around every layer that has prunable weights.

    Other layers (TensorFlow ops called as layers, rescaling, custom layers) stay as they
    are, as tfmot's guide does to prune part of a model, so any tf_keras functional or
    sequential model can be pruned; the wrapped layers share `model`'s variables.

    Raises:
        NotApplicable: A subclassed model (its layers are not a graph tfmot can rebuild), or
            no layer of the model can be pruned.
    """
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import (
        PruneRegistry,
    )

    def prunable(layer: keras.layers.Layer) -> bool:
        return bool(layer.trainable_weights) and (
            PruneRegistry.supports(layer)
            or isinstance(layer, tfmot.sparsity.keras.PrunableLayer))

    if not is_layer_graph(model):
        raise NotApplicable(f"{model.name} is a subclassed model; tfmot rebuilds functional and "
                            "sequential models only")
    if not any(prunable(layer) for layer in model.layers):
        raise NotApplicable(f"{model.name} has no layer tfmot can prune")
    return keras.models.clone_model(
        model, clone_function=lambda layer: (
            tfmot.sparsity.keras.prune_low_magnitude(layer, **params) if prunable(layer)
            else layer))


def prune_and_finetune(
    base: keras.Model, cfg: PruneConfig, data: TrainingData, tuning: Tuning = LABELS,
) -> tuple[keras.Model, Fitted]:
    """Wrap a copy of `base` for pruning and fine-tune it; `base` itself is not changed.

    It learns as `tuning` says: from labels, or a model of array data's own loss and ``y`` or
    the baseline's outputs.

    Returns:
        The pruned model, still wrapped (call `strip_pruning` to export it), and its training.
    """
    import tensorflow_model_optimization as tfmot

    per_epoch = steps_per_epoch(data)
    total_steps = per_epoch * cfg.epochs
    wrap = wrap_for_xnnpack if cfg.policy == "xnnpack_latency" else wrap_prunable_layers
    pruned = wrap(copy_model(base), pruning_params(cfg, total_steps))
    sparse_from = first_sparse_epoch(cfg, per_epoch, cfg.epochs)
    fitted = fit(pruned, data, epochs=cfg.epochs, learning_rate=cfg.learning_rate,
                 callbacks=[tfmot.sparsity.keras.UpdatePruningStep(),
                            *recovery(data, from_epoch=sparse_from)],
                 best=KeepBestWeights(from_epoch=sparse_from, monitor=data.held_out_key()),
                 loss=tuning.loss, teacher=tuning.teacher)
    return pruned, fitted


@task(name="prune_model", tags=["compression"])
def prune_model(
    model: ModelArtifact, cfg: PruneConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Prune a trained model to the target sparsity, fine-tune it, and strip the wrappers.

    A model of array data (its `ModelArtifact.keras_file`) learns with its own loss from the
    data's ``y``, or the baseline's own outputs without (`techniques.base.tuning_of`), judged
    by the run's metric; it becomes a SavedModel of its own signature.

    Args:
        model: The trained Keras model (left unchanged).
        cfg: Target sparsity (or 2:4), which layers (all, or XNNPACK's sparse 1x1
            convolutions), fine-tuning epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy
            (array data: the run's metric, ``test_<metric>``).
        out_dir: Folder for ``pruned-<percent>.keras`` (and its SavedModel for array data).

    Returns:
        The stripped, pruned model with its sparsity per layer, overall sparsity, test
        accuracy and gzip size as metrics.

    Raises:
        NotApplicable: The model cannot be pruned as asked (subclassed, nothing prunable, or
            not laid out for the XNNPACK policy; array data with ``y`` and no loss known); the
            step is skipped with the reason.
    """
    import tensorflow_model_optimization as tfmot

    logger = step_logger()
    if not cfg.structured_2_4:
        resolved(cfg, KNOB)
    keras.utils.set_random_seed(data.seed)
    name = pruned_name(cfg)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, name)  # base stays as it is: a copy is pruned
    pruned, fitted = prune_and_finetune(base, cfg, data, tuning)
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    path = keras_model_path(out_dir, name)
    save_keras_model(stripped, path)
    per_layer = kernel_sparsity(stripped)
    overall = overall_sparsity(stripped)
    logger.info("%s: overall kernel sparsity %.3f (target %.2f); per layer %s", name, overall,
                effective_sparsity(cfg), {k: round(v, 3) for k, v in per_layer.items()})
    params = {"technique": "pruning", "target_sparsity": effective_sparsity(cfg),
              "pattern": "2:4" if cfg.structured_2_4 else "unstructured", "policy": cfg.policy,
              "epochs": cfg.epochs, "learning_rate": cfg.learning_rate}
    metrics = {"sparsity": overall,
               **{f"sparsity.{layer}": value for layer, value in per_layer.items()},
               "keras_gzip_bytes": float(gzip_size_bytes(path))}
    return tuning.variant(model, stripped, name, path, out_dir, fitted, data, params=params,
                          metrics=metrics, translation=translation)


# int8 stays dense: with EXPERIMENTAL_SPARSITY the int8 file fails to load under XNNPACK here
# ("failed to delegate FULLY_CONNECTED", TF 2.21 / ai-edge-litert 2.3).
KNOB = Knob("target_sparsity", (0.5, 0.6, 0.7, 0.8, 0.9, 0.95), unit="%")
"""What ``target_sparsity: auto`` searches, weakest first."""

TECHNIQUE = Technique(
    name="prune", section=PruneConfig, accepts=KERAS_ONLY, source_name=pruned_name,
    apply=prune_model, sparse_tflite=True, knob=KNOB, on_arrays=True,
)
