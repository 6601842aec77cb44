"""Pruning-preserving quantization-aware training (PQAT) of the pruned model.

tfmot's collaborative optimization: QAT with a scheme that keeps the pruned weights at zero, so
the int8 model is as sparse as the pruned one (plain QAT would refill the zeros).
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from pydantic import Field

from techniques.base import KERAS_ONLY, Technique
from techniques.qat import QatConfig, train_quantization_aware
from tfopt.artifacts import ModelArtifact, TrainingData


class PqatConfig(QatConfig):
    """Pruning-preserving QAT of the pruned model (``Default8BitPrunePreserveQuantizeScheme``)."""

    enabled: bool = Field(
        False, description="Quantization-aware fine-tuning of the pruned model that keeps its "
                           "zeros (needs compress.prune).")

SOURCE_NAME = "pqat"


def _scheme() -> object:
    import tensorflow_model_optimization as tfmot

    return tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme()


@task(name="prune_preserving_qat", tags=["compression"])
def prune_preserving_qat(
    model: ModelArtifact, cfg: PqatConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Fine-tune the pruned model with fake-quantization that keeps its zeros.

    Args:
        model: The pruned model (``compress.prune``'s, left unchanged).
        cfg: Epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy.
        out_dir: Folder for ``pqat-savedmodel/``.

    Returns:
        The PQAT SavedModel, with its test accuracy. Once converted, `compress_model` reads
        its int8 file back: each kernel's sparsity (``int8_sparsity.<layer>``) joins its
        metrics.
    """
    return train_quantization_aware(
        model, cfg, data, out_dir, source=SOURCE_NAME, scheme=_scheme,
        scheme_name="Default8BitPrunePreserveQuantizeScheme",
        technique="pruning-preserving quantization-aware training")


TECHNIQUE = Technique(
    name="pqat", section=PqatConfig, accepts=KERAS_ONLY, source_name=lambda _: SOURCE_NAME,
    apply=prune_preserving_qat, yields_graph=False, precisions=("int8",), starts_from="prune",
    on_arrays=True,
)
