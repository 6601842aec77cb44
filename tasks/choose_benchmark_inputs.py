"""Prefect task: what a model benchmarked on its own is measured on: its data, or any inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantSpec
from tfopt.config import EvalConfig
from tfopt.measurement.inputs import feeds_inputs


@task(name="choose_benchmark_inputs", tags=["benchmark"])
def choose_benchmark_inputs(
    spec: VariantSpec, setting: str, shapes: Mapping[str, Sequence[int]], examples: int,
    batch_size: int, data_dir: Path, out_dir: Path, judged_by: EvalConfig,
    referenced: bool = False,
) -> BenchmarkInputs | None:
    """Read the model's signature (in a probe process) and choose its benchmark inputs.

    An image classifier is measured on the data folder's test split (accuracy too); any other
    model (several named inputs, NCHW, integers, a detector's outputs) on inputs generated
    from its signature or on the user's ``.npz``, without data.

    Args:
        spec: The model to benchmark.
        setting: ``auto``, ``data``, ``random``, or a path to an ``.npz`` (see
            ``BenchmarkOnlyConfig.inputs``).
        shapes: One batch-1 request's shape per input whose dimensions the model leaves open.
        examples: Requests to generate.
        batch_size: Batch of the throughput figure.
        data_dir: The data folder (``auto`` uses it for a classifier when it exists).
        out_dir: Where the measuring process writes the inputs it generates.
        judged_by: The metric, scored against an ``.npz``'s ``y`` (or a reference's outputs).
        referenced: A reference model's outputs will be there (``--reference``).

    Returns:
        The inputs, or None: measure on the data folder's test split.
    """
    return feeds_inputs(spec, setting, shapes, examples, batch_size, data_dir, out_dir,
                        judged_by, referenced)
