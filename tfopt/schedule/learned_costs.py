"""What each technique's run took, learned on this machine for a model: two numbers per technique.

The time budget prices a technique's run as its epochs at a multiple of the baseline's pace
(`techniques.WRAPPED_EPOCH_SHARE`, 2: tfmot's wrappers, a teacher's pass) plus a fixed part
(`techniques.STARTUP_S`: its process's start, the model's load, its export). Both guesses can be
wrong by several times (a technique's graph building, a thinner student's cheaper epochs), and a
technique run past its price takes the time of those after it (docs/measurements.md). A first run
can only guess; a scheduled deployment runs the same config on the same machine again and again.
Each run's epoch share (its trainings' seconds per epoch over the baseline's) and fixed part (the
rest of its wall time, in the baseline's epochs, so that a busier machine scales it as it scales the
epochs) are kept in the work folder per CPU, cores and model; the next run prices each technique
with the medians of its last `KEPT` runs. The run's finish (the run-off, the MLflow models, the
report: `tfopt.schedule.budget.FinishWatch`) is kept there too, in seconds, and the next run
keeps the longest of its last `KEPT` for it: a reserve before a deadline, where a price is a
median.
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
FINISH = "the run's finish"
"""Where the run's finish is kept beside the techniques (no technique can be so named)."""

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
    """The fixed parts and epoch shares learned under `key` in `work_dir` (none: a first run).

    With the run's finish beside its packaging (`record_finish`), the longest of its last runs:
    the budget keeps it before its end, and a finish past it ends the run past its budget.
    """
    path = work_dir / COSTS_FILE
    book = _read(path).get(key, {})
    book = book if isinstance(book, dict) else {}
    kept_finishes = book.get(FINISH)
    finishes = [run["seconds"] for run in (kept_finishes if isinstance(kept_finishes, list) else [])
                if isinstance(run, dict) and isinstance(run.get("seconds"), int | float)]
    runs = {technique: [entry for run in kept if (entry := _entry(run)) is not None]
            for technique, kept in book.items() if isinstance(kept, list) and technique != FINISH}
    return LearnedCosts(path=path, key=key, finish_s=(
        max(finishes) if finishes else None), startup_epochs={
        technique: statistics.median(run["fixed"] for run in kept)
        for technique, kept in runs.items() if kept
    }, epoch_shares={
        technique: statistics.median(shares) for technique, kept in runs.items()
        if (shares := [run["share"] for run in kept if "share" in run])})


def record_cost(costs: LearnedCosts, technique: str, wall_s: float, priced_s: float,
                epoch_s: float, epoch_share: float | None = None) -> float | None:
    """Keep what `technique`'s run took beside `priced_s` (its epochs, its files as priced).

    `epoch_share`: its trainings' seconds per epoch over the baseline's `epoch_s`, as measured
    (None: not measured; its epochs then stay priced at the guess).

    Returns the fixed part recorded, in seconds (None: not recorded: no baseline pace, or the
    work folder not writable; a technique never fails on its bookkeeping).
    """
    if epoch_s <= 0.0 or wall_s <= 0.0:
        return None
    fixed_s = max(0.0, wall_s - priced_s)
    run = {"fixed": round(fixed_s / epoch_s, 3)}
    if epoch_share is not None and epoch_share > 0.0:
        run["share"] = round(epoch_share, 3)
    try:
        _append(costs, technique, run)
    except OSError as error:
        log.warning("%s's cost was not recorded in %s: %s", technique, costs.path, error)
        return None
    return fixed_s


def record_finish(costs: LearnedCosts | None, seconds: float) -> None:
    """Keep what this run's finish took beside its packaging (`tfopt.schedule.budget.FinishWatch`).

    The next run's budget keeps the longest of the last `KEPT` for it (`Budget.finish_fixed_s`).
    A work folder that cannot be written is logged; the run never fails on its bookkeeping.
    """
    if costs is None or seconds < 0.0:
        return
    try:
        _append(costs, FINISH, {"seconds": round(seconds, 1)})
    except OSError as error:
        log.warning("the run's finish was not recorded in %s: %s", costs.path, error)


def _append(costs: LearnedCosts, name: str, run: dict[str, float]) -> None:
    """Add one run to `name`'s last `KEPT` under the costs' key, the file locked.

    What is there that cannot hold runs (a hand-edited entry) is written over.
    """
    with file_lock(costs.path.with_name(f".{costs.path.name}.lock")):
        book = _read(costs.path)
        runs = book.get(costs.key)
        runs = book[costs.key] = runs if isinstance(runs, dict) else {}
        kept = runs.get(name)
        runs[name] = [*(kept if isinstance(kept, list) else []), run][-KEPT:]
        atomic_write_json(costs.path, book)


def _entry(run: Any) -> dict[str, float] | None:
    """One recorded run (None: unreadable); a bare number is a fixed part recorded alone."""
    if isinstance(run, int | float):
        return {"fixed": float(run)}
    if not isinstance(run, dict) or not isinstance(run.get("fixed"), int | float):
        return None
    return {name: float(run[name]) for name in ("fixed", "share")
            if isinstance(run.get(name), int | float)}


def _read(path: Path) -> dict[str, dict[str, list[Any]]]:
    """The costs file's contents; a missing or unreadable one is empty (it is only a guess)."""
    try:
        book = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return book if isinstance(book, dict) else {}
