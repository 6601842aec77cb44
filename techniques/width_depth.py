"""Width and depth together: residual blocks removed and filters thinned on one model.

Channel pruning's share of filters and depth pruning's share of residual blocks compose on one
network, and each changes what the other costs: searched one after the other (depth pruning's
``after_channel_prune``), the width is fixed before the depth is known. Here one trial makes
both cuts at once (the blocks first, ranked on the trained network as `techniques.depth_prune`
ranks them, then the filters of what is left, as `techniques.channel_prune` thins them) and
fine-tunes the result once; with both strengths ``auto`` an Optuna sampler chooses the points
of a two-objective study (`tfopt.search.samplers.JointSampler`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import tf_keras as keras
from prefect import task
from pydantic import Field, model_validator

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
from techniques.channel_prune import KNOB as WIDTH
from techniques.depth_prune import KNOB as DEPTH
from techniques.depth_prune import blocks_cut
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.models.channel_pruning import ChannelPruningError, thin_model
from tfopt.models.flops import keras_flops
from tfopt.models.keras_io import keras_model_path, save_keras_model
from tfopt.search import Joint


class WidthDepthConfig(RebuiltSection):
    """Width and depth: residual blocks removed and filters thinned together, fine-tuned once."""

    enabled: bool = Field(
        False,
        description="Remove residual blocks and thin the remaining layers' filters in one "
                    "model, fine-tuned once.")
    fraction: Annotated[float, Field(ge=0.05, le=0.9)] | Literal["auto"] = Field(
        "auto",
        description="Share of each channel group's filters to remove (as "
                    "compress.channel_prune.fraction); auto with share auto: both searched "
                    "together by an Optuna sampler (tfopt.search.samplers.JointSampler).")
    share: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["auto"] = Field(
        "auto",
        description="Share of the removable residual blocks to remove, the least influential "
                    "first (as compress.depth_prune.share); auto with fraction auto: searched "
                    "together.")
    min_channels: int = Field(8, ge=1, le=4096, description="The fewest channels a group keeps.")

    @model_validator(mode="after")
    def _searched_together(self) -> WidthDepthConfig:
        if (self.fraction == "auto") != (self.share == "auto"):
            raise ValueError("fraction and share are searched together: set both to auto, or "
                             "both to a value")
        return self


KNOB = Joint((WIDTH, DEPTH))
"""What ``fraction: auto`` with ``share: auto`` searches: channel pruning's candidates by depth
pruning's, sampled as one two-objective study."""


def width_depth_name(cfg: WidthDepthConfig) -> str:
    """``width-<percent of filters removed>-depth-<percent of blocks removed>``."""
    if cfg.fraction == "auto" or cfg.share == "auto":
        return "width-depth-auto"
    return f"width-{round(cfg.fraction * 100)}-depth-{round(cfg.share * 100)}"


@task(name="width_depth_model", tags=["compression"])
def width_depth_model(
    model: ModelArtifact, cfg: WidthDepthConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Remove `cfg.share` of the residual blocks, thin `cfg.fraction` of the filters, fine-tune.

    Args:
        model: The trained Keras model (left unchanged).
        cfg: Both strengths, the fewest channels kept, fine-tuning epochs and rate.
        data: The run's training data; its training split ranks the blocks, its test split
            measures accuracy.
        out_dir: Folder for ``width-<percent>-depth-<percent>.keras``.

    Returns:
        The smaller model, with the blocks removed, FLOPs and parameters before and after,
        and its test accuracy before and after fine-tuning.

    Raises:
        NotApplicable: Not a functional model, a shared layer, no removable residual block or
            no channel that can be removed.
    """
    resolved(cfg, KNOB)
    keras.utils.set_random_seed(data.seed)
    name = width_depth_name(cfg)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, name)
    shallower = blocks_cut(base, cfg.share, data)
    try:
        thinned = thin_model(shallower.model, cfg.fraction, cfg.min_channels)
    except ChannelPruningError as error:
        raise NotApplicable(str(error)) from error
    before, after = keras_flops(base), keras_flops(thinned.model)
    step_logger().info(
        "%s: %d of %d residual blocks removed (%s), %d convolution/dense layers thinned; "
        "FLOPs %.3g -> %.3g", name, len(shallower.removed), shallower.blocks,
        ", ".join(shallower.removed), len(thinned.kept), before, after)
    before_tuning = tuning.test_figures(thinned.model, data, BEFORE_TUNING)
    fitted = fine_tune_rebuilt(thinned.model, cfg, data, base, tuning)
    path = keras_model_path(out_dir, name)
    save_keras_model(thinned.model, path)
    return tuning.variant(
        model, thinned.model, name, path, out_dir, fitted, data,
        params={"technique": "width and depth pruning", "fraction": cfg.fraction,
                "share": cfg.share, "min_channels": cfg.min_channels,
                **cfg.fine_tuning_params(),
                "removed_blocks": ",".join(shallower.removed)[:5000]},
        translation=translation,
        metrics={
            "blocks_removed": float(len(shallower.removed)),
            "blocks_removable": float(shallower.blocks),
            **rebuilt_metrics(base, thinned.model, (before, after), before_tuning),
        },
    )


TECHNIQUE = Technique(
    name="width_depth", section=WidthDepthConfig, accepts=KERAS_ONLY,
    source_name=width_depth_name, apply=width_depth_model, knob=KNOB, reshapes=True,
    on_arrays=True,
)
