"""Structured (channel) pruning: remove whole filters, rebuild a thinner model, fine-tune it.

Weight pruning (``compress.prune``) buys zipped size; no runtime here turns its zeros into
time. Removing filters makes every tensor thinner, so every runtime does less work
(`tfopt.models.channel_pruning`).
"""

from __future__ import annotations

import json
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
from tfopt.models.channel_pruning import SEARCHED_SHARES, ChannelPruningError, thin_model
from tfopt.models.flops import keras_flops
from tfopt.models.keras_io import keras_model_path, save_keras_model
from tfopt.search import Knob

CRITERION = "|batch-norm scale| x filter L1 norm (Network Slimming, Li et al.)"


class ChannelPruneConfig(RebuiltSection):
    """Channel pruning: the least important filters of each channel group removed, fine-tuned."""

    enabled: bool = Field(
        False,
        description="Remove whole filters from the baseline and fine-tune the thinner model.")
    fraction: Annotated[float, Field(ge=0.05, le=0.9)] | Literal["auto"] = Field(
        0.5,
        description="Share of each channel group's filters to remove (a residual add's inputs "
                    "and a depthwise convolution's input are one group); auto: the fastest "
                    "share whose fine-tuned model stays within the accuracy budget, searched "
                    "among 25% to 87.5% (tfopt.search).")
    min_channels: int = Field(
        8, ge=1, le=4096, description="The fewest channels a group keeps.")


KNOB = Knob("fraction", SEARCHED_SHARES, unit="%", first=0.75)
"""What ``fraction: auto`` searches, weakest first; when the time left holds fewer rounds than a
bisection takes (`tfopt.search.Search.starts_at_first`), its first trial removes 75% of the
filters, where production-size networks most often kept the budget (docs/measurements.md): from
the middle (50%) a bisection needs a second trial to reach it."""


def channels_name(cfg: ChannelPruneConfig) -> str:
    """``channels-<percent removed>`` (e.g. ``channels-50``; ``channels-auto`` before a search)."""
    return "channels-auto" if cfg.fraction == "auto" else f"channels-{round(cfg.fraction * 100)}"


@task(name="channel_prune_model", tags=["compression"])
def channel_prune_model(
    model: ModelArtifact, cfg: ChannelPruneConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Remove `cfg.fraction` of each channel group's filters and fine-tune the thinner model.

    A model of array data (its `ModelArtifact.keras_file`) is fine-tuned with its own loss, or
    against the baseline's outputs without ``y`` (`techniques.base.tuning_of`), judged by the
    run's metric; it becomes a SavedModel of its own signature.

    Args:
        model: The trained Keras model (left unchanged).
        cfg: The share of filters removed, the fewest kept, fine-tuning epochs and rate.
        data: The run's training data and input settings; the test split measures accuracy
            (array data: the run's metric).
        out_dir: Folder for ``channels-<percent>.keras`` (and its SavedModel for array data).

    Returns:
        The thinner model, with FLOPs and parameters before and after, the filters kept per
        layer and its test figure before and after fine-tuning.

    Raises:
        NotApplicable: Not a functional model, a shared layer, or no channel that can be
            removed (the layers in the way are named); array data with ``y`` and no loss
            known; the step is skipped with the reason.
    """
    logger = step_logger()
    resolved(cfg, KNOB)
    keras.utils.set_random_seed(data.seed)
    name = channels_name(cfg)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, name)
    try:
        thinned = thin_model(base, cfg.fraction, cfg.min_channels)
    except ChannelPruningError as error:
        raise NotApplicable(str(error)) from error
    before, after = keras_flops(base), keras_flops(thinned.model)
    params_before, params_after = base.count_params(), thinned.model.count_params()
    logger.info("%s: %d of %d convolution/dense layers thinned; FLOPs %.3g -> %.3g (%.2fx), "
                "parameters %d -> %d", name, len(thinned.kept),
                len(thinned.kept) + len(thinned.frozen), before, after,
                before / after if after else float("nan"), params_before, params_after)
    before_tuning = tuning.test_figures(thinned.model, data, BEFORE_TUNING)
    fitted = fine_tune_rebuilt(thinned.model, cfg, data, base, tuning)
    path = keras_model_path(out_dir, name)
    save_keras_model(thinned.model, path)
    return tuning.variant(
        model, thinned.model, name, path, out_dir, fitted, data,
        params={"technique": "channel pruning", "fraction": cfg.fraction,
                "criterion": CRITERION, "min_channels": cfg.min_channels,
                **cfg.fine_tuning_params(),
                "kept_filters": json.dumps({k: v[0] for k, v in thinned.kept.items()})[:5000],
                "unpruned_layers": ";".join(sorted(thinned.frozen))[:5000]},
        translation=translation,
        metrics=rebuilt_metrics(base, thinned.model, (before, after), before_tuning),
    )


TECHNIQUE = Technique(
    name="channel_prune", section=ChannelPruneConfig, accepts=KERAS_ONLY,
    source_name=channels_name, apply=channel_prune_model, knob=KNOB, reshapes=True,
    on_arrays=True,
)
