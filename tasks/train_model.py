"""Train the baseline network on the TFRecord shards."""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path

import tensorflow as tf
from prefect import task

from tasks.baseline import Trained, keep_trained, train_in_scope, trained_earlier
from tasks.keras_models import keras_model_path, save_keras_model
from tasks.multi_worker import WorkerFailedError, train_on_local_workers
from tasks.training import (
    HISTORY_NAME,
    distribution_strategy,
    evaluate_test_accuracy,
    kept_epoch,
)
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import ModelConfig, TrainConfig
from tfopt.fileio import file_lock
from tfopt.logs import step_logger
from tfopt.serving import write_labels


@task(name="train_model", tags=["training"])
def train_model(
    data: TrainingData,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    out_dir: Path,
    checkpoint_dir: Path | None = None,
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

    Returns:
        The saved model with its final metrics and per-epoch history.
    """
    logger = step_logger()
    dataset = data.dataset
    strategy = distribution_strategy(train_cfg.distribute)
    lock = checkpoint_dir / ".lock" if checkpoint_dir else None
    with file_lock(lock, lambda: logger.info(
            "another run is training the same baseline (%s); waiting for it", checkpoint_dir),
            ) if lock else nullcontext():
        trained = trained_earlier(checkpoint_dir) if train_cfg.epochs else None
        if trained is None and train_cfg.epochs and train_cfg.distribute == "multi_worker":
            trained = _train_on_workers(data, model_cfg, train_cfg, checkpoint_dir, out_dir)
        elif trained is None:
            trained = train_in_scope(data, model_cfg, train_cfg, strategy, checkpoint_dir)
            if train_cfg.epochs:
                keep_trained(trained, checkpoint_dir)
        else:
            logger.info("reusing the baseline an earlier run trained with the same data and "
                        "settings (%s)", checkpoint_dir)
    model, fitted, curves = trained
    logger.info(
        "trained %s for %d epochs in %.1f s (precision policy %s): %s", model.name,
        train_cfg.epochs, fitted.seconds, train_cfg.mixed_precision,
        {name: round(values[-1], 4) for name, values in curves.items()},
    )
    path = keras_model_path(out_dir, "baseline")
    save_keras_model(model, path)
    write_labels(out_dir, dataset.class_names)
    metrics = {f"final_{name}": values[-1] for name, values in curves.items()}
    metrics["train_seconds"] = fitted.seconds
    return ModelArtifact(
        name="baseline",
        path=path,
        format="keras",
        image_size=dataset.image_size,
        num_classes=dataset.num_classes,
        class_names=dataset.class_names,
        input_scale=data.input_scale,
        params={
            **_source_params(model_cfg),
            "batch_size": data.batch_size,
            "epochs": train_cfg.epochs,
            "kept_epoch": kept_epoch(fitted),
            "mixed_precision": train_cfg.mixed_precision,
            "distribute": _distribute_param(train_cfg, strategy),
            "parameters": int(model.count_params()),
            "devices": ",".join(d.device_type for d in tf.config.list_physical_devices()),
            **fitted.reader,
        },
        metrics={**metrics, "test_accuracy": evaluate_test_accuracy(model, data)},
        history=curves,
    )


def _distribute_param(train_cfg: TrainConfig, strategy: tf.distribute.Strategy) -> str:
    if train_cfg.distribute == "multi_worker":
        return f"multi_worker ({train_cfg.workers} workers)"
    return f"{train_cfg.distribute} ({strategy.num_replicas_in_sync} replicas)"


def _train_on_workers(data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig,
                      checkpoint_dir: Path | None, out_dir: Path) -> Trained:
    """Train on local worker processes (`tasks.multi_worker`); load what the chief saved."""
    folder = checkpoint_dir or out_dir / "multi-worker"
    train_on_local_workers(data, model_cfg, train_cfg, folder, folder / HISTORY_NAME)
    trained = trained_earlier(folder)
    if trained is None:
        raise WorkerFailedError(f"the multi-worker training's chief saved no model in {folder}")
    if checkpoint_dir is None:
        shutil.rmtree(folder)
    return trained


def _source_params(model_cfg: ModelConfig) -> dict[str, str | int | float]:
    """Where the baseline came from, in the words of its source."""
    if model_cfg.source == "file":
        return {"source": "file", "path": str(model_cfg.path)}
    if model_cfg.source == "builder":
        return {"source": "builder", "builder": str(model_cfg.builder)}
    return {"source": "zoo", "architecture": model_cfg.architecture, "width": model_cfg.width,
            "alpha": model_cfg.alpha, "data_format": model_cfg.data_format}
