"""Prefect task: train the baseline network on the TFRecord shards."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import TrainConfig
from tfopt.models.baseline import TRAIN_STEP, train_baseline
from tfopt.models.config import ModelConfig
from tfopt.native import run_native


@task(name="train_model", tags=["training"])
def train_model(
    data: TrainingData,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    out_dir: Path,
    checkpoint_dir: Path | None = None,
    deadline: float | None = None,
) -> ModelArtifact:
    """Make the baseline from its source, train it, and save it as ``baseline.keras``.

    The source is a zoo network or the user's builder (trained for ``train.epochs``), or the
    user's trained file (fine-tuned for ``train.epochs``; 0 keeps it as it is). A model whose
    input size or number of outputs disagrees with the data is refused before training.

    With `checkpoint_dir`, training state is backed up at every epoch end
    (`BackupAndRestore`) and each finished epoch is appended to ``history.csv`` there: a run
    killed mid-training resumes from its last finished epoch, and its curves hold every epoch
    exactly once. The folder is locked while training (a second run of the same settings waits
    and says so), and the finished baseline stays there: a rerun reuses it instead of training
    again.

    Args:
        data: The shards (train and val splits), batch size, seed and input settings.
        model_cfg: Where the model comes from (zoo network, file, builder).
        train_cfg: Epochs, learning rate, precision policy, distribution strategy.
        out_dir: Folder for the saved model.
        checkpoint_dir: Folder for the backup and history, stable across reruns of the same
            data and config (None: no resumption).
        deadline: When the training must end (the run's time budget; None: no limit).

    Returns:
        The saved model with its final metrics and per-epoch history.
    """
    return run_native(TRAIN_STEP, train_baseline, data, model_cfg, train_cfg, out_dir,
                      checkpoint_dir, deadline)
