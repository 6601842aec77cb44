"""Quantization-aware training: fake-quantized fine-tuning, exported for int8 conversion.

The same fine-tuning serves the collaborative forms (`techniques.pqat`, `techniques.cqat`):
they only choose another tfmot quantization scheme, one that keeps the zeros or the clusters of
the model they continue from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras
from prefect import task

from tasks.convert_tflite import serving_converter
from tasks.export_savedmodel import save_serving_savedmodel
from tasks.keras_models import copy_model, load_keras_model
from tasks.training import evaluate_test_accuracy, fit
from techniques.base import KERAS_ONLY, NotApplicable, Technique, derived_model, is_layer_graph
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.config import QatConfig
from tfopt.logs import step_logger

SOURCE_NAME = "qat"
DEFAULT_SCHEME = "Default8BitQuantizeScheme"


def make_quantization_aware(base: keras.Model, scheme: object | None = None) -> keras.Model:
    """A copy of `base` with fake-quantization; `base` unchanged.

    Args:
        base: The float model.
        scheme: A tfmot quantization scheme (e.g. ``Default8BitPrunePreserveQuantizeScheme()``);
            None: tfmot's default 8-bit scheme (``quantize_model``).

    Raises:
        NotApplicable: tfmot cannot wrap the model (a subclassed model, layers its scheme has
            no rule for such as Rescaling, or TensorFlow ops called as layers), with the reason.
    """
    import tensorflow_model_optimization as tfmot

    if not is_layer_graph(base):
        raise NotApplicable(f"{base.name} is a subclassed model; tfmot's quantize_model takes "
                            "functional and sequential models only")
    quantization = tfmot.quantization.keras
    try:
        if scheme is None:
            return quantization.quantize_model(copy_model(base))
        return quantization.quantize_apply(quantization.quantize_annotate_model(copy_model(base)),
                                           scheme)
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:
        raise NotApplicable(
            f"tfmot's 8-bit scheme cannot wrap {base.name}: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}"
        ) from error


def int8_kernel_stats(savedmodel: Path) -> dict[str, float]:
    """Sparsity and most distinct values per output channel of each int8 kernel, read back.

    The SavedModel is converted to int8 TFLite and each weight tensor read back from the
    converted file, as tfmot's own collaborative-optimization tests do: what survived
    quantization, not what the Keras model held. Kernels with one output row (depthwise
    ``[1, h, w, channels]``) are not listed.
    """
    from ai_edge_litert.interpreter import Interpreter

    converter = serving_converter(savedmodel)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    interpreter = Interpreter(model_content=converter.convert())
    stats: dict[str, float] = {}
    for detail in interpreter.get_tensor_details():
        shape = detail["shape"]
        if np.dtype(detail["dtype"]) != np.int8 or len(shape) not in (2, 4) or shape[0] < 2:
            continue
        try:
            weights = interpreter.get_tensor(detail["index"])
        except ValueError:  # an activation, not a constant
            continue
        parts = detail["name"].split(";")[0].split("/")
        layer = (parts[-2] if len(parts) > 1 else parts[0]).removeprefix("quant_")
        stats[f"int8_sparsity.{layer}"] = float(np.mean(weights == 0))
        stats[f"int8_values_per_channel.{layer}"] = float(max(
            len(np.unique(channel)) for channel in weights))
    return stats


def train_quantization_aware(
    model: ModelArtifact, cfg: QatConfig, data: TrainingData, out_dir: Path, *,
    source: str, scheme: Callable[[], object] | None = None,
    scheme_name: str = DEFAULT_SCHEME, technique: str = "quantization-aware training",
) -> ModelArtifact:
    """Fine-tune a fake-quantized copy of `model` and export it as the SavedModel ``source``."""
    logger = step_logger()
    keras.utils.set_random_seed(data.seed)
    qat = make_quantization_aware(load_keras_model(model.path),
                                  None if scheme is None else scheme())
    fitted = fit(qat, data, epochs=cfg.epochs, learning_rate=cfg.learning_rate)
    accuracy = evaluate_test_accuracy(qat, data)
    logger.info("%s test accuracy (fake-quantized): %.4f", source, accuracy)
    path = out_dir / f"{source}-savedmodel"
    save_serving_savedmodel(qat, model.image_size, path, model.class_names)
    kept = {} if scheme is None else int8_kernel_stats(path)
    if kept:
        logger.info("%s: read back from its int8 TFLite: %s", source,
                    {key: round(value, 3) for key, value in kept.items()})
    return derived_model(
        model, source, path, fitted, fmt="savedmodel",
        params={"technique": technique, "scheme": scheme_name, "starts_from": model.name,
                "epochs": cfg.epochs, "learning_rate": cfg.learning_rate},
        metrics={"test_accuracy": accuracy, **kept},
    )


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
    return train_quantization_aware(model, cfg, data, out_dir, source=SOURCE_NAME)


TECHNIQUE = Technique(
    name="qat", section=QatConfig, accepts=KERAS_ONLY, source_name=lambda _: SOURCE_NAME,
    apply=quantize_aware_train, yields_graph=False, tflite=("int8",),
)
