"""The baseline's training and the result it leaves for reruns.

Shared by the `train_model` task (one process) and the workers of a multi-worker training
(`tfopt.models.multi_worker`), which train the same way under their own strategy.
"""

from __future__ import annotations

import json
import logging
import shutil
from contextlib import nullcontext
from pathlib import Path

import tensorflow as tf
import tf_keras as keras

from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import ModelConfig, TrainConfig
from tfopt.fileio import atomic_write_json, file_lock
from tfopt.models.keras_io import keras_model_path, load_keras_model, save_keras_model
from tfopt.models.multi_worker import WorkerFailedError, train_on_local_workers
from tfopt.models.sources import baseline_factory, build_configured
from tfopt.models.training import (
    HISTORY_NAME,
    Fitted,
    KeepBestWeights,
    distribution_strategy,
    evaluate_test_accuracy,
    fit,
    kept_epoch,
    precision_policy,
    read_history,
    resumable_callbacks,
)
from tfopt.orchestration import StepProgress
from tfopt.serving import write_labels

Trained = tuple[keras.Model, Fitted, dict[str, list[float]]]
"""The trained model, how its fit went, and its per-epoch curves."""
TRAINED_NAME = "trained.keras"
BEST_NAME = "best-epoch.npz"
TRAINED_INFO = "trained.json"


def train_in_scope(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig,
    strategy: tf.distribute.Strategy, checkpoint_dir: Path | None, chief: bool = True,
) -> Trained:
    """Build or load the baseline under `strategy` and fit it (resuming an interrupted fit).

    Args:
        data: The run's training data.
        model_cfg: Where the model comes from.
        train_cfg: Epochs, learning rate, precision policy.
        strategy: The tf.distribute strategy to build and train under.
        checkpoint_dir: Backup folder (shared by all workers of a multi-worker training).
        chief: Whether this process writes the history and the best epoch's file (the only
            one, or worker 0 of a multi-worker training).
    """
    dataset = data.dataset
    keras.utils.set_random_seed(data.seed)
    with precision_policy(train_cfg.mixed_precision), strategy.scope():
        model = baseline_factory(model_cfg, dataset.image_size, dataset.num_classes,
                                 dataset.class_names)()
        head = (train_head(model, data, train_cfg)
                if model_cfg.head == "replace" and train_cfg.head_epochs else None)
        if train_cfg.epochs == 0:
            fitted = Fitted(curves={}, seconds=0.0)
        else:
            best_file = checkpoint_dir / BEST_NAME if checkpoint_dir and chief else None
            fitted = fit(
                model, data, epochs=train_cfg.epochs, learning_rate=train_cfg.learning_rate,
                callbacks=[*resumable_callbacks(checkpoint_dir, history=chief, model=model),
                           EpochProgress(StepProgress("train-baseline", "epochs trained"),
                                         train_cfg.epochs)],
                best=KeepBestWeights(path=best_file),
            )
    curves = (read_history(checkpoint_dir / HISTORY_NAME)
              if checkpoint_dir and chief and fitted.curves else fitted.curves)
    if head is not None:
        curves = {**{f"head_{name}": values for name, values in head.curves.items()}, **curves}
        fitted = Fitted(curves=fitted.curves, seconds=fitted.seconds + head.seconds,
                        reader=fitted.reader or head.reader, best_epoch=fitted.best_epoch)
    if train_cfg.mixed_precision != "off":
        # Variables stay float32 under a mixed policy; a float32 twin carries them into export
        # and conversion without the policy's casts (TFLite has no bfloat16 kernels).
        float_model = build_configured(model_cfg, dataset.image_size, dataset.num_classes)
        float_model.set_weights(model.get_weights())
        model = float_model
    return model, fitted, curves


def train_head(model: keras.Model, data: TrainingData, train_cfg: TrainConfig) -> Fitted:
    """Train the new classification layer alone (every other layer frozen), then unfreeze.

    The new head starts from random weights: trained with the pretrained features frozen first,
    its large early gradients do not wreck those features (the usual transfer-learning recipe).
    Frozen batch-normalization layers run in inference mode.
    """
    body = model.layers[:-1]
    was_trainable = [layer.trainable for layer in body]
    for layer in body:
        layer.trainable = False
    try:
        return fit(model, data, epochs=train_cfg.head_epochs,
                   learning_rate=train_cfg.learning_rate)
    finally:
        for layer, trainable in zip(body, was_trainable, strict=True):
            layer.trainable = trainable


def trained_earlier(checkpoint_dir: Path | None) -> Trained | None:
    """The baseline a finished earlier run left in `checkpoint_dir`, or None."""
    if checkpoint_dir is None or not (checkpoint_dir / TRAINED_INFO).is_file():
        return None
    info = json.loads((checkpoint_dir / TRAINED_INFO).read_text())
    model = load_keras_model(checkpoint_dir / TRAINED_NAME)
    return model, Fitted(curves=info["curves"], seconds=info["seconds"],
                         reader=info["reader"], best_epoch=info.get("best_epoch")), info["curves"]


def keep_trained(trained: Trained, checkpoint_dir: Path | None, code: str | None = None) -> None:
    """Leave the trained baseline in `checkpoint_dir` for reruns (the info file last).

    `code` names the user's builder whose classes the model may use (see `save_keras_model`).
    """
    if checkpoint_dir is None:
        return
    model, fitted, curves = trained
    save_keras_model(model, checkpoint_dir / TRAINED_NAME, code=code)
    atomic_write_json(checkpoint_dir / TRAINED_INFO, {
        "curves": curves, "seconds": fitted.seconds, "reader": fitted.reader,
        "best_epoch": fitted.best_epoch})


class EpochProgress(keras.callbacks.Callback):
    """Moves a Prefect progress artifact at every finished epoch (resumed runs included)."""

    def __init__(self, progress: StepProgress, epochs: int) -> None:
        super().__init__()
        self._progress, self._epochs = progress, epochs

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Report `epoch + 1` of the planned epochs as done."""
        self._progress.update(epoch + 1, self._epochs)


def train_baseline(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: Path,
    checkpoint_dir: Path | None, logger: logging.Logger,
) -> ModelArtifact:
    """Make the baseline from its source, train it (or reuse a finished training), save it.

    See `tasks.train_model.train_model` for the checkpoint folder's role.
    """
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
