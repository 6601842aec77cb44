"""Training helpers shared by the baseline and every technique's fine-tuning. Not a task.

Every step that trains takes a `TrainingData`, so all of them read the run's shards with the
run's input settings (cache rule, crops, determinism), the same batch size and seed.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tfopt.artifacts import HELD_OUT_SCORE, DatasetArtifact, TrainingData, TrialRef
from tfopt.config import EvalConfig
from tfopt.data.pipeline import load_split, reader_options, tuned_dataset
from tfopt.fileio import atomic_write_bytes
from tfopt.models.config import SETTLE_EPOCHS
from tfopt.models.keras_io import keras_of
from tfopt.schedule.budget import TRAINING_TIME_USED, Stop

HISTORY_NAME = "history.csv"


@dataclass(frozen=True)
class Fitted:
    """What a training call did: per-epoch curves, seconds, and the reader settings it used."""

    curves: dict[str, list[float]]
    seconds: float
    reader: dict[str, str | float | bool] = field(default_factory=dict)
    best_epoch: int | None = None
    """The 0-based epoch whose weights the model kept (best validation accuracy)."""
    stop: dict[str, str | int | bool | float] = field(default_factory=dict)
    """How it ended, when a `StopWhenDone` judged it (`StopWhenDone.outcome`)."""
    epoch_seconds: list[float] = field(default_factory=list)
    """Each epoch's seconds, its validation included (the first one builds the graph too)."""

    def steady_epoch_seconds(self) -> float | None:
        """The median epoch once the graph is built: the epochs after the first (None: none).

        The last one is left out when the time budget ended it, which may be within the epoch.
        """
        steady = self.epoch_seconds[1:]
        stopped_by = Stop.of(self.stop)
        if stopped_by is not None and stopped_by.by_budget:
            steady = steady[:-1]
        return statistics.median(steady) if steady else None


def training_data(
    data: TrainingData, teacher: Any = None,
) -> tuple[tf.data.Dataset, tf.data.Dataset | None, dict[str, str | float | bool]]:
    """The run's tuned training and held-out pipelines, and the training reader's settings.

    The held-out pipeline reads the selection split where there is one
    (`DatasetArtifact.selection_split`): Keras' ``val_*`` figures during a training, and every
    choice made on them (best epoch, early stop), then never touch the validation split, which
    judges the trained model's files.

    Array data is learned with its ``y``, or against a `teacher`'s outputs (`split_inputs`).

    Returns:
        The training pipeline, the held-out pipeline (None without one), and the
        training reader's settings as built (cache mode, crop area, determinism).
    """
    dataset = data.dataset
    if dataset.arrays:
        return _array_training_data(data, teacher)
    train_options, decision = reader_options(dataset, "train", data.input, training=True,
                                             scale=data.input_scale)
    train = tuned_dataset(dataset.splits["train"].files, dataset.image_size, data.batch_size,
                          training=True, seed=data.seed, options=train_options,
                          examples_hint=dataset.splits["train"].examples)
    train = train.with_options(_shared_by_workers())
    reader = {"input.cache": decision.mode,
              "input.random_crop_min_area": train_options.random_crop_min_area,
              "input.deterministic": train_options.deterministic}
    held_out = dataset.selection_split
    if not dataset.examples(held_out):
        return train, None, reader
    val_options, _ = reader_options(dataset, held_out, data.input, training=False,
                                    scale=data.input_scale)
    val = tuned_dataset(dataset.splits[held_out].files, dataset.image_size, data.batch_size,
                        options=val_options, examples_hint=dataset.examples(held_out))
    return train, val.with_options(_shared_by_workers()), reader


def _array_training_data(
    data: TrainingData, teacher: Any = None,
) -> tuple[tf.data.Dataset, tf.data.Dataset | None, dict[str, str | float | bool]]:
    """`training_data` for array data: the shards as written, shuffled for training.

    Against a `teacher`, each split is read into memory with the teacher's outputs on it.
    """
    from tfopt.data.arrays import training_pipeline

    dataset, held_out = data.dataset, data.dataset.selection_split

    def pipeline(split: str, seed: int | None) -> tf.data.Dataset:
        if teacher is None:
            return training_pipeline(dataset, split, data.batch_size, seed=seed)
        inputs, truth = split_inputs(dataset, split, teacher)
        pairs = tf.data.Dataset.from_tensor_slices(
            (inputs, tuple(truth) if isinstance(truth, list) else truth))
        if seed is not None:
            pairs = pairs.shuffle(max(1, dataset.splits[split].examples), seed=seed,
                                  reshuffle_each_iteration=True)
        return pairs.batch(data.batch_size).prefetch(tf.data.AUTOTUNE)

    train = pipeline("train", data.seed)
    val = pipeline(held_out, None) if dataset.examples(held_out) else None
    return train, val, {"input.cache": "none"}


def _shared_by_workers() -> tf.data.Options:
    """Under MultiWorkerMirroredStrategy, each worker keeps its share of every batch.

    Sharding by file, TensorFlow's first choice, fails when a small data set has fewer shard
    files than workers; elsewhere the option does nothing.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options


class EpochClock(keras.callbacks.Callback):
    """Each epoch's seconds, from its start to the end of its validation (`Fitted.epoch_seconds`).

    Read first at an epoch's end: what later callbacks do there (keeping the best weights,
    the stopping rules) falls between epochs, with the fixed part of the run that prices them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._started = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Start the epoch's clock."""
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Keep the epoch's seconds."""
        self.seconds.append(time.perf_counter() - self._started)


class KeepBestWeights(keras.callbacks.Callback):
    """Ends training with the weights of the epoch that scored best on validation accuracy.

    Keras' ``EarlyStopping(restore_best_weights=True)`` restores them only when it stops early;
    this always does. Epochs before `from_epoch` (0-based) are not candidates: a pruning
    fine-tune is judged only once its sparsity ramp has reached the target. Ties go to the
    later epoch. Without a validation split it does nothing. With `path`, the best weights are
    also kept in that file (written atomically), so a training resumed after a crash still
    ends with the best epoch of the whole training, not only of its resumed part.

    Every worker of a multi-worker training needs the same best epoch: reading the weights of
    a synchronized-on-read variable (batch norm's moving statistics) is a collective operation,
    so a worker that reads them at an epoch where another does not stalls the cluster. There
    every worker picks the file up; only the chief (`writes`) writes and removes it.

    Attributes:
        best_epoch: The 0-based epoch whose weights the model ends with (None: the last).
        best_accuracy: Its validation accuracy.
    """

    def __init__(self, from_epoch: int = 0, path: Path | None = None,
                 monitor: str = "val_accuracy", writes: bool = True) -> None:
        super().__init__()
        self._from_epoch, self._path, self._monitor = from_epoch, path, monitor
        self._writes = writes
        self._weights: list[np.ndarray] | None = None
        self.best_epoch: int | None = None
        self.best_accuracy = -math.inf  # a held-out score (array data) may be below -1

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Pick up the best epoch an interrupted training left in `path`."""
        if self._path is None or not self._path.is_file():
            return
        with np.load(self._path) as kept:
            self.best_epoch, self.best_accuracy = int(kept["epoch"]), float(kept["accuracy"])
            self._weights = [kept[f"w{i}"] for i in range(len(kept.files) - 2)]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Remember this epoch's weights when it is a candidate and scores at least as well."""
        value = (logs or {}).get(self._monitor)
        if value is None or epoch < self._from_epoch or float(value) < self.best_accuracy:
            return
        self.best_epoch, self.best_accuracy = epoch, float(value)
        self._weights = self.model.get_weights()
        if self._path is not None and self._writes:
            buffer = io.BytesIO()
            np.savez(buffer, epoch=epoch, accuracy=self.best_accuracy,
                     **{f"w{i}": w for i, w in enumerate(self._weights)})
            atomic_write_bytes(self._path, buffer.getvalue())

    def on_train_end(self, logs: dict | None = None) -> None:
        """Put the best epoch's weights back; the training is over, so is its file."""
        if self._weights is not None:
            self.model.set_weights(self._weights)
        if self._path is not None and self._writes:
            self._path.unlink(missing_ok=True)


class HeldOutMetric(keras.callbacks.Callback):
    """The run's metric (``eval``) on the held-out split after each epoch, for array data.

    Added to the epoch's logs, before the callbacks that read them, as ``val_<metric>`` (the
    figure, in the training's curves) and `HELD_OUT_SCORE` (oriented: higher is better). Against
    the data's ``y``, or a `teacher`'s outputs (a fidelity metric's truth).
    """

    def __init__(self, data: TrainingData, teacher: Any = None) -> None:
        super().__init__()
        self._output, self._metric = data.judged().output, data.metric()
        self._data, self._teacher = data, teacher
        self._inputs: Any = None
        self._truth: Any = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Read the held-out split once (with the teacher's outputs on it)."""
        self._inputs, self._truth = split_inputs(self._data.dataset,
                                                 self._data.dataset.selection_split,
                                                 self._teacher)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Score the model on the held-out split into `logs`."""
        if logs is None or self._truth is None:
            return
        judged = getattr(self.model, "student", self.model)  # a distiller's student
        value = split_metric(judged, self._inputs, self._truth, self._metric, self._output)
        logs[f"val_{self._metric.name}"] = value
        logs[HELD_OUT_SCORE] = self._metric.oriented(value)


def held_out_figures(model: Any, dataset: DatasetArtifact,
                     judged: EvalConfig) -> dict[str, float]:
    """The run's metric of a Keras model of array data on its held-out splits, as metrics.

    ``<split>_<metric>`` on the split trainings choose on and on validation (one entry where
    they are one split): the figures a compressed model's fine-tuning and a search's files are
    judged against (`tfopt.models.baseline.array_targets`). Against the model's own outputs
    where the data has no ``y`` or the metric is a fidelity one (its cap, then).
    """
    from tfopt.data.arrays import TRUTH

    metric = judged.resolve(class_scores=False)
    itself = TRUTH not in dataset.arrays or not metric.needs_labels
    figures = {}
    for split in dict.fromkeys((dataset.selection_split, "val")):
        if dataset.examples(split):
            inputs, truth = split_inputs(dataset, split, model if itself else None)
            figures[f"{split}_{metric.name}"] = split_metric(model, inputs, truth, metric,
                                                             judged.output)
    return figures


def split_inputs(dataset: DatasetArtifact, split: str, teacher: Any = None,
                 limit: int | None = None) -> tuple[Any, Any]:
    """An array data set's split in memory as a Keras model takes it, and its truth.

    The truth is its ``y`` (None without), or the `teacher`'s outputs on it (as the teacher
    answers: one array, a list or a dict of them): what a fine-tuning without labels learns
    from. `limit`: its first examples only.
    """
    from tfopt.data.arrays import TRUTH, load_split_feeds

    arrays = load_split_feeds(dataset, split, limit)
    truth = arrays.pop(TRUTH, None)
    inputs = next(iter(arrays.values())) if len(arrays) == 1 else arrays
    if teacher is not None:
        truth = teacher.predict(inputs, batch_size=256, verbose=0)
    return inputs, truth


def _picked(model: Any, outputs: Any, output: str | None) -> np.ndarray:
    """A Keras model's `output` (None: its only or first one) among its `outputs`."""
    if isinstance(outputs, dict):
        return np.asarray(outputs[output] if output in outputs else next(iter(outputs.values())))
    if isinstance(outputs, list | tuple):
        names = list(getattr(model, "output_names", None) or [])
        return np.asarray(outputs[names.index(output)] if output in names else outputs[0])
    return np.asarray(outputs)


def split_metric(model: Any, inputs: Any, truth: Any, metric: Any, output: str | None) -> float:
    """`metric` of a Keras model's `output` (None: its only or first one) against `truth`.

    `truth` is the data's ``y``, or a teacher's outputs, of which the same output is taken.

    Raises:
        tfopt.eval.metrics.MetricError: The outputs do not fit the metric or the truth.
    """
    outputs = model.predict(inputs, batch_size=256, verbose=0)
    return metric.score(_picked(model, truth, output), _picked(model, outputs, output))


def _epochs(count: int) -> str:
    return f"{count} epoch" if count == 1 else f"{count} epochs"


LOSS_GAIN = 0.01
"""The held-out loss's relative fall that counts as a gain where the accuracy held (a plateau
reads it): a loss that only wavers does not keep a training going."""


class StopWhenDone(keras.callbacks.Callback):
    """Ends a training when more epochs would not pay: on its plateau, once recovered, or in time.

    - plateau (`patience`): for `patience` epochs, the held-out accuracy (Keras'
      ``val_accuracy``: the selection split where there is one) has not improved by
      `min_delta`, nor has it held while the held-out loss (``val_loss``) fell more than
      `LOSS_GAIN` below its best; after half of them the learning rate is halved (a constant
      rate only: a schedule keeps its own course), so a plateau is tried at a finer step before
      it ends. The loss is read because a small held-out split saturates: once every image on
      it is right, the accuracy cannot show that the model still learns;
    - recovered (`target`): the held-out accuracy reached `target` (a fine-tuning back within
      the accuracy budget of its baseline) and the last `settle` epochs did not improve it;
    - deadline (`deadline`, a `time.time()` value): the next epoch would end after it, or it
      has passed within an epoch (the epoch ends at that batch, its validation still run: a
      large model's epoch can take many times a fine-tuning's share of the time; not under
      several workers, whose steps must stay in lockstep).

    Given a `cool_down`, a plateau or a recovery (at once, without `settle`) does not end the
    training yet: the cool-down takes the rate to zero over its epochs first, and a deadline met
    meanwhile ends it as the plateau or recovery it was. Epochs before `from_epoch` (a pruning
    ramp) do not count. `train.epochs` (or a technique's ``epochs``) stays the cap. `outcome`
    says how it ended.
    """

    def __init__(self, *, patience: int | None = None, min_delta: float = 0.0,
                 target: float | None = None, from_epoch: int = 0,
                 deadline: float | None = None, settle: int = 1,
                 cool_down: CoolDown | None = None, monitor: str = "val_accuracy") -> None:
        super().__init__()
        self._monitor = monitor
        self._what = "accuracy" if monitor == "val_accuracy" else "score"
        self._patience, self._min_delta, self._target = patience, min_delta, target
        self._settle, self._cool_down, self._cooling_from = settle, cool_down, -1
        self._from_epoch, self._deadline = from_epoch, deadline
        # -inf, not -1: a held-out score (array data: a negated error) may be below -1
        self._best, self._best_epoch, self._wait, self._reference = -math.inf, -1, 0, -math.inf
        self._best_loss, self._unsettled = math.inf, 0
        self._epochs, self._epoch_started, self._slowest_epoch = 0, 0.0, 0.0
        self._done_why, self.reason, self._out_of_time = "", "", False
        self._checks_batches, self._passed_within_epoch = False, False
        self._done_kind = Stop.CAP

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Time the epoch (the deadline check needs the next one's length)."""
        self._epoch_started = time.monotonic()

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Whether the deadline may end an epoch early (not under several workers)."""
        from tfopt.models.batch_norm import distributed

        self._checks_batches = self._deadline is not None and not distributed(self.model)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """End the epoch at this batch once the deadline has passed (see the class)."""
        if self._checks_batches and not self.reason and time.time() > self._deadline:
            self._passed_within_epoch = True
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Stop when the plateau, the recovery or the deadline says so."""
        self._epochs = epoch + 1
        self._slowest_epoch = max(self._slowest_epoch, time.monotonic() - self._epoch_started)
        value, loss = (logs or {}).get(self._monitor), (logs or {}).get("val_loss")
        if value is not None and epoch >= self._from_epoch:
            self._judge(epoch, float(value), None if loss is None else float(loss))
        if not self.reason and self._deadline is not None and (
                self._passed_within_epoch
                or time.time() + self._slowest_epoch > self._deadline):
            self.reason = (f"{self._done_why}, then {_epochs(epoch - self._cooling_from)} cooling "
                           f"down ({TRAINING_TIME_USED})"
                           if self._done_why else f"budget: {TRAINING_TIME_USED}")
            self._out_of_time = True
        if self.reason:
            self.model.stop_training = True

    def _judge(self, epoch: int, value: float, loss: float | None) -> None:
        gained = value > self._reference + self._min_delta
        improved = gained or (loss is not None and value >= self._reference
                              and loss < self._best_loss * (1 - LOSS_GAIN))
        self._best_loss = min(self._best_loss, math.inf if loss is None else loss)
        if value > self._best:
            self._best, self._best_epoch = value, epoch
        self._unsettled = 0 if gained else self._unsettled + 1
        if improved:
            self._reference, self._wait = value, 0
        else:
            self._wait += 1
        if not self._done_why:
            self._done_kind, self._done_why = self._done()
        if self._done_why and self._cool_down is not None:
            self._cool(epoch)
        elif self._done_why:
            self.reason = self._done_why
        elif self._patience is not None and self._wait == max(1, self._patience // 2):
            self._halve_learning_rate()

    def _done(self) -> tuple[Stop, str]:
        """What ends the training, as a kind and in words ("cap", "" while more epochs may pay)."""
        if self._target is not None and self._best >= self._target and (
                self._cool_down is not None or self._unsettled >= self._settle):
            return Stop.RECOVERED, (
                f"recovered: held-out {self._what} {self._best:.4f} within the budget "
                f"(>= {self._target:.4f})"
                + ("" if self._cool_down else f" and no gain for {_epochs(self._unsettled)}"))
        if self._patience is not None and self._wait >= self._patience:
            loss = (f" (nor a held-out loss {LOSS_GAIN:.0%} lower at the same accuracy)"
                    if math.isfinite(self._best_loss) else "")
            return Stop.PLATEAU, (f"plateau: no held-out {self._what} gain of {self._min_delta:g}"
                                  f"{loss} for {_epochs(self._patience)}")
        return Stop.CAP, ""

    def _cool(self, epoch: int) -> None:
        """Done: the rate decays to zero over the cool-down's epochs, then the training ends."""
        assert self._cool_down is not None
        if self._cooling_from < 0:
            self._cooling_from = epoch
            self._cool_down.start()
        if epoch - self._cooling_from >= self._cool_down.epochs:
            self.reason = f"{self._done_why}, then {_epochs(self._cool_down.epochs)} cooling down"

    def _stopped_by(self) -> Stop:
        """What ended the training, as a kind (`stop_reason` says it in words)."""
        if self._out_of_time:
            return Stop.BUDGET_COOLING if self._done_why else Stop.BUDGET
        if self._done_why:
            return self._done_kind
        return Stop.CAP

    def _halve_learning_rate(self) -> None:
        rate = constant_learning_rate(self.model.optimizer)
        if rate is not None:
            set_learning_rate(self.model.optimizer, rate * 0.5)

    def outcome(self, cap: int) -> dict[str, str | int | bool | float]:
        """How the training ended: epochs run, best epoch (1-based), converged, stop reason.

        `converged` is true when it stopped on its plateau or once recovered (cooling down
        after it or not), false when the cap (`cap` epochs) or the deadline ended it first.
        """
        reason = self.reason or f"cap: {cap} epochs run, still improving"
        if not self.reason and self._done_why:  # the cap met while cooling down
            reason = (f"{self._done_why}, then {_epochs(self._epochs - 1 - self._cooling_from)} "
                      f"cooling down (cap: {cap} epochs run)")
        elif not self.reason and self._wait >= (self._patience or cap + 1):
            reason = f"cap: {cap} epochs run, the last {self._wait} without a gain"
        return {"epochs_run": self._epochs, "best_epoch": self._best_epoch + 1,
                "converged": bool(self._done_why), "stopped_by": self._stopped_by(),
                "recovered": self._target is not None and self._best >= self._target,
                "stop_reason": reason,
                "best_val_accuracy": self._best if math.isfinite(self._best) else -1.0}


class CoolDown(keras.callbacks.Callback):
    """Once `start` is called, the learning rate straight down to zero over `epochs` epochs.

    From the optimizer's constant rate at that moment (a warmup-stable-decay's decay); before,
    it leaves the rate alone (a plateau may halve it). Why: a training stopped on its plateau or
    once back within the budget kept the weights of an epoch at a high rate, where a rate
    brought to zero settles them (the fine-tunings' `SETTLE_EPOCHS` evidence).
    """

    def __init__(self, steps_per_epoch: int, epochs: int) -> None:
        super().__init__()
        self._per_epoch, self.epochs = max(1, steps_per_epoch), epochs
        self._step, self._from_step, self._from_rate = 0, -1, 0.0

    def rate(self, step: int) -> float | None:
        """The learning rate of batch `step` (0-based, over the whole training; None: as is)."""
        if self._from_step < 0:
            return None
        left = 1.0 - (step - self._from_step) / max(1, self.epochs * self._per_epoch)
        return self._from_rate * max(0.0, left)

    def start(self) -> None:
        """Decay from the next batch's rate to zero over `epochs` epochs."""
        current = self.rate(self._step)
        if current is None and self.model is not None:
            current = constant_learning_rate(self.model.optimizer)
        self._from_step, self._from_rate = self._step, current or 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        """Set this batch's rate."""
        rate = self.rate(self._step)
        if rate is not None:
            set_learning_rate(self.model.optimizer, rate)
        self._step += 1


class CosineCoolDown(CoolDown):
    """A cosine learning rate that, once back within the budget, cools down to zero.

    Along a cosine to zero over `steps`; once `start` is called, from where it is straight down
    to zero over `epochs` epochs (`CoolDown`). The compiled optimizer's rate must be a
    constant: this sets it before every batch.
    """

    def __init__(self, learning_rate: float, steps: int, steps_per_epoch: int,
                 epochs: int) -> None:
        super().__init__(steps_per_epoch, epochs)
        self._initial, self._steps = learning_rate, max(1, steps)

    def rate(self, step: int) -> float:
        """The learning rate of batch `step` (0-based, over the whole training)."""
        cosine = 0.5 * self._initial * (1.0 + math.cos(math.pi * min(step, self._steps)
                                                       / self._steps))
        decayed = super().rate(step)
        return cosine if decayed is None else min(cosine, decayed)


def constant_learning_rate(optimizer: Any) -> float | None:
    """A compiled optimizer's constant learning rate (None: it follows a schedule)."""
    rate = getattr(optimizer, "learning_rate", None)
    if rate is None or isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return None
    try:
        return float(keras.backend.get_value(rate))
    except (TypeError, ValueError, AttributeError):  # a Keras 3 optimizer's variable
        return float(rate.numpy())


def set_learning_rate(optimizer: Any, value: float) -> None:
    """Set a compiled optimizer's constant learning rate (tf_keras or Keras 3)."""
    try:
        keras.backend.set_value(optimizer.learning_rate, value)
    except (TypeError, ValueError, AttributeError):  # a Keras 3 optimizer's variable
        optimizer.learning_rate.assign(value)


@dataclass(frozen=True)
class HopelessRule:
    """When a search trial's fine-tuning stops itself (its study's user attributes).

    Attributes:
        below: The validation accuracy a hopeless trial is under (the target less ten points).
        least_epochs: Epochs every trial gets.
        warmup: Epochs after which a trial under `below` is stopped, however it moves.
        target: The validation accuracy the trial must reach (None: only `warmup` applies).
        trend_epochs: Epochs whose gain is extrapolated (0: only `warmup` applies).
        epochs: The fine-tuning's epoch cap.
    """

    below: float
    least_epochs: int
    warmup: int
    target: float | None
    trend_epochs: int
    epochs: int

    def stops(self, best: list[float], value: float) -> bool:
        """Whether a trial is hopeless after the epochs whose best-so-far accuracies are `best`.

        Under `below` past its warm-up; or sooner, past `trend_epochs` and `least_epochs`, when
        even its gain over its last `trend_epochs`, kept up to its cap, would not bring its
        best to the target (a learning curve flattens: the straight line is optimistic).
        """
        step = len(best) - 1
        if value >= self.below:
            return False
        if step >= self.warmup:
            return True
        if self.target is None or not self.trend_epochs or step < max(self.trend_epochs,
                                                                        self.least_epochs):
            return False
        gain = (best[-1] - best[-1 - self.trend_epochs]) / self.trend_epochs
        return best[-1] + gain * (self.epochs - 1 - step) < self.target


class ReportToTrial(keras.callbacks.Callback):
    """A search trial's fine-tuning, stopped once hopeless by the rule its study keeps.

    The rule is in the study's user attributes (`HopelessRule`; `tfopt.search`): Optuna's own
    pruning cannot stop a multi-objective study's trials.
    """

    def __init__(self, trial: TrialRef, from_epoch: int = 0) -> None:
        super().__init__()
        self._ref, self._from_epoch = trial, from_epoch
        self._rule: HopelessRule | None = None
        self._best: list[float] = []
        self.pruned = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Read the rule from the study (it lives in the parent's folder)."""
        import optuna

        rule = optuna.load_study(study_name=self._ref.study, storage=self._ref.storage).user_attrs
        if "hopeless_below" in rule:
            epochs = int((getattr(self, "params", None) or {}).get("epochs") or 0)
            epochs -= self._from_epoch
            least = int(rule["warmup_epochs"])
            warmup = max(least, math.ceil(float(rule.get("warmup_share", 0.0)) * epochs))
            target = rule.get("target")
            self._rule = HopelessRule(
                below=float(rule["hopeless_below"]), least_epochs=least, warmup=warmup,
                target=None if target is None else float(target),
                trend_epochs=int(rule.get("trend_epochs", 0)), epochs=epochs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Stop the training once it is hopeless by the study's rule."""
        value = (logs or {}).get("val_accuracy")
        if value is None or epoch < self._from_epoch or self._rule is None:
            return
        self._best.append(max([float(value), *self._best[-1:]]))
        if self._rule.stops(self._best, float(value)):
            self.pruned = True
            self.model.stop_training = True


def recovery(data: TrainingData, from_epoch: int = 0,
             cool_down: CosineCoolDown | None = None,
             settle: int = SETTLE_EPOCHS) -> list[keras.callbacks.Callback]:
    """A compressed model's fine-tuning ends once back within the budget (`recover_to`).

    Epochs before `from_epoch` (a pruning ramp) do not count; without a target, nothing stops
    it before its epochs but the run's time budget (`TrainingData.deadline`). Back within the
    budget, it ends after `settle` epochs without a gain (a training's whole cap: never before
    it, though whether it came back is still said), or, given a `cool_down` (which then sets
    the rate), once that has brought the rate down to zero. A search trial's fine-tuning also
    stops once hopeless, by its study's rule (`ReportToTrial`).
    """
    callbacks: list[keras.callbacks.Callback] = [] if cool_down is None else [cool_down]
    if data.recover_to is not None or data.deadline is not None:
        callbacks.append(StopWhenDone(target=data.recover_to, from_epoch=from_epoch,
                                      deadline=data.deadline, settle=settle,
                                      cool_down=cool_down, monitor=data.held_out_key()))
    if data.trial is not None:
        callbacks.append(ReportToTrial(data.trial, from_epoch=from_epoch))
    return callbacks


def epochs_run(fitted: Fitted) -> int:
    """The epochs a training ran (its curves' length)."""
    return max((len(values) for values in fitted.curves.values()), default=0)


LearningRate = float | keras.optimizers.schedules.LearningRateSchedule


def steps_per_epoch(data: TrainingData) -> int:
    """Batches in one pass over the training split (the last one may be short)."""
    return math.ceil(data.dataset.splits["train"].examples / data.batch_size)


def cosine_decay(data: TrainingData, epochs: int, learning_rate: float) -> LearningRate:
    """`learning_rate` decayed to zero along a cosine over `epochs` of the training split."""
    return keras.optimizers.schedules.CosineDecay(learning_rate,
                                                  max(1, epochs * steps_per_epoch(data)))


def scheduled_learning_rate(data: TrainingData, epochs: int, learning_rate: float,
                            schedule: str) -> LearningRate:
    """`learning_rate` over `epochs`: ``cosine`` decays it to zero along a cosine, else constant."""
    return cosine_decay(data, epochs, learning_rate) if schedule == "cosine" else learning_rate


def fit(
    model: keras.Model,
    data: TrainingData,
    *,
    epochs: int,
    learning_rate: LearningRate,
    callbacks: list[keras.callbacks.Callback] | None = None,
    best: KeepBestWeights | None = None,
    loss: Any = None,
    teacher: Any = None,
) -> Fitted:
    """Compile `model` for logits and integer labels and train it on the run's pipeline.

    Used for the baseline and for every fine-tuning step (pruning, QAT, the scratch student),
    so they all learn from the same pipeline with the same loss, and all end with their best
    validation epoch's weights. A model of array data learns with its own `loss` (a tf_keras
    loss: `tfopt.models.keras_io.file_loss`), from its ``y`` or a `teacher`'s outputs, and is
    judged by the run's metric.
    """
    if loss is None:
        compile_for_labels(model, learning_rate)
    else:
        model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss)
    return fit_compiled(model, data, epochs=epochs, callbacks=callbacks, best=best,
                        teacher=teacher)


def compile_for_labels(model: keras.Model, learning_rate: LearningRate) -> None:
    """Compile `model` as `fit` trains it: Adam, cross-entropy of logits and integer labels.

    A Keras 3 model is compiled with Keras 3's optimizer and loss (a tf_keras learning-rate
    schedule is carried over by its config).
    """
    module = keras_of(model)
    if module is not keras and isinstance(learning_rate, keras.optimizers.schedules.
                                          LearningRateSchedule):
        learning_rate = module.optimizers.schedules.deserialize(
            keras.optimizers.schedules.serialize(learning_rate))
    model.compile(
        optimizer=module.optimizers.Adam(learning_rate),
        loss=module.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def fit_compiled(
    model: keras.Model,
    data: TrainingData,
    *,
    epochs: int,
    callbacks: list[keras.callbacks.Callback] | None = None,
    best: KeepBestWeights | None = None,
    teacher: Any = None,
) -> Fitted:
    """Train a compiled model (e.g. a distiller with its own loss) on the run's pipeline.

    Before each validation the batch-norm statistics of the model judged (a distiller's
    student) are re-estimated from training images and kept if they score better
    (`tfopt.models.batch_norm`); the curves then hold ``bn_val_accuracy_before`` /
    ``_after`` and ``bn_reestimated`` per epoch.

    Args:
        model: The compiled model; it ends with its best validation epoch's weights.
        data: The run's training data and input settings.
        epochs: Epochs to train.
        callbacks: More Keras callbacks.
        best: How the best epoch is kept (default: any epoch, in memory).
        teacher: On array data, the model whose outputs it learns and is judged against
            (self-distillation); None: the data's ``y``.
    """
    from tfopt.models.batch_norm import reestimating_callback

    train, val, reader = training_data(data, teacher)
    best = best or KeepBestWeights(monitor=data.held_out_key())
    judged = ([HeldOutMetric(data, teacher)] if data.dataset.arrays and val is not None
              else [reestimating_callback(model, data, getattr(model, "student", None))])
    started, clock = time.perf_counter(), EpochClock()
    history = model.fit(train, validation_data=val, epochs=epochs, verbose=0,
                        callbacks=[clock, *(c for c in judged if c is not None),
                                   *(callbacks or []), best])
    curves = {name: [float(v) for v in values] for name, values in history.history.items()}
    judge = next((c for c in callbacks or [] if isinstance(c, StopWhenDone)), None)
    stop = judge.outcome(epochs) if judge is not None else {}
    if any(isinstance(c, ReportToTrial) and c.pruned for c in callbacks or []):
        stop = {**stop, "pruned": True, "stopped_by": Stop.PRUNED,
                "stop_reason": "pruned: hopeless for the search"}
    return Fitted(curves, time.perf_counter() - started, reader, best.best_epoch, stop,
                  clock.seconds)


def kept_epoch(fitted: Fitted) -> int | str:
    """The 1-based epoch whose weights a training kept, as a run parameter ("last" if unjudged)."""
    return "last" if fitted.best_epoch is None else fitted.best_epoch + 1


def evaluate_test_accuracy(model: keras.Model, data: TrainingData) -> float:
    """Top-1 accuracy of a Keras model on the whole test split, scaled for the model."""
    return evaluate_split_accuracy(model, data, "test")


def evaluate_split_metric(model: keras.Model, data: TrainingData, split: str,
                          teacher: Any = None) -> float:
    """The run's metric (``eval``) of a Keras model on a whole split of array data.

    Against a `teacher`'s outputs where it learned from them (`split_inputs`).
    """
    inputs, truth = split_inputs(data.dataset, split, teacher)
    return split_metric(model, inputs, truth, data.metric(), data.judged().output)


def evaluate_split_accuracy(model: keras.Model, data: TrainingData, split: str) -> float:
    """Top-1 accuracy of a Keras model on a whole split, scaled for the model."""
    images, labels = load_split(data.dataset, split, scale=data.input_scale)
    logits = model.predict(images, batch_size=256, verbose=0)
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def resumable_callbacks(
    checkpoint_dir: Path | None, history: bool = True, model: object | None = None,
) -> list[keras.callbacks.Callback]:
    """Per-epoch backup and an appended history log under `checkpoint_dir` (none if None).

    Args:
        checkpoint_dir: The folder; every worker of a multi-worker training passes the same.
        history: Whether this process writes the history (only a multi-worker chief does).
        model: The model they will train: a Keras 3 model is backed up by Keras 3's own
            callbacks (None: a tf_keras model).
    """
    if checkpoint_dir is None:
        return []
    module = keras if model is None else keras_of(model)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    callbacks: list[keras.callbacks.Callback] = [
        module.callbacks.BackupAndRestore(str(checkpoint_dir / "backup"))]
    if history:
        callbacks.append(module.callbacks.CSVLogger(str(checkpoint_dir / HISTORY_NAME),
                                                    append=True))
    return callbacks


def read_history(path: Path) -> dict[str, list[float]]:
    """Per-epoch curves from a CSVLogger file, one value per epoch (the last row wins).

    A line that is not an epoch's numbers (a header written again, a line torn by a kill) is
    ignored, so a leftover never makes the history unreadable.
    """
    by_epoch: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            parsed = _epoch_row(row)
            if parsed is not None:
                by_epoch[parsed[0]] = parsed[1]
    names = sorted({name for values in by_epoch.values() for name in values})
    return {name: [by_epoch[e][name] for e in sorted(by_epoch) if name in by_epoch[e]]
            for name in names}


def _epoch_row(row: dict[str | None, object]) -> tuple[int, dict[str, float]] | None:
    """(epoch, values) of a CSVLogger row, or None for anything else."""
    try:
        values = {str(k): float(str(v)) for k, v in row.items() if k not in ("epoch", None)}
        return int(str(row.get("epoch"))), values
    except (TypeError, ValueError):
        return None


def distribution_strategy(name: str) -> tf.distribute.Strategy:
    """The tf.distribute strategy for training: `mirrored` copies the model to every local GPU.

    Without GPUs MirroredStrategy runs one CPU replica; `none` is TensorFlow's default strategy,
    and so is `multi_worker` in the process that starts the workers (`tfopt.models.multi_worker`).
    """
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


@contextmanager
def precision_policy(policy: str) -> Iterator[None]:
    """Apply a Keras mixed-precision policy while building and training, then restore float32.

    Only zoo networks (tf_keras) train under a policy (`PipelineConfig` says so).
    """
    if policy == "off":
        yield
        return
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")
