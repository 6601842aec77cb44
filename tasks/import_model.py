"""Prefect task: take in a SavedModel, .tflite or .onnx file as the baseline.

What each kind of model goes through: `tfopt.models.importing`.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import DatasetArtifact, ModelArtifact
from tfopt.config import EvalConfig
from tfopt.models.config import ModelConfig
from tfopt.models.importing import IMPORT_STEP, import_array_model, import_model_file
from tfopt.native import run_native


@task(name="import_model", tags=["training"])
def import_model(
    model_cfg: ModelConfig, dataset: DatasetArtifact, out_dir: Path,
    judged_by: EvalConfig | None = None,
) -> ModelArtifact:
    """Check a SavedModel, ``.tflite`` or ``.onnx`` file against the data and make it the baseline.

    With array data (``data.source_format: npz``) the file is taken as it is, its own
    signature kept, its inputs matched to the arrays by name.

    Args:
        model_cfg: ``model.source: file`` with a non-Keras ``model.path``.
        dataset: The data the model must fit (image size, classes and their order; or its
            arrays).
        out_dir: Folder for the baseline (``baseline-savedmodel/``, ``baseline.tflite`` or
            ``baseline.onnx``) and its ``labels.txt``.
        judged_by: The run's ``eval`` on array data: a Keras file's figures on the held-out
            splits join its metrics (what its compressed models are judged against).

    Returns:
        The baseline, in its own format.

    Raises:
        ModelSourceError: The file cannot be read, or does not fit the data (naming both values).
    """
    if dataset.arrays:
        return run_native(IMPORT_STEP, import_array_model, model_cfg, dataset, out_dir,
                          judged_by)
    return run_native(IMPORT_STEP, import_model_file, model_cfg, dataset, out_dir)
