"""Prefect task: export a Keras model as a SavedModel with a named, dynamic-batch signature."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import ModelArtifact
from tfopt.models.serving_export import EXPORT_STEP, export_serving_savedmodel
from tfopt.native import run_native


@task(name="export_savedmodel", tags=["export"])
def export_savedmodel(model: ModelArtifact, out_dir: Path) -> ModelArtifact:
    """Write ``<name>-savedmodel/`` with the ``serving_default`` signature.

    The signature takes ``images`` (float32 ``[batch, size, size, channels]``, any batch) and
    returns ``logits`` and ``probabilities``; the class order goes with it as
    ``assets/labels.txt``. Every conversion starts from it.

    Args:
        model: A Keras model artifact (left unchanged).
        out_dir: Folder to write into.

    Returns:
        The SavedModel artifact.
    """
    return run_native(EXPORT_STEP, export_serving_savedmodel, model, out_dir)
