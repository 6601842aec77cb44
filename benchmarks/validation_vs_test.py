"""Does validation, where every choice is made, agree with the held-out test? Across runs.

Usage: .venv/bin/python benchmarks/validation_vs_test.py SUMMARY.json [SUMMARY.json ...]

Reads the summaries of finished runs (``tfopt run --summary-json``). Per run: the champion's
accuracy difference to the baseline of its verdict on validation (where it was chosen) and on
test (read once, for the figures), each with its paired counts where the run kept them; then,
over every measured compressed file of the run, the mean and range of (test difference minus
validation difference). A leak of validation into the choices (a fine-tuning stopping on the
images that judge it) shows as a negative mean for every file, run after run; the winner's
curse of choosing the fastest file within the budget among many shows on the champion alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _points(value: float | None, reference: float | None) -> float | None:
    return None if value is None or reference is None else (value - reference) * 100.0


def _counts(paired: dict[str, Any] | None) -> str:
    if not paired:
        return ""
    return (f" ({paired['only_first_right']} vs {paired['only_second_right']} images, "
            f"p {paired['mcnemar_p_value']:.2g})")


def run_line(summary: dict[str, Any]) -> str:
    """One run: the champion's differences on both splits and every compressed file's gap."""
    verdict = summary.get("accuracy_verdict")
    if not verdict or verdict.get("judged_on") != "validation":
        return f"{summary.get('config_name')}: no champion judged on validation"
    baseline, champion = verdict["baseline"], verdict["champion"]
    gaps = []
    for variant in summary["variants"]:
        if (variant.get("status") != "ok" or variant["name"].startswith("baseline")
                or variant.get("val_accuracy") is None):
            continue
        on_val = _points(variant["val_accuracy"], baseline["val_accuracy"])
        on_test = _points(variant["accuracy"], baseline["test_accuracy"])
        if on_val is not None and on_test is not None:
            gaps.append(on_test - on_val)
    chosen_val = _points(champion["val_accuracy"], baseline["val_accuracy"])
    chosen_test = _points(champion["test_accuracy"], baseline["test_accuracy"])
    line = (f"{summary.get('config_name')} {summary.get('mlflow_run_id', '')[:8]}: champion "
            f"{champion['name']} validation {chosen_val:+.2f}"
            f"{_counts(verdict.get('paired_on_validation'))}, test {chosen_test:+.2f}"
            f"{_counts(verdict.get('paired'))} points vs {baseline['name']}")
    if gaps:
        line += (f"; {len(gaps)} compressed files, test minus validation difference mean "
                 f"{sum(gaps) / len(gaps):+.2f} [{min(gaps):+.2f}, {max(gaps):+.2f}]")
    return line


def main(paths: list[str]) -> None:
    """Print one line per summary."""
    for path in paths:
        print(run_line(json.loads(Path(path).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
