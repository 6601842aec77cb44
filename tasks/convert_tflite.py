"""Convert a SavedModel to TFLite: fp32, or post-training dynamic-range, float16, int8 or 16x8."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf
from prefect import task

from tasks.input_pipeline import load_split
from tfopt.artifacts import DatasetArtifact, ModelArtifact, Precision, VariantSpec
from tfopt.config import ConvertConfig, InputScale
from tfopt.fileio import atomic_write_bytes
from tfopt.serving import SIGNATURE_KEY, write_labels
from tfopt.variants import built


def representative_images(
    dataset: DatasetArtifact, examples: int, scale: InputScale = "unit"
) -> Iterator[list[np.ndarray]]:
    """Yield calibration inputs one at a time from the training shards, scaled for the model."""
    images, _ = load_split(dataset, "train", examples, scale)
    for image in images:
        yield [image[np.newaxis]]


def serving_converter(savedmodel: Path) -> tf.lite.TFLiteConverter:
    """A TFLite converter for the SavedModel's serving signature (no optimizations set yet)."""
    return tf.lite.TFLiteConverter.from_saved_model(str(savedmodel),
                                                    signature_keys=[SIGNATURE_KEY])


_INTEGER_OPS = {
    "int8": tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
    "int16x8": tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
}


def configure_converter(
    converter: tf.lite.TFLiteConverter,
    precision: Precision,
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    scale: InputScale = "unit",
) -> None:
    """Set the converter's optimizations for one post-training precision."""
    if precision == "fp32":
        return
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if precision == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif precision in ("int8", "int16x8"):
        converter.representative_dataset = lambda: representative_images(
            dataset, cfg.calibration_examples, scale
        )
        converter.target_spec.supported_ops = [_INTEGER_OPS[precision]]
        if precision == "int8" and cfg.int8_io:
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8


@task(name="convert_tflite", tags=["conversion"])
def convert_tflite(
    savedmodel: ModelArtifact,
    variant: VariantSpec,
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    out_dir: Path,
) -> VariantSpec:
    """Convert the serving signature of a SavedModel to a ``.tflite`` flatbuffer.

    Args:
        savedmodel: The exported SavedModel (left unchanged).
        variant: The planned TFLite variant; its precision is ``fp32`` (no quantization),
            ``dynamic`` (int8 weights, float activations), ``float16`` (float16 weights) or
            ``int8`` (integer weights and activations, calibrated on training examples) or
            ``int16x8`` (int16 activations, int8 weights, calibrated likewise). With
            ``sparsity_encoding`` in its params, weights are stored in TFLite's sparse format
            (``Optimize.EXPERIMENTAL_SPARSITY``).
        dataset: Source of the int8 calibration examples (training split).
        cfg: Calibration size and integer input/output choice.
        out_dir: Folder to write ``<variant name>.tflite`` (and ``labels.txt``) into.

    Returns:
        The variant, built.
    """
    converter = serving_converter(savedmodel.path)
    configure_converter(converter, variant.precision, dataset, cfg, savedmodel.input_scale)
    if variant.params.get("sparsity_encoding"):
        converter.optimizations = [*converter.optimizations,
                                   tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    flatbuffer = converter.convert()
    path = out_dir / f"{variant.name}.tflite"
    atomic_write_bytes(path, flatbuffer)
    write_labels(out_dir, dataset.class_names)
    params: dict[str, str | int | float | bool] = {"converter": "TFLiteConverter.from_saved_model"}
    if variant.precision == "int8":
        params.update(calibration_examples=cfg.calibration_examples, int8_io=cfg.int8_io)
    elif variant.precision == "int16x8":
        params.update(calibration_examples=cfg.calibration_examples)
    return built(variant, path, **params)


def int8_kernel_stats(tflite: Path) -> dict[str, float]:
    """Sparsity and most distinct values per output channel of each int8 kernel of a file.

    Each weight tensor is read back from the converted file, as tfmot's own
    collaborative-optimization tests do: what survived quantization (the zeros a pruning kept,
    the values a clustering left), not what the Keras model held. Kernels with one output row
    (depthwise ``[1, h, w, channels]``) are not listed.
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite))
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
