"""Choose the champion: the fastest ok variant whose accuracy stays within the budget.

Variants the measurement cannot tell apart are tied: on the p50 objective, those whose p50
intervals (`latency_ms.p50_ci95`) overlap the fastest one's. A tie is broken by a stated order,
never by the noise between them: higher accuracy, then smaller size, then the simpler variant
(the baseline before a technique's model, fp32 before float16, dynamic and int8, no XLA before
XLA), then the lower p50.
"""

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
    tied_with: tuple[str, ...] = ()


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
    if objective == "throughput_under_budget":
        return -(result.server_qps_within_budget or 0.0)
    if objective == "size":
        return float(result.size_bytes)
    return float(getattr(result.latency_ms, objective))


_PRECISION_ORDER = {"fp32": 0, "float16": 1, "dynamic": 2, "int8": 3}


def simplicity(result: VariantResult) -> tuple[int, int, int]:
    """Sort key of how much was done to a variant: fewer steps sort first."""
    return (result.source != "baseline", _PRECISION_ORDER.get(result.precision, 4),
            result.format == "xla")


def tied_with_best(best: VariantResult, candidates: list[VariantResult]) -> list[VariantResult]:
    """The candidates whose p50 interval overlaps `best`'s (best excluded)."""
    if best.latency_ms is None or best.latency_ms.p50_ci95 is None:
        return []
    low, high = best.latency_ms.p50_ci95
    return [r for r in candidates
            if r is not best and r.latency_ms is not None and r.latency_ms.p50_ci95 is not None
            and r.latency_ms.p50_ci95[0] <= high and low <= r.latency_ms.p50_ci95[1]]


def _tie_break_key(result: VariantResult) -> tuple[float, int, tuple[int, int, int], float]:
    return (-result.accuracy, result.size_bytes, simplicity(result), result.latency_ms.p50)


_OBJECTIVE_WORDS = {"p50": "batch-1 p50 latency", "p90": "batch-1 p90 latency",
                    "p99": "batch-1 p99 latency", "mean": "batch-1 mean latency",
                    "throughput": "-throughput", "size": "size",
                    "throughput_under_budget": "-Server rate (queries/s) within the latency budget"}


def choose_champion(
    results: list[VariantResult], budget_points: float, objective: str = "p50"
) -> ChampionChoice:
    """Pick the best ok variant on `objective` among those within `budget_points` of baseline.

    Args:
        results: Every benchmarked variant, failed ones included.
        budget_points: Accuracy points (0-100 scale) a champion may lose to the baseline.
        objective: ``p50`` (default), ``p90``, ``p99``, ``mean`` (batch-1 latency, lower is
            better), ``throughput`` (higher is better), ``size`` (smaller is better) or
            ``throughput_under_budget`` (the highest Server-scenario rate whose p99 met the
            latency budget; a variant that met it at no rate does not qualify).

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
    if objective == "throughput_under_budget":
        eligible = [r for r in eligible if r.server_qps_within_budget]
    if not eligible:
        return ChampionChoice(
            name=None,
            reason=f"no ok variant is within {budget_points} accuracy points of the baseline"
            + (" and meets the latency budget at any Server rate"
               if objective == "throughput_under_budget" else ""),
            baseline_accuracy=reference,
        )
    fastest = min(eligible, key=lambda r: objective_value(r, objective))
    reason = (f"best {_OBJECTIVE_WORDS[objective].lstrip('-')} "
              f"({abs(objective_value(fastest, objective)):,.3f}) among {len(eligible)} ok "
              f"variants within {budget_points} accuracy points of the baseline")
    tied = tied_with_best(fastest, eligible) if objective == "p50" else []
    if not tied:
        return ChampionChoice(name=fastest.name, reason=reason, baseline_accuracy=reference)
    group = sorted([fastest, *tied], key=_tie_break_key)
    champion, others = group[0], [r.name for r in group[1:]]
    return ChampionChoice(
        name=champion.name,
        reason=(f"{reason}: {fastest.name}, tied on p50 (95% intervals overlap) with "
                f"{', '.join(r.name for r in tied)}; the tie goes to higher accuracy, then "
                f"smaller size, then the simpler variant: {champion.name}"),
        baseline_accuracy=reference, tied_with=tuple(others),
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
