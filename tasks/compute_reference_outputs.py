"""Prefect task: a reference model's outputs on the inputs a model is benchmarked on."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantSpec
from tfopt.measurement.inputs import REFERENCE_STEP, reference_outputs
from tfopt.native import run_native


@task(name="compute_reference_outputs", tags=["benchmark"])
def compute_reference_outputs(reference: VariantSpec, inputs: BenchmarkInputs,
                              out_dir: Path) -> BenchmarkInputs:
    """Run the reference model over the benchmark's feeds, in a child process.

    A fidelity metric then scores the benchmarked model's outputs against the reference's of
    the same name (`tfopt.measurement.worker.score_on_feeds`).

    Args:
        reference: The model whose outputs are the truth (the float model a file came from).
        inputs: The feeds the model is benchmarked on (generated here first if they are to be).
        out_dir: Where ``reference-outputs.npz`` is written.

    Returns:
        The inputs with `BenchmarkInputs.reference_outputs`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_native(REFERENCE_STEP, reference_outputs, reference, inputs, out_dir)
