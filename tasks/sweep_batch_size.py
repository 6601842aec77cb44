"""Prefect task: choose the training batch size by measurement (throughput, latency, memory)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import BatchSweepResult, DatasetArtifact
from tfopt.config import InputConfig
from tfopt.models.config import ModelConfig
from tfopt.models.step_timing import SWEEP_STEP, sweep_batch_sizes
from tfopt.native import run_native


@task(name="sweep_batch_size", tags=["input-pipeline"])
def sweep_batch_size(
    dataset: DatasetArtifact, model_cfg: ModelConfig, cfg: InputConfig, out_dir: Path,
    deadline: float | None = None,
) -> BatchSweepResult:
    """Measure training-step throughput, latency and memory per batch size; apply the rule.

    A model tfopt does not train (a SavedModel, .tflite or .onnx file) is not swept: the result
    says so and holds the first configured batch size.

    Args:
        dataset: Real training examples fill the measured batches.
        model_cfg: The network being trained.
        cfg: Batch sizes, steps, tolerance and memory budget.
        out_dir: Folder for the plot.
        deadline: No batch size is started after it (the run's time budget; None: no limit).

    Returns:
        Every point, the chosen batch size, the rule, and the plot's path.
    """
    return run_native(SWEEP_STEP, sweep_batch_sizes, dataset, model_cfg, cfg, out_dir, deadline)
