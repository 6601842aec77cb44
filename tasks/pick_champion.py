"""Prefect task: choose the champion among the benchmarked variants."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import Runoff, VariantResult
from tfopt.config import EvalConfig
from tfopt.measurement.champion import ChampionChoice, choose_champion


@task(name="pick_champion", tags=["report"])
def pick_champion(
    results: list[VariantResult], budget_points: float, objective: str = "p50",
    runoff: Runoff | None = None, judged_by: EvalConfig | None = None,
    class_scores: bool = True,
) -> ChampionChoice:
    """Apply the champion rule (see `choose_champion`) to the benchmarked variants.

    Args:
        results: Every benchmarked variant.
        budget_points: Allowed accuracy loss in points (``benchmark.accuracy_budget_points``).
        objective: What the champion is best at.
        runoff: The contenders timed again side by side, if a run-off took place.
        judged_by: The metric and its budget (``eval``; None: top-1 accuracy within
            `budget_points`).
        class_scores: The variants were scored on a classifier's images (``fidelity``: top-1
            agreement), not on feeds (the SNR; `BenchmarkInputs.metric`).

    Returns:
        The choice and its reason.
    """
    budget = (judged_by or EvalConfig()).metric_budget(budget_points, class_scores)
    return choose_champion(results, budget, objective, runoff)
