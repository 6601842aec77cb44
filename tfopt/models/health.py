"""Is the baseline fit to judge anything against? Checked before any verdict uses it.

Every verdict compares a variant with the baseline, so a baseline at chance, or one whose
validation accuracy lies far below its training accuracy (stale batch-norm statistics, a data
set its classes do not fit), or whose loss diverged, makes every verdict meaningless. The check
reads what the baseline's training and evaluation recorded; it trains nothing.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from tfopt.artifacts import ModelArtifact

Status = Literal["healthy", "unhealthy", "not_judged"]

CHANCE_SHARE = 0.1
"""Validation accuracy within this share of the way from chance (1 / classes) to 1.0 is at
chance (10 classes: below 0.19; 2 classes: below 0.55)."""
GAP = 0.25
"""Training accuracy this far above validation accuracy is a gap no plateau explains."""


def at_chance_below(classes: int) -> float:
    """The validation accuracy below which a model of `classes` classes is at chance."""
    chance = 1.0 / max(classes, 1)
    return chance + CHANCE_SHARE * (1.0 - chance)


def baseline_health(baseline: ModelArtifact) -> dict[str, Any]:
    """The baseline's health: its status, the reasons, and the figures they rest on.

    Returns:
        ``status`` (healthy, unhealthy, or not_judged without a validation accuracy),
        ``reasons`` (one sentence each), ``train_accuracy`` (at the kept epoch; None for a
        model not trained here), ``val_accuracy``, ``chance_accuracy``.
    """
    taken_as_is = "stop_reason" not in baseline.params or not baseline.params.get("epochs_run")
    val = baseline.metrics.get("best_val_accuracy")
    train = baseline.at_kept_epoch("accuracy")
    chance = 1.0 / max(baseline.num_classes, 1)
    figures = {"train_accuracy": train, "val_accuracy": val, "chance_accuracy": chance}
    if baseline.num_classes == 0:
        return {"status": "not_judged", "reasons": [
            "no classes: its checks read a classifier's accuracy (chance, a training gap)"],
            **figures}
    if val is None:
        return {"status": "not_judged", "reasons": ["no validation split to judge it on"],
                **figures}
    reasons = []
    if val < at_chance_below(baseline.num_classes):
        reasons.append(
            f"validation accuracy {val:.3f} is at chance ({chance:.3f} for "
            f"{baseline.num_classes} classes)" + (
                ": taken as it is, its classes may not be this folder's (model.head: replace "
                "puts it on them)" if taken_as_is else ""))
    if train is not None and train - val > GAP:
        reasons.append(
            f"training accuracy {train:.3f} against validation {val:.3f}: a gap no plateau "
            "explains (stale batch-norm statistics, or a validation split unlike the training "
            "images)")
    losses = baseline.history.get("loss") or []
    if losses and (not all(math.isfinite(v) for v in losses) or losses[-1] > losses[0]):
        reasons.append(f"its training loss diverged (first epoch {losses[0]:.3g}, last "
                       f"{losses[-1]:.3g})")
    return {"status": "unhealthy" if reasons else "healthy", "reasons": reasons, **figures}


def health_line(health: dict[str, Any]) -> str:
    """One line for a person: healthy with its figures, or unhealthy and why."""
    figures = f"validation {health['val_accuracy']:.3f}" if health["val_accuracy"] is not None \
        else "no validation split"
    if health["train_accuracy"] is not None:
        figures += f", training {health['train_accuracy']:.3f}"
    figures += f", chance {health['chance_accuracy']:.3f}"
    if health["status"] == "healthy":
        return f"healthy ({figures})"
    if health["status"] == "not_judged":
        return f"not judged ({'; '.join(health['reasons'])})"
    return f"UNHEALTHY: {'; '.join(health['reasons'])}; every verdict against it is suspect"


def verdicts_note(note: str | None, health: dict[str, Any]) -> str | None:
    """Why the verdicts are judged against a baseline that may not hold, if they are.

    `note` is what the training said (a baseline its children beat); an unhealthy baseline
    adds its reasons.
    """
    if health["status"] != "unhealthy":
        return note
    unhealthy = "unhealthy baseline: " + "; ".join(health["reasons"])
    return f"{note}; {unhealthy}" if note else unhealthy
