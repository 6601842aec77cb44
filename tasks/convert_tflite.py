"""Convert a SavedModel to TFLite."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf
from prefect import task

from tasks.export_savedmodel import SIGNATURE_KEY
from tfopt.artifacts import ModelArtifact, Precision, VariantSpec
from tfopt.fileio import atomic_write_bytes


@task(name="convert_tflite", tags=["conversion"])
def convert_tflite(savedmodel: ModelArtifact, precision: Precision, out_dir: Path) -> VariantSpec:
    """Convert the serving signature of a SavedModel to a ``.tflite`` flatbuffer.

    Args:
        savedmodel: The exported SavedModel.
        precision: ``fp32`` (no quantization).
        out_dir: Folder to write ``<source>-tflite-<precision>.tflite`` into.

    Returns:
        The variant to benchmark.

    Raises:
        ValueError: A precision this step does not build.
    """
    if precision != "fp32":
        raise ValueError(f"convert_tflite does not build precision {precision!r} yet")
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(savedmodel.path), signature_keys=[SIGNATURE_KEY]
    )
    flatbuffer = converter.convert()
    name = f"{savedmodel.name}-tflite-{precision}"
    path = out_dir / f"{name}.tflite"
    atomic_write_bytes(path, flatbuffer)
    return VariantSpec(
        name=name, source=savedmodel.name, format="tflite", precision=precision, path=path
    )
