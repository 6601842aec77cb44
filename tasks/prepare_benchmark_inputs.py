"""Prefect task: decode the test split once and record the float model's outputs on it."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, VariantSpec
from tfopt.config import InputScale
from tfopt.measurement.inputs import INPUTS_STEP, prepare_inputs
from tfopt.native import run_native


@task(name="prepare_benchmark_inputs", tags=["benchmark"])
def prepare_benchmark_inputs(
    reference: VariantSpec | None,
    dataset: DatasetArtifact,
    out_dir: Path,
    batch_size: int = 32,
    input_scale: InputScale = "unit",
) -> BenchmarkInputs:
    """Save the decoded test split and the reference model's logits on it as ``.npy`` files.

    Every variant is then benchmarked on the very same arrays (no decoding differences between
    runs or backends), and its agreement is measured against the same reference.

    Args:
        reference: The model whose outputs are the reference (the float baseline's SavedModel in
            the pipeline), or None: each variant is its own reference and no model is opened
            here (the benchmark-only flow opens a user's file only in its measuring process).
        dataset: The data set whose test split is the benchmark input.
        out_dir: Folder for ``test-images.npy``, ``test-labels.npy``,
            ``<name>-reference-logits.npy`` and the harness's floor models.
        batch_size: Batch size of the throughput measurement (besides batch 1).
        input_scale: The pixels the models expect (the same for every variant of a run).

    Returns:
        The files, the number of examples, and the floor models (square images only).

    Raises:
        ValueError: The test split is empty.
    """
    return run_native(INPUTS_STEP, prepare_inputs, reference, dataset, out_dir, batch_size,
                      input_scale)
