"""Quantization-aware training of channel pruning's thinner model: its int8 file trained for.

A thinned network's post-training int8 file can lose what its float model kept: its fewer
filters leave less slack for rounding (EfficientNetB0 with half its filters: within the budget
in fp32, out of it as post-training int8; docs/measurements.md). Fine-tuning the thinner
model with fake quantization, as `techniques.qat` does the baseline, gives the int8 file of the
fastest model the searches found a fine-tuning of its own. It continues from channel pruning's
chosen model, so it runs once that search is done (`compress.planner`).
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from pydantic import Field

from techniques.base import KERAS_ONLY, Technique
from techniques.qat import QatConfig, train_quantization_aware
from tfopt.artifacts import ModelArtifact, TrainingData


class ThinnedQatConfig(QatConfig):
    """Quantization-aware fine-tuning of channel pruning's thinner model, then int8."""

    enabled: bool = Field(
        False, description="Quantization-aware fine-tuning of channel pruning's model (needs "
                           "compress.channel_prune), for an int8 file trained for.")


SOURCE_NAME = "thinned-qat"


@task(name="thinned_qat", tags=["compression"])
def thinned_quantization_aware_train(
    model: ModelArtifact, cfg: ThinnedQatConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Fine-tune a fake-quantized copy of the thinner model and export it as a SavedModel.

    Args:
        model: Channel pruning's model (left unchanged).
        cfg: QAT epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy.
        out_dir: Folder for ``thinned-qat-savedmodel/``.

    Returns:
        The QAT SavedModel (named ``thinned-qat``), with the fake-quantized model's accuracy.
    """
    return train_quantization_aware(
        model, cfg, data, out_dir, source=SOURCE_NAME,
        technique="quantization-aware training of the channel-pruned model")


TECHNIQUE = Technique(
    name="thinned_qat", section=ThinnedQatConfig, accepts=KERAS_ONLY,
    source_name=lambda _: SOURCE_NAME, apply=thinned_quantization_aware_train,
    yields_graph=False, precisions=("int8",), starts_from="channel_prune", reshapes=True,
)
