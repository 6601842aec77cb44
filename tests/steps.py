"""Shorthands for calling tfopt's steps directly in tests (the flows plan variants first)."""

from __future__ import annotations

from pathlib import Path

from tasks.convert_tflite import convert_tflite
from tasks.export_onnx import export_onnx
from tfopt.artifacts import DatasetArtifact, ModelArtifact, Precision, TrainingData, VariantSpec
from tfopt.config import ConvertConfig, InputConfig
from tfopt.variants import plan_variant


def to_tflite(savedmodel: ModelArtifact, precision: Precision, dataset: DatasetArtifact,
              cfg: ConvertConfig, out_dir: Path) -> VariantSpec:
    """``convert_tflite`` of the planned ``<source>-tflite-<precision>`` variant."""
    return convert_tflite.fn(savedmodel, plan_variant(savedmodel.name, "tflite", precision),
                             dataset, cfg, out_dir)


def to_onnx(savedmodel: ModelArtifact, dataset: DatasetArtifact, cfg: ConvertConfig,
            out_dir: Path) -> VariantSpec:
    """``export_onnx`` of the planned ``<source>-onnx`` variant."""
    return export_onnx.fn(savedmodel, plan_variant(savedmodel.name, "onnx"), dataset, cfg,
                          out_dir)


def training_data(dataset: DatasetArtifact, batch_size: int = 16, seed: int = 0,
                  **input_settings: object) -> TrainingData:
    """The data, batch, seed and input settings a training step takes."""
    return TrainingData(dataset=dataset, batch_size=batch_size, seed=seed,
                        input=InputConfig(**input_settings))
