"""The baseline's training: here or on local workers, reused when a run trained it already.

The `train_model` task calls `train_baseline`: it fits the model in this process
(`tfopt.models.baseline_fit`) or on the workers of a multi-worker training
(`tfopt.models.multi_worker`, which fit the same way under their own strategy), and returns the
trained baseline's `ModelArtifact`.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path

import tensorflow as tf

from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import TrainConfig
from tfopt.fileio import file_lock
from tfopt.logs import step_logger
from tfopt.models.baseline_fit import (
    Trained,
    keep_trained,
    train_in_scope,
    trained_earlier,
)
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import keras_model_path, save_keras_model
from tfopt.models.multi_worker import WorkerFailedError, train_on_local_workers
from tfopt.models.training import (
    HISTORY_NAME,
    distribution_strategy,
    evaluate_test_accuracy,
    kept_epoch,
)
from tfopt.native import NativeStep
from tfopt.serving import write_labels

TRAIN_STEP = NativeStep(
    "train_model", "the baseline's training in TensorFlow's CPU kernels",
    "TensorFlow's kernels cannot train this model on this CPU: train.epochs: 0 optimizes it as "
    "it is (its conversions and benchmarks need no training)")


def train_baseline(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: Path,
    checkpoint_dir: Path | None,
) -> ModelArtifact:
    """Make the baseline from its source, train it (or reuse a finished training), save it.

    See `tasks.train_model.train_model` for the checkpoint folder's role.
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
                keep_trained(trained, checkpoint_dir, _builder_code(model_cfg))
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
    save_keras_model(model, path, code=_builder_code(model_cfg))
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
        channels=dataset.channels,
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
    """Train on local worker processes (`tfopt.models.multi_worker`); load what the chief saved."""
    folder = checkpoint_dir or out_dir / "multi-worker"
    train_on_local_workers(data, model_cfg, train_cfg, folder, folder / HISTORY_NAME)
    trained = trained_earlier(folder)
    if trained is None:
        raise WorkerFailedError(f"the multi-worker training's chief saved no model in {folder}")
    if checkpoint_dir is None:
        shutil.rmtree(folder)
    return trained


def _builder_code(model_cfg: ModelConfig) -> str | None:
    """The user's builder, whose classes a model it built may use (None: not a builder's)."""
    if model_cfg.source != "builder" or not model_cfg.builder:
        return None
    target, _, name = str(model_cfg.builder).rpartition(":")
    return f"{Path(target).resolve()}:{name}" if target.endswith(".py") else model_cfg.builder


def _source_params(model_cfg: ModelConfig) -> dict[str, str | int | float]:
    """Where the baseline came from, in the words of its source."""
    if model_cfg.source == "file":
        return {"source": "file", "path": str(model_cfg.path)}
    if model_cfg.source == "builder":
        return {"source": "builder", "builder": str(model_cfg.builder)}
    return {"source": "zoo", "architecture": model_cfg.architecture, "width": model_cfg.width,
            "alpha": model_cfg.alpha, "data_format": model_cfg.data_format}
