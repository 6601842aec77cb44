"""Prefect task: choose the champion among the benchmarked variants."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import Runoff, VariantResult
from tfopt.eval.metrics import accuracy_budget
from tfopt.measurement.champion import ChampionChoice, choose_champion


@task(name="pick_champion", tags=["report"])
def pick_champion(
    results: list[VariantResult], budget_points: float, objective: str = "p50",
    runoff: Runoff | None = None,
) -> ChampionChoice:
    """Apply the champion rule (see `choose_champion`) to the benchmarked variants.

    Args:
        results: Every benchmarked variant.
        budget_points: Allowed accuracy loss in points.
        objective: What the champion is best at.
        runoff: The contenders timed again side by side, if a run-off took place.

    Returns:
        The choice and its reason.
    """
    return choose_champion(results, accuracy_budget(budget_points), objective, runoff)
