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
    stopping,
    train_in_scope,
    trained_earlier,
)
from tfopt.models.batch_norm import kept_epoch_figures
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import keras_model_path, load_keras_model, save_keras_model
from tfopt.models.multi_worker import WorkerFailedError, train_on_local_workers
from tfopt.models.training import (
    HISTORY_NAME,
    Fitted,
    KeepBestWeights,
    distribution_strategy,
    epochs_run,
    evaluate_split_accuracy,
    evaluate_test_accuracy,
    fit,
    kept_epoch,
)
from tfopt.native import NativeStep
from tfopt.schedule.budget import Stop
from tfopt.serving import write_labels

TRAIN_STEP = NativeStep(
    "train_model", "the baseline's training in TensorFlow's CPU kernels",
    "TensorFlow's kernels cannot train this model on this CPU: train.epochs: 0 optimizes it as "
    "it is (its conversions and benchmarks need no training)")

STOP_KEYS = ("epochs_run", "converged", "stopped_by", "stop_reason")
"""How a training ended, as its params keep it (`StopWhenDone.outcome`)."""


def train_baseline(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: Path,
    checkpoint_dir: Path | None, deadline: float | None = None,
) -> ModelArtifact:
    """Make the baseline from its source, train it (or reuse a finished training), save it.

    See `tasks.train_model.train_model` for the checkpoint folder's role; `deadline` (a
    `time.time()` value) ends the training in time (its stop reason then says so).
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
            trained = train_in_scope(data, model_cfg, train_cfg, strategy, checkpoint_dir,
                                     deadline=deadline)
            if train_cfg.epochs:
                keep_trained(trained, checkpoint_dir, _builder_code(model_cfg))
        else:
            logger.info("reusing the baseline an earlier run trained with the same data and "
                        "settings (%s)", checkpoint_dir)
    model, fitted, curves = trained
    stopped = training_outcome(fitted, train_cfg)
    logger.info(
        "trained %s for %s epochs in %.1f s (precision policy %s; %s): %s", model.name,
        stopped["epochs_run"], fitted.seconds, train_cfg.mixed_precision,
        stopped["stop_reason"], {name: round(values[-1], 4) for name, values in curves.items()},
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
            **{key: stopped[key] for key in STOP_KEYS},
            "mixed_precision": train_cfg.mixed_precision,
            "distribute": _distribute_param(train_cfg, strategy),
            "parameters": int(model.count_params()),
            "devices": ",".join(d.device_type for d in tf.config.list_physical_devices()),
            **fitted.reader,
        },
        metrics={**metrics, "test_accuracy": evaluate_test_accuracy(model, data),
                 **best_validation(curves, model, data),
                 **kept_epoch_figures(curves, fitted.best_epoch)},
        history=curves,
    )


def training_outcome(fitted: Fitted, train_cfg: TrainConfig) -> dict[str, str | int | bool]:
    """The baseline's training as the summary says it: epochs run, best epoch, converged, why.

    A model taken as it is (``train.epochs: 0``) was not trained here: not judged.
    """
    if not train_cfg.epochs:
        return {"epochs_run": 0, "best_epoch": 0, "converged": False,
                "stopped_by": Stop.NOT_TRAINED,
                "stop_reason": "not trained here: the model is taken as it is (train.epochs: 0)"}
    if fitted.stop:
        return {**{key: fitted.stop[key] for key in STOP_KEYS}, "best_epoch": kept_epoch(fitted)}
    return {"epochs_run": train_cfg.epochs, "best_epoch": kept_epoch(fitted),
            "converged": False, "stopped_by": Stop.CAP,
            "stop_reason": f"fixed: {train_cfg.epochs} epochs"}


def best_validation(curves: dict[str, list[float]], model: object,
                    data: TrainingData) -> dict[str, float]:
    """The kept model's held-out accuracies: ``select_accuracy`` and ``best_val_accuracy``.

    ``select_accuracy`` is the kept epoch's accuracy on the split the training chose on
    (`DatasetArtifact.selection_split`): compressed models' fine-tunings stop against it
    (`recovery_target`). ``best_val_accuracy`` is the validation split's, read once after the
    training where a selection split took the choices: every file is judged against it
    (`kept_val_accuracy`). Without a selection split both are the kept epoch's validation
    figure. A model not trained here (``train.epochs: 0``) is evaluated on the splits instead.
    """
    dataset = data.dataset
    held_out = dataset.selection_split
    values = curves.get("val_accuracy") or []
    figures: dict[str, float] = {}
    if values:
        figures["select_accuracy"] = max(values)
    elif dataset.examples(held_out):
        figures["select_accuracy"] = evaluate_split_accuracy(model, data, held_out)
    if held_out == "val":
        if "select_accuracy" in figures:
            figures["best_val_accuracy"] = figures["select_accuracy"]
    elif dataset.examples("val"):
        figures["best_val_accuracy"] = evaluate_split_accuracy(model, data, "val")
    return figures


def selection_accuracy(baseline: ModelArtifact) -> float | None:
    """The baseline's accuracy on the split trainings choose on (see `best_validation`)."""
    return baseline.metrics.get("select_accuracy", baseline.metrics.get("best_val_accuracy"))


def selection_examples(data: TrainingData) -> int:
    """The examples of the split trainings choose on (`DatasetArtifact.selection_split`)."""
    return data.dataset.examples(data.dataset.selection_split)


ROUNDING = 1e-6
"""Allowed in every comparison with an accuracy target or margin: Keras reports accuracies in
float32, so a model exactly at its target (153 of 157 validation images against the baseline's
155 less two images' margin) can read 0.97452229 against 0.97452232 and be refused. Far below
one image on any split."""


def children_beating(baseline: ModelArtifact, models: list[ModelArtifact],
                     budget_points: float, held_out_examples: int) -> list[str]:
    """The compressed models whose held-out accuracy beats the baseline's beyond the budget.

    Read on the split trainings choose on (`selection_accuracy`, of `held_out_examples`
    images), where each fine-tuning's curve is. A child better than its parent by more than
    `validation_margin` (the budget, at least two images' worth, so one image's luck on a
    small split does not count) says the parent was under-trained: every verdict judged
    against it would flatter the children.

    Returns:
        Each such model as ``name (its accuracy vs the baseline's)``.
    """
    base = selection_accuracy(baseline)
    if base is None or held_out_examples <= 0:
        return []
    margin = validation_margin(budget_points, held_out_examples)
    beating = []
    for model in models:
        curve = model.history.get("val_accuracy") or []
        if curve and max(curve) > base + margin + ROUNDING:
            beating.append(f"{model.name} ({max(curve):.4f} vs {base:.4f})")
    return beating


CONTINUE_STEP = NativeStep(
    "continue_training", "the baseline's further training in TensorFlow's CPU kernels",
    "the verdicts are then judged against the baseline as it was")


def continue_baseline(baseline: ModelArtifact, data: TrainingData, train_cfg: TrainConfig,
                      out_dir: Path, deadline: float | None = None) -> ModelArtifact:
    """Train the baseline further, from where it stopped, until its plateau at a finer step.

    Its compressed children beat it (`children_beating`): it was not converged. The rate is a
    quarter of ``train.learning_rate`` and the best validation epoch is kept; when no epoch
    beats the baseline's own best, the baseline stays as it was (said in its params).

    Returns:
        The baseline, trained further (``continued_epochs``, its curves extended), or as it was.
    """
    model = load_keras_model(baseline.path)
    before = selection_accuracy(baseline)
    before = -1.0 if before is None else before
    fitted = fit(model, data, epochs=train_cfg.epochs, learning_rate=train_cfg.learning_rate / 4,
                 callbacks=stopping(train_cfg.model_copy(update={"stop": "plateau"}), data,
                                    deadline),
                 best=KeepBestWeights())
    gained = best_validation(fitted.curves, model, data)
    ran = epochs_run(fitted)
    if gained.get("select_accuracy", -1.0) <= before:
        step_logger().info("the baseline trained %d more epochs without beating its own "
                           "held-out accuracy %.4f: kept as it was", ran, before)
        return baseline.model_copy(update={"params": {
            **baseline.params, "continued_epochs": ran, "continued_gain": "none"}})
    path = keras_model_path(out_dir, "baseline-continued")
    save_keras_model(model, path)
    curves = {name: [*baseline.history.get(name, []), *values]
              for name, values in fitted.curves.items()}
    epochs = int(baseline.params.get("epochs_run", 0)) + ran
    return baseline.model_copy(update={
        "path": path, "history": curves,
        "params": {**baseline.params, "continued_epochs": ran, "epochs_run": epochs,
                   "converged": bool(fitted.stop.get("converged")),
                   "stopped_by": fitted.stop.get("stopped_by", ""),
                   "stop_reason": f"continued after compression: {fitted.stop['stop_reason']}"},
        "metrics": {**baseline.metrics, **gained,
                    "test_accuracy": evaluate_test_accuracy(model, data)}})


def validation_margin(budget_points: float, val_examples: int) -> float:
    """How far a validation accuracy may sit from the baseline's and still count as equal.

    The accuracy budget, and at least two validation images' worth: the baseline's figure is
    its best epoch on the split, so one image's luck either way is noise, not a verdict.
    """
    return max(budget_points / 100.0, 2.0 / val_examples) if val_examples > 0 else (
        budget_points / 100.0)


def recovery_target(baseline: ModelArtifact, budget_points: float,
                    held_out_examples: int) -> float | None:
    """The held-out accuracy a compressed model's fine-tuning is back within the budget at.

    The baseline's accuracy on the split trainings choose on (`selection_accuracy`, of
    `held_out_examples` images) less `validation_margin`; the files a search converts it to
    are then judged on the validation split against the budget exactly (`kept_val_accuracy`).
    """
    best = selection_accuracy(baseline)
    return None if best is None else (
        best - validation_margin(budget_points, held_out_examples) - ROUNDING)


def epoch_seconds(baseline: ModelArtifact) -> float:
    """The baseline's seconds per training epoch (0: it was not trained here)."""
    epochs = int(baseline.params.get("epochs_run") or 0)
    seconds = float(baseline.metrics.get("train_seconds") or 0.0)
    return seconds / epochs if epochs > 0 else 0.0


def kept_val_accuracy(baseline: ModelArtifact, budget_points: float) -> float | None:
    """The validation accuracy a search trial's file must keep: the champion's rule."""
    best = baseline.metrics.get("best_val_accuracy")
    return None if best is None else best - budget_points / 100.0 - ROUNDING


def array_targets(baseline: ModelArtifact,
                  data: TrainingData) -> tuple[float | None, float | None]:
    """Where a compressed model of array data is back within the budget, and its files keep it.

    The baseline's figures by the run's metric on the split trainings choose on and on
    validation (`tfopt.models.training.held_out_figures`, taken at its import), each less what
    the budget (``eval``, settled) lets a variant give up (a bound budget: the bound), as scores
    (`HELD_OUT_SCORE`: a lower-is-better metric negated): `TrainingData.recover_to` and
    `TrainingData.file_target`. None where the baseline has no such figure.
    """
    budget = data.judged().metric_budget(0.0, class_scores=False)
    metric = budget.metric

    def target(split: str) -> float | None:
        figure = baseline.metrics.get(f"{split}_{metric.name}")
        if figure is None:
            return None
        kept = budget.kept(figure)
        return metric.oriented(kept) - ROUNDING

    return target(data.dataset.selection_split), target("val")


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
