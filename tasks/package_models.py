"""Prefect task: package every variant as an MLflow Model (see `tfopt.packaging`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import task

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult
from tfopt.logs import step_logger
from tfopt.packaging import package_variants, serving_example
from tfopt.runtimes.base import ServingContract


@task(name="package_models", tags=["export"])
def package_models(
    variants: Sequence[VariantResult], inputs: BenchmarkInputs, class_names: Sequence[str],
    input_scale: str, out_dir: Path, threads: int = 1, runoff: Runoff | None = None,
) -> dict[str, Path]:
    """Write every ok variant as an MLflow Model folder under `out_dir`, named after it.

    A variant that cannot be packaged is logged and left out (its raw file is uploaded
    instead); a folder left by an earlier attempt of the same run is reused.

    Args:
        variants: The benchmarked variants.
        inputs: The benchmark inputs; their first two images, or rows of each named input
            (array data), are the input example.
        class_names: The data's classes, in output order.
        input_scale: The run's ``model.input_scale``.
        out_dir: Parent folder of the model folders.
        threads: The threads a LiteRT model serves with (``benchmark.threads``: as measured).
        runoff: The run-off, whose thread count per contender (`Runoff.threads`) overrides it.

    Returns:
        Variant name to its MLflow Model folder.
    """
    contract = ServingContract(class_names, input_scale, serving_example(inputs), threads)
    return package_variants(variants, contract, out_dir, step_logger(),
                            runoff.threads if runoff else None)

