"""Prefect task: the benchmark report (JSON, CSV, Markdown and plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tfopt.artifacts import VariantResult
from tfopt.report.files import write_report_files


@task(name="write_report", tags=["report"])
def write_report(
    summary: dict[str, Any], results: list[VariantResult], out_dir: Path
) -> list[Path]:
    """Write ``report.json``, ``report.csv``, ``report.md`` and the PNG plots.

    Args:
        summary: The run summary (variants with their notes, champion, environment).
        results: The benchmarked variants (for the latency samples in the plots).
        out_dir: Folder for the report files.

    Returns:
        The files written.
    """
    return write_report_files(summary, results, out_dir)
