"""Prefect task: time each suspected slowdown's previous file beside this run's, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantResult
from tfopt.config import MeasurementProtocol
from tfopt.measurement.confirm import confirm_all


@task(name="confirm_slowdowns", tags=["benchmark"])
def confirm_slowdowns(moves: list[dict[str, Any]], previous_run_id: str, tracking_uri: str,
                      results: list[VariantResult], inputs: BenchmarkInputs,
                      protocol: MeasurementProtocol, scratch: Path,
                      deadline: float | None = None,
                      first_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Confirm or clear each slowdown beyond the run-to-run noise since the last run.

    The previous run's file and this run's are timed in alternating rounds in one process,
    holding the machine's benchmark slot (`tfopt.measurement.confirm`); a slowdown counts only
    when their intervals are apart and the ratio is beyond the minimum change. A previous file
    that is gone leaves a stricter magnitude rule, said as such.

    Args:
        moves: The slowdowns to confirm (`tfopt.report.compare.to_confirm`).
        previous_run_id: The config's last finished run (its variants' files).
        tracking_uri: The MLflow server.
        results: This run's measured variants.
        inputs: This run's benchmark inputs.
        protocol: The benchmark protocol.
        scratch: Folder for the previous run's files.
        deadline: The run's time budget's end (None: none): a check that would end after it
            is not started, and the stricter rule judges its slowdown.
        first_s: What the first check is expected to take (then the longest one so far).

    Returns:
        Each slowdown's check, by variant.
    """
    return confirm_all(moves, previous_run_id, tracking_uri, results, inputs, protocol, scratch,
                       deadline, first_s)
