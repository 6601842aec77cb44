"""Prefect task: the run-off, the contenders for champion timed again side by side.

See `tfopt.measurement.runoff` for why and how.
"""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult
from tfopt.config import BenchmarkConfig
from tfopt.logs import step_logger
from tfopt.measurement.runoff import run_runoff


@task(name="run_off", tags=["benchmark"])
def run_off(results: list[VariantResult], inputs: BenchmarkInputs,
            cfg: BenchmarkConfig) -> Runoff | None:
    """Time the contenders for champion again side by side (see `tfopt.measurement.runoff`).

    A run-off that cannot run (a process that fails) is logged and skipped: the champion is
    then chosen on the variants' own turns, as without one.

    Args:
        results: Every benchmarked variant.
        inputs: The test inputs every variant was timed on.
        cfg: The protocol, `objective`, `accuracy_budget_points` and `runoff_margin`.

    Returns:
        The contenders' round p50s, or None when there was no run-off.
    """
    return run_runoff(results, inputs, cfg, step_logger())
