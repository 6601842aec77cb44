"""What each technique's run took beside its priced epochs, learned on this machine for a model.

The time budget prices a technique's run as its epochs at twice the baseline's pace plus a fixed
part (`techniques.STARTUP_S`: its process's start, the model's load, its export). For some
techniques the fixed part is many times that guess: CQAT builds a graph that took 40 s on a slow
CPU where 10 s were priced, and a technique run past its price takes the time of those after it
(docs/measurements.md). A first run can only guess; a scheduled deployment runs the same config
on the same machine again and again. Each run's measured fixed part, in the baseline's epochs
(so that a busier machine scales it as it scales the epochs), is kept in the work folder per CPU,
cores and model; the next run prices each technique with the median of its last `KEPT` runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any

from tfopt.artifacts import LearnedCosts
from tfopt.fileio import atomic_write_json, file_lock
from tfopt.provenance import cpu_model

COSTS_FILE = "technique-costs.json"
KEPT = 3
"""The runs a technique's price follows (their median: one slow run does not set it)."""

log = logging.getLogger(__name__)


def costs_key(model: Any, image_size: int) -> str:
    """This machine (CPU model and the cores this process may use) and the model being compressed.

    Args:
        model: The config's ``model`` section (what builds or loads the baseline).
        image_size: The images' side in pixels.
    """
    made = json.dumps(model.model_dump(mode="json"), sort_keys=True) + f"|{image_size}"
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return f"{cpu_model()} x{cores} {hashlib.sha256(made.encode()).hexdigest()[:12]}"


def load_costs(work_dir: Path, key: str) -> LearnedCosts:
    """The fixed costs learned under `key` in `work_dir` (none for a first run or a bad file)."""
    path = work_dir / COSTS_FILE
    runs = _read(path).get(key, {})
    return LearnedCosts(path=path, key=key, startup_epochs={
        technique: statistics.median(kept) for technique, kept in runs.items() if kept})


def record_cost(costs: LearnedCosts, technique: str, wall_s: float, priced_s: float,
                epoch_s: float) -> float | None:
    """Keep what `technique`'s run took beside `priced_s` (its epochs, its files as priced).

    Returns the fixed part recorded, in seconds (None: not recorded: no baseline pace, or the
    work folder not writable; a technique never fails on its bookkeeping).
    """
    if epoch_s <= 0.0 or wall_s <= 0.0:
        return None
    fixed_s = max(0.0, wall_s - priced_s)
    try:
        with file_lock(costs.path.with_name(f".{costs.path.name}.lock")):
            book = _read(costs.path)
            kept = book.setdefault(costs.key, {}).setdefault(technique, [])
            kept[:] = [*kept, round(fixed_s / epoch_s, 3)][-KEPT:]
            atomic_write_json(costs.path, book)
    except OSError as error:
        log.warning("%s's cost was not recorded in %s: %s", technique, costs.path, error)
        return None
    return fixed_s


def _read(path: Path) -> dict[str, dict[str, list[float]]]:
    """The costs file's contents; a missing or unreadable one is empty (it is only a guess)."""
    try:
        book = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return book if isinstance(book, dict) else {}
