"""Prefect task: measure NHWC against NCHW training steps on this device."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import DatasetArtifact, LayoutResult
from tfopt.models.config import ModelConfig
from tfopt.models.step_timing import LAYOUT_STEP, compare_layouts
from tfopt.native import run_native


@task(name="measure_data_layout", tags=["input-pipeline"])
def measure_data_layout(
    dataset: DatasetArtifact, model_cfg: ModelConfig, batch_size: int, steps: int
) -> LayoutResult:
    """Time the same network's training step built NHWC and NCHW, on the same batch.

    TensorFlow's default is NHWC; NCHW is what cuDNN prefers on GPUs. On a CPU build NCHW may
    be unsupported for some ops, or slower: the result says which, for this device. A user's
    model (file or builder) has its layout built in: only its own layout is measured, and the
    note says so.

    Args:
        dataset: Real training examples fill the batch.
        model_cfg: The network (its data_format is overridden for each measurement).
        batch_size: Batch size of the measured steps.
        steps: Timed steps per layout.

    Returns:
        Both throughputs (NCHW None when unsupported), the faster layout and a note.
    """
    return run_native(LAYOUT_STEP, compare_layouts, dataset, model_cfg, batch_size, steps)
