"""The searches' combined front: the trials no other trial beats on both speed and accuracy.

Every search's timed trials (the summary's ``search``) are put on one picture: the validation
accuracy (the file's, as the choice reads it, else the model's) against the speed-up over
`baseline-tflite-int8` timed side by side (each trial's own p50 where a trial has none). A
trial is on the front when no other is at least as fast and as accurate and better in one.
"""

from __future__ import annotations

from typing import Any


def front_point(technique: str, search: dict[str, Any], trial: dict[str, Any]
                ) -> dict[str, Any] | None:
    """One timed trial as a point of the front (None: not timed or not judged)."""
    accuracy = trial.get("file_val_accuracy")
    accuracy = trial.get("val_accuracy") if accuracy is None else accuracy
    if trial.get("p50_ms") is None or accuracy is None:
        return None
    return {"technique": technique, "knob": search["knob"],
            "setting": params_label(trial["params"]), "val_accuracy": accuracy,
            "p50_ms": trial["p50_ms"], "speedup": trial.get("speedup"),
            "within": trial["status"] == "ok"}


def combined_front(searches: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials of every search on the accuracy-speed Pareto front, fastest first.

    Speed is the speed-up side by side when every timed trial has one, else 1 / p50.
    """
    points = [point for technique, search in searches.items() for trial in search["trials"]
              if (point := front_point(technique, search, trial)) is not None]
    by_speedup = all(point["speedup"] for point in points)

    def speed(point: dict[str, Any]) -> float:
        return point["speedup"] if by_speedup else 1.0 / point["p50_ms"]

    front: list[dict[str, Any]] = []
    for point in sorted(points, key=lambda p: (-speed(p), -p["val_accuracy"])):
        if not front or point["val_accuracy"] > front[-1]["val_accuracy"]:
            front.append(point)
    return front


def params_label(params: dict[str, float]) -> str:
    """A trial's setting as the report writes it (``0.5``; ``fraction 0.5, share 0.25``)."""
    if len(params) == 1:
        return f"{next(iter(params.values())):g}"
    return ", ".join(f"{field} {value:g}" for field, value in params.items())


def is_chosen(search: dict[str, Any], trial: dict[str, Any]) -> bool:
    """Whether a summary's trial is its search's chosen one (a value, or a joint point)."""
    chosen = search.get("chosen")
    if isinstance(chosen, dict):
        return chosen == trial["params"]
    return chosen is not None and len(trial["params"]) == 1 and (
        next(iter(trial["params"].values())) == chosen)
