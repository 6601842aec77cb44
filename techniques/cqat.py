"""Cluster-preserving quantization-aware training (CQAT, or PCQAT) of the clustered model.

tfmot's collaborative optimization: QAT with a scheme that keeps each layer's weights on its
cluster centroids, so the int8 model keeps the clustered model's few distinct values per
channel (plain QAT would spread them again). When the clustering kept a pruned model's zeros
(``compress.cluster.preserve_sparsity``) the scheme keeps them too: PCQAT.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from pydantic import Field

from techniques.base import KERAS_ONLY, Technique
from techniques.qat import QatConfig, train_quantization_aware
from tfopt.artifacts import ModelArtifact, TrainingData


class CqatConfig(QatConfig):
    """Cluster-preserving QAT of the clustered model (tfmot's cluster-preserving scheme)."""

    enabled: bool = Field(
        False, description="Quantization-aware fine-tuning of the clustered model that keeps its "
                           "clusters (needs compress.cluster).")
    learning_rate: float = Field(
        2e-5, gt=0.0, le=1.0,
        description=(
            "Adam learning rate of the CQAT fine-tuning. Lower than QAT's: CQAT trains the "
            "centroids, and one step moves every weight of a cluster (higher rates lost points "
            "on the demo: docs/measurements.md)."
        ),
    )

SOURCE_NAME = "cqat"


@task(name="cluster_preserving_qat", tags=["compression"])
def cluster_preserving_qat(
    model: ModelArtifact, cfg: CqatConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Fine-tune the clustered model with fake-quantization that keeps its clusters.

    Args:
        model: The clustered model (``compress.cluster``'s, left unchanged); if its clustering
            kept a pruned model's zeros, they are kept too (PCQAT).
        cfg: Epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy.
        out_dir: Folder for ``cqat-savedmodel/``.

    Returns:
        The CQAT SavedModel, with its test accuracy. Once converted, `compress_model` reads
        its int8 file back: each kernel's most distinct values per output channel
        (``int8_values_per_channel.<layer>``) and sparsity join its metrics.
    """
    preserve_sparsity = bool(model.params.get("preserve_sparsity", False))

    def scheme() -> object:
        import tensorflow_model_optimization as tfmot

        return tfmot.experimental.combine.Default8BitClusterPreserveQuantizeScheme(
            preserve_sparsity=preserve_sparsity)

    return train_quantization_aware(
        model, cfg, data, out_dir, source=SOURCE_NAME, scheme=scheme,
        scheme_name=("Default8BitClusterPreserveQuantizeScheme(preserve_sparsity=True)"
                     if preserve_sparsity else "Default8BitClusterPreserveQuantizeScheme"),
        technique=("PCQAT: sparsity- and cluster-preserving quantization-aware training"
                   if preserve_sparsity else "cluster-preserving quantization-aware training"))


TECHNIQUE = Technique(
    name="cqat", section=CqatConfig, accepts=KERAS_ONLY, source_name=lambda _: SOURCE_NAME,
    apply=cluster_preserving_qat, yields_graph=False, precisions=("int8",), starts_from="cluster",
    on_arrays=True,
)
