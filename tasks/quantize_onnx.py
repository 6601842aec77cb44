"""Quantize the exported ONNX model with ONNX Runtime's own tools.

What a user who serves with ONNX Runtime would pick instead of a TFLite int8 file, measured in
the same table: ``quantize_dynamic`` (int8 weights, activations quantized at every call) and
``quantize_static`` in QDQ format, calibrated on the same training images as TFLite's int8.
Activations are uint8 and weights per-channel int8 (U8S8), the combination ONNX Runtime's x86
integer kernels are built for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from prefect import task

from tasks.convert_tflite import representative_images
from tfopt.artifacts import DatasetArtifact, VariantSpec
from tfopt.config import ConvertConfig, InputScale
from tfopt.variants import built


class _Calibration(CalibrationDataReader):
    """ONNX Runtime's calibration reader over the representative images."""

    def __init__(self, input_name: str, images: Iterator[list[np.ndarray]]) -> None:
        self._feeds = ({input_name: batch[0]} for batch in images)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize_onnx_file(
    source: Path, output: Path, precision: str, calibration: Iterator[list[np.ndarray]] | None,
) -> dict[str, str | int | float | bool]:
    """Write the quantized form of `source` to `output` atomically; return how it was made.

    The model is pre-processed first (shape inference and graph optimization), as ONNX Runtime
    recommends before quantizing.
    """
    prepared = output.with_name(f".{output.stem}.pre.onnx")
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        if precision == "dynamic":
            quantize_dynamic(prepared, tmp, weight_type=QuantType.QInt8)
            how: dict[str, str | int | float | bool] = {
                "quantizer": "onnxruntime.quantization.quantize_dynamic", "weights": "int8"}
        else:
            if calibration is None:
                raise ValueError("static int8 quantization needs calibration images")
            session = ort.InferenceSession(str(prepared), providers=["CPUExecutionProvider"])
            reader = _Calibration(session.get_inputs()[0].name, calibration)
            quantize_static(prepared, tmp, reader, quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            per_channel=True)
            how = {"quantizer": "onnxruntime.quantization.quantize_static",
                   "quant_format": "QDQ", "activations": "uint8",
                   "weights": "int8 per-channel"}
        tmp.replace(output)
    finally:
        prepared.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return how


@task(name="quantize_onnx", tags=["conversion"])
def quantize_onnx(
    onnx_variant: VariantSpec,
    variant: VariantSpec,
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    out_dir: Path,
    scale: InputScale = "unit",
) -> VariantSpec:
    """Quantize the float ONNX variant with ONNX Runtime: ``dynamic`` or static ``int8``.

    Args:
        onnx_variant: The exported, checked float ONNX variant (left unchanged).
        variant: The planned quantized variant (its precision chooses the method).
        dataset: Source of the calibration images (training split).
        cfg: Calibration size.
        out_dir: Folder to write ``<variant name>.onnx`` into.
        scale: Pixels the model expects.

    Returns:
        The variant, built.
    """
    if onnx_variant.path is None:
        raise ValueError(f"{onnx_variant.name} has no file to quantize")
    path = out_dir / f"{variant.name}.onnx"
    calibration = (None if variant.precision == "dynamic" else
                   representative_images(dataset, cfg.calibration_examples, scale))
    how = quantize_onnx_file(onnx_variant.path, path, variant.precision, calibration)
    if calibration is not None:
        how["calibration_examples"] = cfg.calibration_examples
    return built(variant, path, **how)
