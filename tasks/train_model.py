"""Train the baseline network on the TFRecord shards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras
from prefect import task

from tasks.input_pipeline import reader_options, tuned_dataset
from tasks.model_zoo import build_model
from tfopt.artifacts import DatasetArtifact, ModelArtifact
from tfopt.config import InputConfig, ModelConfig, TrainConfig
from tfopt.logs import step_logger
from tfopt.orchestration import StepProgress


def keras_model_path(out_dir: Path, name: str) -> Path:
    """Where a Keras model named `name` is saved."""
    return out_dir / f"{name}.keras"


def save_keras_model(model: keras.Model, path: Path) -> None:
    """Save a Keras model atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.keras")
    model.save(tmp)
    tmp.replace(path)


def load_keras_model(path: Path) -> keras.Model:
    """Load a saved Keras model without unsafe deserialization (no arbitrary lambdas).

    Quantization-aware models carry tfmot's layer classes, so they are loaded in its scope.
    """
    import tensorflow_model_optimization as tfmot

    with tfmot.quantization.keras.quantize_scope():
        return keras.models.load_model(path, compile=False, safe_mode=True)


def copy_model(model: keras.Model) -> keras.Model:
    """An independent copy of a model: new variables holding the same weights.

    tfmot's wrappers reuse the wrapped layers' variables, so a technique that must not change
    its input works on a copy.
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def training_data(
    dataset: DatasetArtifact, batch_size: int, seed: int, input_cfg: InputConfig | None = None
) -> tuple[tf.data.Dataset, tf.data.Dataset | None]:
    """The tuned training pipeline and the validation pipeline (None without a val split)."""
    input_cfg = input_cfg or InputConfig()
    train_options, _ = reader_options(dataset, "train", input_cfg, training=True)
    train = tuned_dataset(dataset.splits["train"].files, dataset.image_size, batch_size,
                          training=True, seed=seed, options=train_options,
                          examples_hint=dataset.splits["train"].examples)
    if not dataset.splits["val"].files:
        return train, None
    val_options, _ = reader_options(dataset, "val", input_cfg, training=False)
    val = tuned_dataset(dataset.splits["val"].files, dataset.image_size, batch_size,
                        options=val_options, examples_hint=dataset.splits["val"].examples)
    return train, val


def fit(
    model: keras.Model,
    dataset: DatasetArtifact,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    callbacks: list[keras.callbacks.Callback] | None = None,
    input_cfg: InputConfig | None = None,
) -> tuple[dict[str, list[float]], float]:
    """Compile `model` for logits and integer labels, train it, and return its curves and seconds.

    Used for the baseline and for every fine-tuning step (pruning, QAT, the scratch student),
    so they all learn from the same pipeline with the same loss.
    """
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    train, val = training_data(dataset, batch_size, seed, input_cfg)
    started = time.perf_counter()
    history = model.fit(train, validation_data=val, epochs=epochs, verbose=0,
                        callbacks=callbacks or [])
    curves = {name: [float(v) for v in values] for name, values in history.history.items()}
    return curves, time.perf_counter() - started


def evaluate_test_accuracy(model: keras.Model, dataset: DatasetArtifact) -> float:
    """Top-1 accuracy of a Keras model on the whole test split."""
    from tasks.input_pipeline import load_split_arrays

    images, labels = load_split_arrays(dataset.splits["test"].files, dataset.image_size)
    logits = model.predict(images, batch_size=256, verbose=0)
    return float(np.mean(np.argmax(logits, axis=1) == labels))


@task(name="train_model", tags=["training"])
def train_model(
    dataset: DatasetArtifact,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    batch_size: int,
    out_dir: Path,
    input_cfg: InputConfig | None = None,
    checkpoint_dir: Path | None = None,
) -> ModelArtifact:
    """Train the baseline network and save it as ``baseline.keras``.

    With `checkpoint_dir`, training state is backed up at every epoch end
    (`BackupAndRestore`) and each finished epoch is appended to ``history.csv`` there: a run
    killed mid-training resumes from its last finished epoch, and its curves hold every epoch
    exactly once.

    Args:
        dataset: The sharded data set (train and val splits are used).
        model_cfg: Which network to build.
        train_cfg: Epochs, learning rate, seed, precision policy.
        batch_size: Training batch size (from the config or the measured sweep).
        out_dir: Folder for the saved model.
        input_cfg: Reader settings (cache budget, crops, determinism); defaults if None.
        checkpoint_dir: Folder for the backup and history, stable across reruns of the same
            data and config (None: no resumption).

    Returns:
        The saved model with its final metrics and per-epoch history.
    """
    logger = step_logger()
    keras.utils.set_random_seed(train_cfg.seed)
    strategy = distribution_strategy(train_cfg.distribute)
    with precision_policy(train_cfg.mixed_precision), strategy.scope():
        model = build_baseline(model_cfg, dataset)
        curves, train_seconds = fit(
            model, dataset, epochs=train_cfg.epochs, learning_rate=train_cfg.learning_rate,
            batch_size=batch_size, seed=train_cfg.seed, input_cfg=input_cfg,
            callbacks=[*resumable_callbacks(checkpoint_dir),
                       EpochProgress(StepProgress("train-baseline", "epochs trained"),
                                     train_cfg.epochs)],
        )
    if checkpoint_dir is not None:
        curves = read_history(checkpoint_dir / HISTORY_NAME)
    if train_cfg.mixed_precision != "off":
        # Variables stay float32 under a mixed policy; a float32 twin carries them into export
        # and conversion without the policy's casts (TFLite has no bfloat16 kernels).
        float_model = build_baseline(model_cfg, dataset)
        float_model.set_weights(model.get_weights())
        model = float_model
    logger.info(
        "trained %s for %d epochs in %.1f s (precision policy %s): %s", model.name,
        train_cfg.epochs, train_seconds, train_cfg.mixed_precision,
        {name: round(values[-1], 4) for name, values in curves.items()},
    )
    path = keras_model_path(out_dir, "baseline")
    save_keras_model(model, path)
    metrics = {f"final_{name}": values[-1] for name, values in curves.items()}
    metrics["train_seconds"] = train_seconds
    return ModelArtifact(
        name="baseline",
        path=path,
        format="keras",
        image_size=dataset.image_size,
        num_classes=dataset.num_classes,
        params={
            "architecture": model_cfg.architecture,
            "width": model_cfg.width,
            "alpha": model_cfg.alpha,
            "data_format": model_cfg.data_format,
            "batch_size": batch_size,
            "epochs": train_cfg.epochs,
            "mixed_precision": train_cfg.mixed_precision,
            "distribute": f"{train_cfg.distribute} ({strategy.num_replicas_in_sync} replicas)",
            "parameters": int(model.count_params()),
            "devices": ",".join(d.device_type for d in tf.config.list_physical_devices()),
        },
        metrics={**metrics, "test_accuracy": evaluate_test_accuracy(model, dataset)},
        history=curves,
    )


HISTORY_NAME = "history.csv"


class EpochProgress(keras.callbacks.Callback):
    """Moves a Prefect progress artifact at every finished epoch (resumed runs included)."""

    def __init__(self, progress: StepProgress, epochs: int) -> None:
        super().__init__()
        self._progress, self._epochs = progress, epochs

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Report `epoch + 1` of the planned epochs as done."""
        self._progress.update(epoch + 1, self._epochs)


def resumable_callbacks(checkpoint_dir: Path | None) -> list[keras.callbacks.Callback]:
    """Per-epoch backup and an appended history log under `checkpoint_dir` (none if None)."""
    if checkpoint_dir is None:
        return []
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    return [
        keras.callbacks.BackupAndRestore(str(checkpoint_dir / "backup")),
        keras.callbacks.CSVLogger(str(checkpoint_dir / HISTORY_NAME), append=True),
    ]


def read_history(path: Path) -> dict[str, list[float]]:
    """Per-epoch curves from a CSVLogger file, one value per epoch (the last row wins)."""
    import csv

    by_epoch: dict[int, dict[str, str]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            by_epoch[int(row["epoch"])] = row
    names = [name for name in next(iter(by_epoch.values()), {}) if name != "epoch"]
    return {name: [float(by_epoch[e][name]) for e in sorted(by_epoch)] for name in names}


def build_baseline(model_cfg: ModelConfig, dataset: DatasetArtifact) -> keras.Model:
    """The configured zoo network for this data set's image size and classes."""
    return build_model(
        model_cfg.architecture, dataset.image_size, dataset.num_classes, width=model_cfg.width,
        alpha=model_cfg.alpha, data_format=model_cfg.data_format,
    )


def distribution_strategy(name: str) -> tf.distribute.Strategy:
    """The tf.distribute strategy for training: `mirrored` copies the model to every local GPU.

    Without GPUs MirroredStrategy runs one CPU replica; `none` is TensorFlow's default strategy.
    """
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


@contextmanager
def precision_policy(policy: str) -> Iterator[None]:
    """Apply a Keras mixed-precision policy while building and training, then restore float32."""
    if policy == "off":
        yield
        return
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")
