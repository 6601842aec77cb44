"""Weight clustering with tensorflow-model-optimization: cluster, fine-tune, strip.

Each clustered layer's weights take one of `clusters` shared values (k-means++ initial
centroids, fine-tuned): the file shrinks once zipped (few distinct values compress well) and its
int8 form keeps them. A layer with no more weights than clusters gains nothing and is left as
it is, by name in the model's parameters.
"""

from __future__ import annotations

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
from techniques.prune import overall_sparsity
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.fileio import gzip_size_bytes
from tfopt.logs import step_logger
from tfopt.models.keras_io import copy_model, is_layer_graph, keras_model_path, save_keras_model
from tfopt.models.training import Fitted, fit, recovery
from tfopt.search import Knob


class ClusterConfig(TechniqueSection):
    """Weight clustering (tfmot ``cluster_weights``, k-means++ centroids), fine-tune, strip."""

    enabled: bool = Field(
        False, description="Cluster the baseline's weights (off unless asked: it adds a model).")
    clusters: Annotated[int, Field(ge=2, le=256)] | Literal["auto"] = Field(
        16,
        description="Distinct values per clustered layer's weights (16: 4-bit indices); auto: "
                    "the fewest (of 32, 16, 12, 8, 6, 4) whose fine-tuned model stays within the "
                    "accuracy budget (tfopt.search).")
    preserve_sparsity: bool = Field(
        False,
        description=(
            "Cluster the pruned model (compress.prune) and keep its zeros (tfmot's "
            "sparsity-preserving clustering): pruned-clustered-<clusters>; compress.cqat on it "
            "is then PCQAT."
        ),
    )
    epochs: int = Field(3, ge=1, le=1000, description="Fine-tuning epochs of the centroids.")
    learning_rate: float = Field(
        2e-4, gt=0.0, le=1.0, description="Adam learning rate of the clustering fine-tuning."
    )


KNOB = Knob("clusters", (32, 16, 12, 8, 6, 4))
"""What ``clusters: auto`` searches, weakest first."""


def clustered_name(cfg: ClusterConfig) -> str:
    """``clustered-<clusters>``, or ``pruned-clustered-<clusters>`` keeping the zeros."""
    return f"{'pruned-' if cfg.preserve_sparsity else ''}clustered-{cfg.clusters}"


def clusterable_layers(model: keras.Model, clusters: int) -> tuple[list[str], list[str]]:
    """The layers tfmot can cluster that have more weights than `clusters`, and those too small.

    Raises:
        NotApplicable: A subclassed model, or no layer worth clustering.
    """
    from tensorflow_model_optimization.python.core.clustering.keras.clustering_registry import (
        ClusteringRegistry,
    )

    if not is_layer_graph(model):
        raise NotApplicable(f"{model.name} is a subclassed model; tfmot rebuilds functional and "
                            "sequential models only")
    sizes = dict(kernels(model))
    candidates = [layer.name for layer in model.layers
                  if layer.name in sizes and ClusteringRegistry.supports(layer)]
    worth = [name for name in candidates if sizes[name].size > clusters]
    too_small = [name for name in candidates if name not in worth]
    if not worth:
        raise NotApplicable(
            f"no layer of {model.name} has more than {clusters} weights to cluster"
            + (f" ({', '.join(too_small)} have at most that many)" if too_small else ""))
    return worth, too_small


def unique_values(model: keras.Model) -> dict[str, int]:
    """Distinct values in each layer's kernel."""
    return {name: int(np.unique(values).size) for name, values in kernels(model)}


def cluster_and_finetune(
    base: keras.Model, cfg: ClusterConfig, data: TrainingData, tuning: Tuning = LABELS,
) -> tuple[keras.Model, Fitted, list[str]]:
    """Wrap a copy of `base` for clustering and fine-tune it; `base` itself is not changed.

    It learns as `tuning` says: from labels, or a model of array data's own loss and ``y`` or
    the baseline's outputs.

    Returns:
        The clustered model (still wrapped: `strip_clustering` exports it), its training, and
        the layers left unclustered because they have no more weights than clusters.
    """
    import tensorflow_model_optimization as tfmot

    clustering = tfmot.clustering.keras
    worth, too_small = clusterable_layers(base, cfg.clusters)
    params = {"number_of_clusters": cfg.clusters,
              "cluster_centroids_init": clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
              "preserve_sparsity": cfg.preserve_sparsity}
    clustered = keras.models.clone_model(
        copy_model(base), clone_function=lambda layer: (
            clustering.cluster_weights(layer, **params) if layer.name in worth else layer))
    fitted = fit(clustered, data, epochs=cfg.epochs, learning_rate=cfg.learning_rate,
                 callbacks=recovery(data), loss=tuning.loss, teacher=tuning.teacher)
    return clustered, fitted, too_small


@task(name="cluster_model", tags=["compression"])
def cluster_model(
    model: ModelArtifact, cfg: ClusterConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Cluster a trained model's weights, fine-tune the centroids, and strip the wrappers.

    A model of array data (its `ModelArtifact.keras_file`) learns with its own loss, or the
    baseline's outputs without ``y`` (`techniques.base.tuning_of`), judged by the run's metric;
    it becomes a SavedModel of its own signature.

    Args:
        model: The trained Keras model (left unchanged).
        cfg: Clusters per layer, fine-tuning epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy.
        out_dir: Folder for ``clustered-<clusters>.keras``.

    Returns:
        The stripped, clustered model with each layer's distinct weight values, test accuracy
        and gzip size as metrics.

    Raises:
        RuntimeError: A clustered layer came out with more distinct values than clusters.
    """
    import tensorflow_model_optimization as tfmot

    logger = step_logger()
    resolved(cfg, KNOB)
    keras.utils.set_random_seed(data.seed)
    name = clustered_name(cfg)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, name)
    clustered, fitted, too_small = cluster_and_finetune(base, cfg, data, tuning)
    stripped = tfmot.clustering.keras.strip_clustering(clustered)
    distinct = unique_values(stripped)
    allowed = cfg.clusters + int(cfg.preserve_sparsity)  # the kept zeros are one more value
    over = {layer: count for layer, count in distinct.items()
            if layer not in too_small and count > allowed}
    if over:
        kept = " and zero" if cfg.preserve_sparsity else ""
        raise RuntimeError(f"{name}: layers with more distinct weights than {allowed} "
                           f"({cfg.clusters} clusters{kept}) after stripping: {over}")
    path = keras_model_path(out_dir, name)
    save_keras_model(stripped, path)
    logger.info("%s: distinct kernel values per layer %s%s", name, distinct,
                f"; left as they are (no more weights than clusters): {too_small}"
                if too_small else "")
    return tuning.variant(
        model, stripped, name, path, out_dir, fitted, data,
        params={"technique": "weight clustering", "clusters": cfg.clusters,
                "centroids": "kmeans++", "epochs": cfg.epochs,
                "learning_rate": cfg.learning_rate, "preserve_sparsity": cfg.preserve_sparsity,
                "unclustered_layers": ",".join(too_small) or "none"},
        translation=translation,
        metrics={
            **({"sparsity": overall_sparsity(stripped)} if cfg.preserve_sparsity else {}),
            **{f"unique_weights.{layer}": float(count) for layer, count in distinct.items()},
            "keras_gzip_bytes": float(gzip_size_bytes(path)),
        },
    )


# No TensorFlow graph variant: clustering changes weight values, not the graph, so it would
# time the same as the baseline's graph; its size gain shows in the TFLite files.
TECHNIQUE = Technique(
    name="cluster", section=ClusterConfig, accepts=KERAS_ONLY, source_name=clustered_name,
    apply=cluster_model, yields_graph=False, knob=KNOB, on_arrays=True,
    starts_from=lambda cfg: "prune" if cfg.preserve_sparsity else None,
)
