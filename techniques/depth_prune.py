"""Depth pruning: remove whole residual blocks, rebuild a shallower model, fine-tune it.

Channel pruning makes every layer thinner; where a network's time goes to its number of layers
(EfficientNetB0 at 64 px), removing residual blocks buys what thinning cannot
(`tfopt.models.depth_pruning`). It starts from the baseline, or from channel pruning's model
(``after_channel_prune``: width, then depth).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import tf_keras as keras
from prefect import task
from pydantic import Field

from techniques.base import (
    BEFORE_TUNING,
    KERAS_ONLY,
    NotApplicable,
    RebuiltSection,
    Technique,
    fine_tune_rebuilt,
    rebuilt_metrics,
    resolved,
    tfmot_model,
    tuning_of,
)
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.models.depth_pruning import (
    DEPTH_SHARES,
    INFLUENCE_IMAGES,
    DepthPruningError,
    ShallowerModel,
    shallower_model,
)
from tfopt.models.flops import keras_flops
from tfopt.models.keras_io import keras_model_path, save_keras_model
from tfopt.search import Knob

CRITERION = "block influence: 1 - cos(block input, block output) on training images (ShortGPT)"


def blocks_cut(model: keras.Model, share: float, data: TrainingData,
               why: str = "") -> ShallowerModel:
    """`model` without `share` of its residual blocks, ranked on the run's training examples.

    Its training images, or a model of array data's inputs (one array, or named arrays).

    Raises:
        NotApplicable: The model cannot be traced or has no removable residual block (`why`
            leads the reason).
    """
    from tfopt.data.pipeline import load_split
    from tfopt.models.training import split_inputs

    if data.dataset.arrays:
        examples, _ = split_inputs(data.dataset, "train", limit=INFLUENCE_IMAGES)
    else:
        examples, _ = load_split(data.dataset, "train", INFLUENCE_IMAGES, scale=data.input_scale)
    try:
        return shallower_model(model, share, examples)
    except DepthPruningError as error:
        raise NotApplicable(f"{why}{error}") from error


class DepthPruneConfig(RebuiltSection):
    """Depth pruning: the least influential residual blocks removed, fine-tuned."""

    enabled: bool = Field(
        False,
        description="Remove whole residual blocks (an Add whose one input feeds the other) "
                    "and fine-tune the shallower model.")
    share: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["auto"] = Field(
        0.5,
        description="Share of the model's removable residual blocks to remove, the least "
                    "influential first; auto: the fastest share whose fine-tuned model stays "
                    "within the accuracy budget, searched among 25% to 100% (tfopt.search).")
    after_channel_prune: bool = Field(
        False,
        description="Start from channel pruning's model (compress.channel_prune enabled): "
                    "width, then depth. Else from the baseline.")


KNOB = Knob("share", DEPTH_SHARES, unit="%", first=DEPTH_SHARES[-1])
"""What ``share: auto`` searches, weakest first; its first trial removes every removable block.
Depth's accuracy is not monotonic in the share (every block removed can recover where a part
does not: docs/measurements.md), and a bisection from the middle never tries 100%."""


def depth_name(cfg: DepthPruneConfig) -> str:
    """``depth-<percent of blocks removed>`` (``depth-auto`` before a search)."""
    return "depth-auto" if cfg.share == "auto" else f"depth-{round(cfg.share * 100)}"


def _start(cfg: DepthPruneConfig) -> str | None:
    return "channel_prune" if cfg.after_channel_prune else None


@task(name="depth_prune_model", tags=["compression"])
def depth_prune_model(
    model: ModelArtifact, cfg: DepthPruneConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Remove `cfg.share` of the model's residual blocks and fine-tune the shallower model.

    Args:
        model: The trained Keras model (left unchanged): the baseline, or channel pruning's.
        cfg: The share of blocks removed, fine-tuning epochs and rate.
        data: The run's training data; its training split ranks the blocks, its test split
            measures accuracy.
        out_dir: Folder for ``depth-<percent>.keras``.

    Returns:
        The shallower model, with the blocks removed, FLOPs and parameters before and after,
        and its test accuracy before and after fine-tuning.

    Raises:
        NotApplicable: Not a functional model, a shared layer, or no removable residual block.
    """
    logger = step_logger()
    resolved(cfg, KNOB)
    keras.utils.set_random_seed(data.seed)
    name = depth_name(cfg)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, name)
    shallower = blocks_cut(base, cfg.share, data)
    before, after = keras_flops(base), keras_flops(shallower.model)
    logger.info("%s: %d of %d residual blocks removed (%s); layers %d -> %d, FLOPs %.3g -> %.3g",
                name, len(shallower.removed), shallower.blocks, ", ".join(shallower.removed),
                len(base.layers), len(shallower.model.layers), before, after)
    before_tuning = tuning.test_figures(shallower.model, data, BEFORE_TUNING)
    fitted = fine_tune_rebuilt(shallower.model, cfg, data, base, tuning)
    path = keras_model_path(out_dir, name)
    save_keras_model(shallower.model, path)
    return tuning.variant(
        model, shallower.model, name, path, out_dir, fitted, data,
        params={"technique": "depth pruning", "share": cfg.share, "criterion": CRITERION,
                "starts_from": model.name, **cfg.fine_tuning_params(),
                "removed_blocks": ",".join(shallower.removed)[:5000]},
        translation=translation,
        metrics={
            "blocks_removed": float(len(shallower.removed)),
            "blocks_removable": float(shallower.blocks),
            "layers_before": float(len(base.layers)),
            "layers_after": float(len(shallower.model.layers)),
            **rebuilt_metrics(base, shallower.model, (before, after), before_tuning),
        },
    )


TECHNIQUE = Technique(
    name="depth_prune", section=DepthPruneConfig, accepts=KERAS_ONLY, source_name=depth_name,
    apply=depth_prune_model, knob=KNOB, starts_from=_start, reshapes=True, on_arrays=True,
)
