"""Quantization-aware training: fake-quantized fine-tuning, exported for int8 conversion."""

from __future__ import annotations

from pathlib import Path

import tf_keras as keras
from prefect import task

from tasks.export_savedmodel import save_serving_savedmodel
from tasks.keras_models import copy_model, load_keras_model
from tasks.training import evaluate_test_accuracy, fit
from techniques.base import KERAS_ONLY, NotApplicable, Technique, derived_model, is_layer_graph
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import QatConfig
from tfopt.logs import step_logger

SOURCE_NAME = "qat"


def make_quantization_aware(base: keras.Model) -> keras.Model:
    """A copy of `base` with fake-quantization (tfmot's default 8-bit scheme); `base` unchanged.

    Raises:
        NotApplicable: tfmot cannot wrap the model (a subclassed model, layers its scheme has
            no rule for such as Rescaling, or TensorFlow ops called as layers), with the reason.
    """
    import tensorflow_model_optimization as tfmot

    if not is_layer_graph(base):
        raise NotApplicable(f"{base.name} is a subclassed model; tfmot's quantize_model takes "
                            "functional and sequential models only")
    try:
        return tfmot.quantization.keras.quantize_model(copy_model(base))
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:
        raise NotApplicable(
            f"tfmot's 8-bit scheme cannot wrap {base.name}: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}"
        ) from error


@task(name="quantize_aware_train", tags=["compression"])
def quantize_aware_train(
    model: ModelArtifact, cfg: QatConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Fine-tune a fake-quantized copy of the model and export it as a SavedModel.

    The int8 TFLite conversion of this SavedModel takes its ranges from training, so its
    accuracy stays close to the float model's.

    Args:
        model: The trained Keras model (left unchanged).
        cfg: QAT epochs and learning rate.
        data: The run's training data and input settings; the test split measures accuracy.
        out_dir: Folder for ``qat-savedmodel/``.

    Returns:
        The QAT SavedModel (named ``qat``), with the fake-quantized model's test accuracy.
    """
    logger = step_logger()
    keras.utils.set_random_seed(data.seed)
    qat = make_quantization_aware(load_keras_model(model.path))
    fitted = fit(qat, data, epochs=cfg.epochs, learning_rate=cfg.learning_rate)
    accuracy = evaluate_test_accuracy(qat, data)
    logger.info("QAT model test accuracy (fake-quantized): %.4f", accuracy)
    path = out_dir / f"{SOURCE_NAME}-savedmodel"
    save_serving_savedmodel(qat, model.image_size, path, model.class_names)
    return derived_model(
        model, SOURCE_NAME, path, fitted, fmt="savedmodel",
        params={"technique": "quantization-aware training", "scheme": "Default8BitQuantizeScheme",
                "epochs": cfg.epochs, "learning_rate": cfg.learning_rate},
        metrics={"test_accuracy": accuracy},
    )


TECHNIQUE = Technique(
    name="qat", section=QatConfig, accepts=KERAS_ONLY, source_name=lambda _: SOURCE_NAME,
    apply=quantize_aware_train, yields_graph=False, tflite=("int8",),
)
