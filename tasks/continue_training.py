"""Prefect task: train a baseline its compressed children beat further, until its plateau."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import TrainConfig
from tfopt.models.baseline import CONTINUE_STEP, continue_baseline
from tfopt.native import run_native


@task(name="continue_training", tags=["training"])
def continue_training(baseline: ModelArtifact, data: TrainingData, train_cfg: TrainConfig,
                      out_dir: Path, deadline: float | None = None) -> ModelArtifact:
    """Train the baseline further: a compressed model beat it on validation beyond the budget.

    Every verdict is judged against the baseline, so a parent its children beat was not done
    training; it goes on from its weights at a finer learning rate until its plateau.

    Args:
        baseline: The trained baseline.
        data: The run's training data.
        train_cfg: ``train.epochs`` (the cap), the learning rate, patience and min_delta.
        out_dir: Folder for ``baseline-continued.keras``.
        deadline: When the training must end (the run's time budget; None: no limit).

    Returns:
        The baseline trained further, or as it was when no epoch beat it.
    """
    return run_native(CONTINUE_STEP, continue_baseline, baseline, data, train_cfg, out_dir,
                      deadline)
