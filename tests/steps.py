"""Shorthands for calling tfopt's steps directly in tests (the flows plan variants first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.build_variant import build_variant
from tfopt.artifacts import DatasetArtifact, ModelArtifact, Precision, TrainingData, VariantSpec
from tfopt.config import InputConfig
from tfopt.runtimes import plan_variant
from tfopt.runtimes.base import BuildSources


def sources_for(savedmodel: ModelArtifact, dataset: DatasetArtifact, out_dir: Path,
                cfg: Any = None, built: dict[str, VariantSpec] | None = None,
                budget_points: float = 1.0, threads: int = 1) -> BuildSources:
    """What the runtimes convert `savedmodel`'s variants from, as a flow hands it over."""
    return BuildSources(model=savedmodel, savedmodel=savedmodel, dataset=dataset,
                        out_dir=out_dir, built=built or {},
                        calibration_examples=getattr(cfg, "calibration_examples", 200),
                        accuracy_budget_points=budget_points, threads=threads)


def build(spec: VariantSpec, savedmodel: ModelArtifact, dataset: DatasetArtifact, cfg: Any,
          out_dir: Path, **sources: Any) -> VariantSpec:
    """``build_variant`` of a planned variant of `savedmodel`, with `cfg` as its settings."""
    return build_variant.fn(spec, sources_for(savedmodel, dataset, out_dir, cfg, **sources), cfg)


def to_tflite(savedmodel: ModelArtifact, precision: Precision, dataset: DatasetArtifact,
              cfg: Any, out_dir: Path) -> VariantSpec:
    """The planned ``<source>-tflite-<precision>`` variant, built."""
    return build(plan_variant(savedmodel.name, "tflite", precision), savedmodel, dataset, cfg,
                 out_dir)


def to_onnx(savedmodel: ModelArtifact, dataset: DatasetArtifact, cfg: Any,
            out_dir: Path) -> VariantSpec:
    """The planned ``<source>-onnx`` variant, exported and checked."""
    return build(plan_variant(savedmodel.name, "onnx"), savedmodel, dataset, cfg, out_dir)


def training_data(dataset: DatasetArtifact, batch_size: int = 16, seed: int = 0,
                  **input_settings: object) -> TrainingData:
    """The data, batch, seed and input settings a training step takes."""
    return TrainingData(dataset=dataset, batch_size=batch_size, seed=seed,
                        input=InputConfig(**input_settings))
