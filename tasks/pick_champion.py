"""Choose the champion: the fastest ok variant whose accuracy stays within the budget."""

from __future__ import annotations

from prefect import task
from pydantic import BaseModel, ConfigDict

from tfopt.artifacts import VariantResult


class ChampionChoice(BaseModel):
    """The chosen variant (or none) and the rule's reasoning in one sentence."""

    model_config = ConfigDict(frozen=True)

    name: str | None
    reason: str
    baseline_accuracy: float | None


def baseline_accuracy(results: list[VariantResult]) -> float | None:
    """Accuracy of the unoptimized model: its first ok variant named ``baseline-*``."""
    for result in results:
        if result.status == "ok" and result.source == "baseline":
            return result.accuracy
    return None


def objective_value(result: VariantResult, objective: str) -> float:
    """The number the champion minimizes: a latency statistic, size, or negated throughput."""
    if objective == "throughput":
        return -result.throughput_per_s
    if objective == "size":
        return float(result.size_bytes)
    return float(getattr(result.latency_ms, objective))


_OBJECTIVE_WORDS = {"p50": "batch-1 p50 latency", "p90": "batch-1 p90 latency",
                    "p99": "batch-1 p99 latency", "mean": "batch-1 mean latency",
                    "throughput": "-throughput", "size": "size"}


def choose_champion(
    results: list[VariantResult], budget_points: float, objective: str = "p50"
) -> ChampionChoice:
    """Pick the best ok variant on `objective` among those within `budget_points` of baseline.

    Args:
        results: Every benchmarked variant, failed ones included.
        budget_points: Accuracy points (0-100 scale) a champion may lose to the baseline.
        objective: ``p50`` (default), ``p90``, ``p99``, ``mean`` (batch-1 latency, lower is
            better), ``throughput`` (higher is better) or ``size`` (smaller is better).

    Returns:
        The champion's name, or None with the reason when no variant qualifies.
    """
    reference = baseline_accuracy(results)
    ok = [r for r in results if r.status == "ok" and r.latency_ms is not None]
    if not ok:
        return ChampionChoice(name=None, reason="no variant finished", baseline_accuracy=reference)
    if reference is None:
        return ChampionChoice(
            name=None, reason="no ok baseline variant to compare accuracy with",
            baseline_accuracy=None,
        )
    eligible = [r for r in ok if (reference - r.accuracy) * 100.0 <= budget_points + 1e-9]
    if not eligible:
        return ChampionChoice(
            name=None,
            reason=f"no ok variant is within {budget_points} accuracy points of the baseline",
            baseline_accuracy=reference,
        )
    best = min(eligible, key=lambda r: objective_value(r, objective))
    value = abs(objective_value(best, objective))
    return ChampionChoice(
        name=best.name,
        reason=(
            f"best {_OBJECTIVE_WORDS[objective].lstrip('-')} ({value:,.3f}) among "
            f"{len(eligible)} ok variants within {budget_points} accuracy points of the baseline"
        ),
        baseline_accuracy=reference,
    )


@task(name="pick_champion", tags=["report"])
def pick_champion(
    results: list[VariantResult], budget_points: float, objective: str = "p50"
) -> ChampionChoice:
    """Apply the champion rule (see `choose_champion`) to the benchmarked variants.

    Args:
        results: Every benchmarked variant.
        budget_points: Allowed accuracy loss in points.
        objective: What the champion is best at.

    Returns:
        The choice and its reason.
    """
    return choose_champion(results, budget_points, objective)
