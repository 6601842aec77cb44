"""Quantization-aware training: fake-quantized fine-tuning, exported for int8 conversion."""

from __future__ import annotations

from pathlib import Path

import tf_keras as keras
from prefect import task

from tasks.export_savedmodel import save_serving_savedmodel
from tasks.train_model import copy_model, evaluate_test_accuracy, fit, load_keras_model
from tfopt.artifacts import DatasetArtifact, ModelArtifact
from tfopt.config import CompressConfig
from tfopt.logs import step_logger


def make_quantization_aware(base: keras.Model) -> keras.Model:
    """A copy of `base` with fake-quantization (tfmot's default 8-bit scheme); `base` unchanged."""
    import tensorflow_model_optimization as tfmot

    return tfmot.quantization.keras.quantize_model(copy_model(base))


@task(name="quantize_aware_train", tags=["compression"])
def quantize_aware_train(
    model: ModelArtifact,
    dataset: DatasetArtifact,
    cfg: CompressConfig,
    batch_size: int,
    seed: int,
    out_dir: Path,
) -> ModelArtifact:
    """Fine-tune a fake-quantized copy of the model and export it as a SavedModel.

    The int8 TFLite conversion of this SavedModel takes its ranges from training, so its
    accuracy stays close to the float model's.

    Args:
        model: The trained Keras model (left unchanged).
        dataset: Training data for fine-tuning; the test split measures accuracy.
        cfg: QAT epochs and learning rate.
        batch_size: Fine-tuning batch size.
        seed: Seed for shuffling.
        out_dir: Folder for ``qat-savedmodel/``.

    Returns:
        The QAT SavedModel (named ``qat``), with the fake-quantized model's test accuracy.
    """
    logger = step_logger()
    keras.utils.set_random_seed(seed)
    qat = make_quantization_aware(load_keras_model(model.path))
    curves, _ = fit(qat, dataset, epochs=cfg.qat_epochs, learning_rate=cfg.finetune_learning_rate,
                    batch_size=batch_size, seed=seed)
    accuracy = evaluate_test_accuracy(qat, dataset)
    logger.info("QAT model test accuracy (fake-quantized): %.4f", accuracy)
    path = out_dir / "qat-savedmodel"
    save_serving_savedmodel(qat, model.image_size, path)
    return ModelArtifact(
        name="qat",
        path=path,
        format="savedmodel",
        image_size=model.image_size,
        num_classes=model.num_classes,
        params={"technique": "quantization-aware training", "scheme": "Default8BitQuantizeScheme",
                "qat_epochs": cfg.qat_epochs},
        metrics={"test_accuracy": accuracy},
        history=curves,
    )
