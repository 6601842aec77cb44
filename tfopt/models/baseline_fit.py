"""Fitting the baseline in one process: the flow's, or a worker's of a multi-worker training.

`tfopt.models.baseline` trains here or hands the training to local worker processes
(`tfopt.models.multi_worker`), which each fit the same way under their own strategy; both
leave the trained model for reruns with `keep_trained`.
"""

from __future__ import annotations

import json
from pathlib import Path

import tensorflow as tf
import tf_keras as keras

from tfopt.artifacts import TrainingData
from tfopt.config import TrainConfig
from tfopt.fileio import atomic_write_json
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import load_keras_model, save_keras_model
from tfopt.models.sources import baseline_factory, build_configured
from tfopt.models.training import (
    HISTORY_NAME,
    CoolDown,
    Fitted,
    KeepBestWeights,
    StopWhenDone,
    fit,
    precision_policy,
    read_history,
    resumable_callbacks,
    steps_per_epoch,
)
from tfopt.orchestration import StepProgress

Trained = tuple[keras.Model, Fitted, dict[str, list[float]]]
"""The trained model, how its fit went, and its per-epoch curves."""
TRAINED_NAME = "trained.keras"
BEST_NAME = "best-epoch.npz"
TRAINED_INFO = "trained.json"


def train_in_scope(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig,
    strategy: tf.distribute.Strategy, checkpoint_dir: Path | None, chief: bool = True,
    deadline: float | None = None,
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
        deadline: When the training must end (a `time.time()` value; None: no limit).
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
            best_file = checkpoint_dir / BEST_NAME if checkpoint_dir else None
            fitted = fit(
                model, data, epochs=train_cfg.epochs, learning_rate=train_cfg.learning_rate,
                callbacks=[*resumable_callbacks(checkpoint_dir, history=chief, model=model),
                           EpochProgress(StepProgress("train-baseline", "epochs trained"),
                                         train_cfg.epochs),
                           *stopping(train_cfg, data, deadline)],
                best=KeepBestWeights(path=best_file, writes=chief),
            )
    curves = (read_history(checkpoint_dir / HISTORY_NAME)
              if checkpoint_dir and chief and fitted.curves else fitted.curves)
    if head is not None:
        curves = {**{f"head_{name}": values for name, values in head.curves.items()}, **curves}
        fitted = Fitted(curves=fitted.curves, seconds=fitted.seconds + head.seconds,
                        reader=fitted.reader or head.reader, best_epoch=fitted.best_epoch,
                        stop=fitted.stop)
    if train_cfg.mixed_precision != "off":
        # Variables stay float32 under a mixed policy; a float32 twin carries them into export
        # and conversion without the policy's casts (TFLite has no bfloat16 kernels).
        float_model = build_configured(model_cfg, dataset.image_size, dataset.num_classes)
        float_model.set_weights(model.get_weights())
        model = float_model
    return model, fitted, curves


def stopping(train_cfg: TrainConfig, data: TrainingData,
             deadline: float | None = None) -> list[keras.callbacks.Callback]:
    """When the baseline's training ends: `train.stop`'s rule, within `deadline`.

    On its plateau, the rate first cools down to zero over ``train.cool_down_epochs``.
    """
    if train_cfg.stop == "fixed":
        return [StopWhenDone(deadline=deadline)]
    cool_down = (CoolDown(steps_per_epoch(data), train_cfg.cool_down_epochs)
                 if train_cfg.cool_down_epochs else None)
    judge = StopWhenDone(patience=train_cfg.patience, min_delta=train_cfg.min_delta,
                         deadline=deadline, cool_down=cool_down)
    return [judge] if cool_down is None else [cool_down, judge]


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
                         reader=info["reader"], best_epoch=info.get("best_epoch"),
                         stop=info.get("stop", {})), info["curves"]


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
        "best_epoch": fitted.best_epoch, "stop": fitted.stop})


class EpochProgress(keras.callbacks.Callback):
    """Moves a Prefect progress artifact at every finished epoch (resumed runs included)."""

    def __init__(self, progress: StepProgress, epochs: int) -> None:
        super().__init__()
        self._progress, self._epochs = progress, epochs

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Report `epoch + 1` of the planned epochs as done."""
        self._progress.update(epoch + 1, self._epochs)
