"""Quantization-aware training: fake-quantized fine-tuning, exported for int8 conversion.

Before the fine-tuning, the activation ranges are set from training images
(`tfopt.models.quantization_ranges`): tfmot starts them at [-6, 6] and a few epochs on a small
data set do not move them far from there. Each validation sees batch-norm statistics
re-estimated (`tfopt.models.batch_norm`), as every fine-tuning's does.

The same fine-tuning serves the collaborative forms (`techniques.pqat`, `techniques.cqat`): they
only choose another tfmot quantization scheme, one that keeps the zeros or the clusters of the
model they continue from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import tf_keras as keras
from prefect import task
from pydantic import Field

from techniques.base import (
    KERAS_ONLY,
    NotApplicable,
    Technique,
    TechniqueSection,
    derived_model,
    own_signature_savedmodel,
    tfmot_model,
    tuning_of,
)
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.models.keras_io import copy_model, is_layer_graph
from tfopt.models.quantization_ranges import CALIBRATION_IMAGES, calibrate_ranges
from tfopt.models.serving_export import save_serving_savedmodel
from tfopt.models.training import fit, recovery, split_inputs


class QatConfig(TechniqueSection):
    """Quantization-aware fine-tuning (tfmot ``quantize_model``), then int8 TFLite."""

    epochs: int = Field(2, ge=1, le=1000, description="Quantization-aware fine-tuning epochs.")
    learning_rate: float = Field(
        5e-4, gt=0.0, le=1.0, description="Adam learning rate of the QAT fine-tuning."
    )
    unsupported_layers: Literal["float", "skip"] = Field(
        "float",
        description=(
            "Layers tfmot's 8-bit scheme has no rule for (Rescaling, TensorFlow ops such as "
            "MobileNetV3's hard-swish): float trains them without fake quantization (named in "
            "the run's float_layers; the int8 converter calibrates them like post-training "
            "int8), skip skips the technique."
        ),
    )

SOURCE_NAME = "qat"
DEFAULT_SCHEME = "Default8BitQuantizeScheme"


def make_quantization_aware(base: keras.Model, scheme: object | None = None,
                            unsupported_layers: str = "skip") -> tuple[keras.Model, list[str]]:
    """A copy of `base` with fake-quantization, and the layers left in float; `base` unchanged.

    Args:
        base: The float model.
        scheme: A tfmot quantization scheme (e.g. ``Default8BitPrunePreserveQuantizeScheme()``);
            None: tfmot's default 8-bit scheme.
        unsupported_layers: ``float``: when the scheme refuses the whole model, annotate only
            the layers tfmot's 8-bit registry supports (tfmot's "quantize some layers") and
            leave the others in float; ``skip``: refuse.

    Raises:
        NotApplicable: tfmot cannot wrap the model (a subclassed model, or with ``skip`` layers
            its scheme has no rule for such as Rescaling or TensorFlow ops called as layers),
            with the reason.
    """
    import tensorflow_model_optimization as tfmot

    if not is_layer_graph(base):
        raise NotApplicable(f"{base.name} is a subclassed model; tfmot's quantize_model takes "
                            "functional and sequential models only")
    quantization = tfmot.quantization.keras
    apply = (quantization.quantize_apply if scheme is None
             else lambda annotated: quantization.quantize_apply(annotated, scheme))
    try:
        return _in_order(base, apply(quantization.quantize_annotate_model(copy_model(base)))), []
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:
        refusal = (f"tfmot's 8-bit scheme cannot wrap {base.name}: {type(error).__name__}: "
                   f"{str(error).splitlines()[0][:300]}")
        if unsupported_layers != "float":
            raise NotApplicable(refusal) from error
    try:
        annotated, floats = _annotate_supported(base)
        quantized = apply(annotated)
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:
        raise NotApplicable(f"{refusal}; with only its supported layers quantized: "
                            f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                            ) from error
    return _in_order(base, quantized), floats


def _in_order(base: keras.Model, quantized: keras.Model) -> keras.Model:
    """`quantized`, once each Concatenate of `base` is seen to take its inputs in their order.

    tfmot's ``quantize_apply`` can rebuild a Concatenate with its inputs in another order
    (tensorflow/model-optimization#1061, seen with a model input beside a layer's output): the
    fake-quantized model would then compute something else than `base`, silently.

    Raises:
        NotApplicable: A Concatenate whose inputs were reordered (named).
    """
    def inbound(model: keras.Model) -> dict[str, list[str]]:
        graph = {}
        for layer in model.get_config()["layers"]:
            node = (layer.get("inbound_nodes") or [[]])[0]  # its first call's inputs
            entries = [node] if node and isinstance(node[0], str) else node  # one, or a list
            graph[layer["name"]] = [entry[0] for entry in entries
                                    if isinstance(entry, list | tuple) and entry]
        return graph

    def stands_for(name: str, graph: dict[str, list[str]]) -> str:
        while name.startswith("quantize_layer") and graph.get(name):  # an input's quantizer
            name = graph[name][0]
        return name.removeprefix("quant_")

    original, rebuilt = inbound(base), inbound(quantized)
    for layer in base.layers:
        twin = next((name for name in (f"quant_{layer.name}", layer.name) if name in rebuilt),
                    None)
        if type(layer).__name__ != "Concatenate" or twin is None:
            continue
        if [stands_for(name, rebuilt) for name in rebuilt[twin]] != original[layer.name]:
            raise NotApplicable(
                f"tfmot's quantize_apply reorders the inputs of {layer.name} (a Concatenate: "
                "tensorflow/model-optimization#1061); its fake-quantized model would compute "
                "something else")
    return quantized


def _annotate_supported(base: keras.Model) -> tuple[keras.Model, list[str]]:
    """A copy of `base` whose layers tfmot's 8-bit registry supports are annotated; the rest."""
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry,
    )

    registry = default_8bit_quantize_registry.Default8BitQuantizeRegistry()
    floats: list[str] = []

    def annotate(layer: keras.layers.Layer) -> keras.layers.Layer:
        if registry.supports(layer):
            return tfmot.quantization.keras.quantize_annotate_layer(layer)
        if not isinstance(layer, keras.layers.InputLayer):
            floats.append(layer.name)
        return layer

    return keras.models.clone_model(copy_model(base), clone_function=annotate), floats


def train_quantization_aware(
    model: ModelArtifact, cfg: QatConfig, data: TrainingData, out_dir: Path, *,
    source: str, scheme: Callable[[], object] | None = None,
    scheme_name: str = DEFAULT_SCHEME, technique: str = "quantization-aware training",
) -> ModelArtifact:
    """Fine-tune a fake-quantized copy of `model` and export it as the SavedModel ``source``."""
    logger = step_logger()
    keras.utils.set_random_seed(data.seed)
    base, translation = tfmot_model(model, data)
    tuning = tuning_of(model, base, data, source)
    qat, floats = make_quantization_aware(base, None if scheme is None else scheme(),
                                          cfg.unsupported_layers)
    calibrated = calibrate_from_training(qat, base, data)
    logger.info("%s: %d activation ranges set from %d training images before the fine-tuning "
                "(tfmot starts them at [-6, 6])", source, len(calibrated), CALIBRATION_IMAGES)
    if floats:
        logger.info("%s: %d layers tfmot's 8-bit scheme has no rule for train in float "
                    "(unsupported_layers: float), calibrated by the int8 converter: %s", source,
                    len(floats), ", ".join(floats[:12]) + (" ..." if len(floats) > 12 else ""))
    fitted = fit(qat, data, epochs=cfg.epochs, learning_rate=cfg.learning_rate,
                 callbacks=recovery(data), loss=tuning.loss, teacher=tuning.teacher)
    figures = tuning.test_figures(qat, data)
    logger.info("%s on test (fake-quantized): %s", source,
                ", ".join(f"{name} {value:.4f}" for name, value in figures.items()))
    path = out_dir / f"{source}-savedmodel"
    if tuning.arrays:
        own_signature_savedmodel(qat, model, path)
    else:
        save_serving_savedmodel(qat, model.image_size, path, model.class_names, model.channels)
    return derived_model(
        model, source, path, fitted, fmt="savedmodel",
        params={"technique": technique, "scheme": scheme_name, "starts_from": model.name,
                "epochs": cfg.epochs, "learning_rate": cfg.learning_rate,
                "float_layers": ",".join(floats)[:500] or "none",
                "ranges_calibrated": len(calibrated), **tuning.params()},
        metrics={**figures, "float_layer_count": float(len(floats))},
        translation=translation,
    )


def calibrate_from_training(qat: keras.Model, base: keras.Model, data: TrainingData) -> list[str]:
    """Set the fake-quantized model's activation ranges from training images (see the module).

    Array data: its training split's first inputs.

    Returns:
        The layers whose output ranges were set.
    """
    from tfopt.data.pipeline import load_split

    if data.dataset.arrays:
        inputs, _ = split_inputs(data.dataset, "train", limit=CALIBRATION_IMAGES)
    else:
        inputs, _ = load_split(data.dataset, "train", CALIBRATION_IMAGES, data.input_scale)
    return calibrate_ranges(qat, base, inputs)


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
    apply=quantize_aware_train, yields_graph=False, precisions=("int8",), on_arrays=True,
)
