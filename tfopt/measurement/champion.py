"""Choose the champion: the fastest ok variant whose accuracy stays within the budget.

The budget is judged on the validation split where every variant was measured on it
(`BudgetRule`): the test split is then read only for the figures reported, never for a choice.

Variants the measurement cannot tell apart are tied: on the p50 objective, those whose p50 intervals
(`latency_ms.p50_ci95`) overlap the fastest one's. Where a run-off timed the contenders again side
by side (`tasks.runoff`), their run-off p50s and intervals decide among them instead of the figures
each got on its own turn (`runoff_pool`). A tie is broken by a stated order, never by the noise
between them: higher accuracy (on the split the budget is judged on), then smaller size, then the
simpler variant (the baseline before a technique's model, fp32 before float16, dynamic and int8, no
XLA before XLA), then the lower p50.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult, VariantSpec
from tfopt.eval.metrics import MetricBudget, counted
from tfopt.runtimes import runtime_of
from tfopt.variants import plan_variant


class ChampionChoice(BaseModel):
    """The chosen variant (or none) and the rule's reasoning in one sentence."""

    model_config = ConfigDict(frozen=True)

    name: str | None
    reason: str
    baseline_accuracy: float | None
    tied_with: tuple[str, ...] = ()
    judged_on: str | None = None
    """The split the accuracy budget was judged on (`BudgetRule.split`)."""
    reference: str | None = None
    """The baseline variant whose accuracy the budget was judged against."""


def baseline_accuracy(results: list[VariantResult]) -> float | None:
    """Accuracy of the unoptimized model: its first ok variant named ``baseline-*``."""
    for result in results:
        if result.status == "ok" and result.source == "baseline":
            return result.accuracy
    return None


@dataclass(frozen=True)
class BudgetRule:
    """The accuracy budget as judged: on which split, against which baseline figure.

    Attributes:
        split: ``validation`` when the baseline was measured on it, else ``test`` (inputs
            without a validation split: the only labelled figure there is).
        reference: The baseline's figure on that split.
        budget: What a variant may give up from it.
    """

    split: Literal["validation", "test"]
    reference: float
    budget: MetricBudget
    name: str = ""
    """The baseline variant the reference figure is of."""

    def figure(self, result: VariantResult) -> float | None:
        """A variant's accuracy on the rule's split."""
        return result.val_accuracy if self.split == "validation" else result.accuracy

    def keeps(self, result: VariantResult) -> bool:
        """Whether an ok, timed variant gave up at most the budget on the split."""
        figure = self.figure(result)
        return (result.status == "ok" and result.latency_ms is not None and figure is not None
                and self.budget.within(figure, self.reference))


def budget_rule(results: list[VariantResult], budget: MetricBudget) -> BudgetRule | None:
    """The rule the baseline's first ok variant sets (None: no ok baseline variant)."""
    for result in results:
        if result.status == "ok" and result.source == "baseline":
            if result.val_accuracy is not None:
                return BudgetRule("validation", result.val_accuracy, budget, result.name)
            if result.accuracy is not None:
                return BudgetRule("test", result.accuracy, budget, result.name)
            return None
    return None


def objective_value(result: VariantResult, objective: str, runoff: Runoff | None = None) -> float:
    """The number the champion minimizes: a latency statistic, size, or negated throughput."""
    if objective == "throughput":
        return -result.throughput_per_s
    if objective == "throughput_under_budget":
        return -(result.server_qps_within_budget or 0.0)
    if objective == "size":
        return float(result.size_bytes)
    if objective == "p50" and runoff is not None and result.name in runoff.round_p50_ms:
        return runoff.p50(result.name)
    return float(getattr(result.latency_ms, objective))


def p50_interval(result: VariantResult, runoff: Runoff | None = None) -> tuple[float, float] | None:
    """The variant's p50 interval: from the run-off if it took part, else its own."""
    if runoff is not None and result.name in runoff.round_p50_ms:
        return runoff.interval(result.name)
    if result.latency_ms is None or result.latency_ms.p50_ci95 is None:
        return None
    return result.latency_ms.p50_ci95


def speedup_reference(result: VariantResult,
                      results: list[VariantResult]) -> VariantResult | None:
    """What `result` was made from, of another model, timed and able to share its process.

    The baseline's same form for a technique's variant (``distilled-thinner-50-tflite-int8``:
    ``baseline-tflite-int8``): the variant its speed-up is quoted against. None for a
    baseline's own variant or when that variant did not finish.
    """
    reference = next((r for r in results if r.name == result.derived_from), None)
    if (reference is None or reference.source == result.source or reference.status != "ok"
            or reference.latency_ms is None or reference.path is None
            or not runtime_of(reference.format).shares_process):
        return None
    return reference


def plain_int8(results: list[VariantResult]) -> VariantResult | None:
    """The baseline's int8 TFLite file, timed and able to share a process (None: not here).

    What a user gets without tfopt's techniques: the yardstick of "2x faster within a point".
    """
    name = plan_variant("baseline", "tflite", "int8").name
    return next((r for r in results if r.name == name and r.status == "ok"
                 and r.latency_ms is not None and r.path is not None
                 and runtime_of(r.format).shares_process), None)


def is_peer(variant: VariantSpec | VariantResult, source: str = "baseline") -> bool:
    """Whether `variant` is one of the peers: what a user would make of `source` in one call.

    A runtime's plain int8 form (LiteRT's int8 file, ONNX Runtime's static int8, OpenVINO's
    NNCF int8) or its compiled form (XLA's jit): not a technique's model, not a selective or
    mixed-precision form. The champion is quoted against the fastest of them.
    """
    if variant.source != source:
        return False
    runtime = runtime_of(variant.format)
    plain = runtime.variant_name(source, variant.format, variant.precision)
    return variant.name == plain and (variant.precision == "int8"
                                      or variant.format in runtime.compiled_formats)


def timed_peers(results: list[VariantResult]) -> list[VariantResult]:
    """The peers (`is_peer`) measured ok."""
    return [r for r in results if r.status == "ok" and r.latency_ms is not None and is_peer(r)]


def fastest_peer(results: list[VariantResult]) -> VariantResult | None:
    """The peer with the lowest batch-1 p50 on its own turn (None: none timed)."""
    return min(timed_peers(results), key=lambda r: r.latency_ms.p50, default=None)


def champion_speedup_over_peers(champion: str | None, results: list[VariantResult],
                                runoff: Runoff | None = None) -> dict[str, Any] | None:
    """How many times faster (batch-1 p50) the champion is than the fastest peer.

    The peers' own-turn p50s too (``peers_p50_ms``), so a reader sees what each one-call form gave.
    Side by side when both took part in the run-off (`tfopt.measurement.runoff` takes the
    fastest peer in when its runtime shares a process). A champion that is itself a peer is
    quoted against itself (a ratio of 1.0: no compressed variant beat one converter call), even
    where another peer read faster on its own turn: the run-off chose it over that one. None
    without a champion or a peer timed.
    """
    best = next((r for r in results if r.name == champion), None)
    peer = best if best is not None and is_peer(best) else fastest_peer(results)
    if best is None or peer is None:
        return None
    peers = {r.name: r.latency_ms.p50 for r in timed_peers(results)}
    return {**speedup_over(best, peer, runoff), "peers_p50_ms": peers}


def over_one_call_forms(champion: str | None, results: list[VariantResult],
                        runoff: Runoff | None = None) -> dict[str, dict[str, Any] | None]:
    """The summary's speed-ups over what one converter call gives: the int8 file, the peers."""
    return {"champion_speedup_over_int8": champion_speedup_over_int8(champion, results, runoff),
            "champion_speedup_over_peers": champion_speedup_over_peers(champion, results, runoff)}


def champion_speedup(champion: str | None, results: list[VariantResult],
                     runoff: Runoff | None = None) -> dict[str, Any] | None:
    """How many times faster (batch-1 p50) the champion is than its `speedup_reference`.

    Side by side when both took part in the run-off, else from their own turns (said so).
    None without a champion or a reference.
    """
    best = next((r for r in results if r.name == champion), None)
    return None if best is None else speedup_over(best, speedup_reference(best, results),
                                                   runoff)


def champion_speedup_over_int8(champion: str | None, results: list[VariantResult],
                               runoff: Runoff | None = None) -> dict[str, Any] | None:
    """How many times faster (batch-1 p50) the champion is than the baseline's int8 TFLite file.

    Whatever the champion's runtime and precision (a thinner network's fp32 file can run faster than
    its int8 one), so runs and machines compare on one yardstick. None without a champion, without
    that file, or when it is the champion.
    """
    best = next((r for r in results if r.name == champion), None)
    reference = plain_int8(results)
    if best is None or reference is None or reference.name == best.name:
        return None
    return speedup_over(best, reference, runoff)


def speedup_over(best: VariantResult, reference: VariantResult | None,
                 runoff: Runoff | None = None) -> dict[str, Any] | None:
    """`reference`'s batch-1 p50 over `best`'s: round by round when both were in the run-off.

    There each at the thread count the run-off picked for it (None: at ``benchmark.threads``).
    """
    if reference is None:
        return None
    if runoff is not None and {best.name, reference.name} <= set(runoff.round_p50_ms):
        return {"reference": reference.name,
                "ratio": round(runoff.ratio(reference.name, best.name), 3),
                "champion_p50_ms": runoff.p50(best.name),
                "reference_p50_ms": runoff.p50(reference.name), "side_by_side": True,
                "champion_threads": runoff.threads.get(best.name),
                "reference_threads": runoff.threads.get(reference.name),
                "under_load": runoff.under_load}
    ours, theirs = best.latency_ms.p50, reference.latency_ms.p50
    return {"reference": reference.name, "ratio": round(theirs / ours, 3) if ours > 0 else None,
            "champion_p50_ms": ours, "reference_p50_ms": theirs, "side_by_side": False}


_PRECISION_ORDER = {"fp32": 0, "float16": 1, "bfloat16": 2, "dynamic": 3, "int8": 4,
                    "int16x8": 5}


def simplicity(result: VariantResult) -> tuple[int, int, int]:
    """Sort key of how much was done to a variant: fewer steps sort first."""
    return (result.source != "baseline", _PRECISION_ORDER.get(result.precision, 6),
            result.format in runtime_of(result.format).compiled_formats)


def tied_with_best(best: VariantResult, candidates: list[VariantResult],
                   runoff: Runoff | None = None) -> list[VariantResult]:
    """The candidates `best` was not told apart from (best excluded).

    Two run-off contenders by their round-by-round ratio (`Runoff.ratio_interval` holds 1.0):
    a round the VM's slow state hit one of them in is then one ratio of many, where it widened
    that file's own range until it overlapped everything. Others by their p50 intervals
    overlapping.
    """
    best_interval = p50_interval(best, runoff)
    if best_interval is None:
        return []
    low, high = best_interval
    tied = []
    for result in candidates:
        if result is best:
            continue
        if runoff is not None and {best.name, result.name} <= set(runoff.round_p50_ms):
            ratio_low, ratio_high = runoff.ratio_interval(result.name, best.name)
            if ratio_low <= 1.0 <= ratio_high:
                tied.append(result)
            continue
        interval = p50_interval(result, runoff)
        if interval is not None and interval[0] <= high and low <= interval[1]:
            tied.append(result)
    return tied


def _tie_break_key(result: VariantResult) -> tuple[float, int, tuple[int, int, int]]:
    chosen_on = result.val_accuracy if result.val_accuracy is not None else result.accuracy
    return (-(chosen_on or 0.0), result.size_bytes, simplicity(result))


def runoff_pool(eligible: list[VariantResult],
                runoff: Runoff) -> tuple[list[VariantResult], Runoff | None]:
    """The variants the run-off decides among, or all of them on their own turns.

    A run-off p50 and a turn's p50 come from different processes minutes apart: compared with
    each other, a run-off process that ran slow its whole life lets a variant it never timed
    win (docs/measurements.md, "Run-off"). So the contenders are compared only with each other,
    unless a variant outside the run-off (a runtime that cannot share its process) was faster
    on its own turn than every contender on theirs: then all are compared on their own turns.
    """
    timed_again = [r for r in eligible if r.name in runoff.round_p50_ms]
    fastest_on_turns = min(eligible, key=lambda r: r.latency_ms.p50)
    if not timed_again or fastest_on_turns not in timed_again:
        return eligible, None
    return timed_again, runoff


_OBJECTIVE_WORDS = {"p50": "batch-1 p50 latency", "p90": "batch-1 p90 latency",
                    "p99": "batch-1 p99 latency", "mean": "batch-1 mean latency",
                    "throughput": "-throughput", "size": "size",
                    "throughput_under_budget": "-Server rate (queries/s) within the latency budget"}


def choose_champion(
    results: list[VariantResult], budget: MetricBudget, objective: str = "p50",
    runoff: Runoff | None = None,
) -> ChampionChoice:
    """Pick the best ok variant on `objective` among those within `budget` of the baseline.

    Args:
        results: Every benchmarked variant, failed ones included.
        budget: What a champion may give up from the baseline's figure.
        objective: ``p50`` (default), ``p90``, ``p99``, ``mean`` (batch-1 latency, lower is
            better), ``throughput`` (higher is better), ``size`` (smaller is better) or
            ``throughput_under_budget`` (the highest Server-scenario rate whose p99 met the
            latency budget; a variant that met it at no rate does not qualify).
        runoff: The contenders' side-by-side p50s, which decide among them on ``p50``
            (`runoff_pool`).

    Returns:
        The champion's name, or None with the reason when no variant qualifies.
    """
    reference = baseline_accuracy(results)
    ok = [r for r in results if r.status == "ok" and r.latency_ms is not None]
    if not ok:
        return ChampionChoice(name=None, reason="no variant finished", baseline_accuracy=reference)
    rule = budget_rule(results, budget)
    if rule is None:
        return ChampionChoice(
            name=None, reason="no ok baseline variant to compare accuracy with",
            baseline_accuracy=None,
        )
    eligible = [r for r in ok if rule.keeps(r)]
    if objective == "throughput_under_budget":
        eligible = [r for r in eligible if r.server_qps_within_budget]
    if not eligible:
        return ChampionChoice(
            name=None,
            reason=f"no ok variant is {budget.clause()} on {rule.split}"
            + (" and meets the latency budget at any Server rate"
               if objective == "throughput_under_budget" else ""),
            baseline_accuracy=reference, judged_on=rule.split, reference=rule.name,
        )
    runoff = runoff if objective == "p50" else None
    within = len(eligible)
    if runoff is not None:
        eligible, runoff = runoff_pool(eligible, runoff)
    fastest = min(eligible, key=lambda r: objective_value(r, objective, runoff))
    reason = (f"best {_OBJECTIVE_WORDS[objective].lstrip('-')} "
              f"({abs(objective_value(fastest, objective, runoff)):,.3f}) among {within} "
              f"ok variants {budget.clause()} on {rule.split}")
    if runoff is not None:
        reason += (f" (run-off: {', '.join(runoff.round_p50_ms)} timed again side by side in "
                   f"{runoff.rounds} alternating rounds"
                   + ("; the others were slower on their own turns)" if within > len(eligible)
                      else ")"))
    tied = tied_with_best(fastest, eligible, runoff) if objective == "p50" else []
    if not tied:
        return ChampionChoice(name=fastest.name, reason=reason, baseline_accuracy=reference,
                              judged_on=rule.split, reference=rule.name)
    group = sorted([fastest, *tied],
                   key=lambda r: (*_tie_break_key(r), objective_value(r, "p50", runoff)))
    champion, others = group[0], [r.name for r in group[1:]]
    return ChampionChoice(
        name=champion.name,
        reason=(f"{reason}: {fastest.name}, tied on p50 (not told apart at 95%) with "
                f"{', '.join(r.name for r in tied)}; the tie goes to higher accuracy, then "
                f"smaller size, then the simpler variant: {champion.name}"),
        baseline_accuracy=reference, tied_with=tuple(others), judged_on=rule.split,
        reference=rule.name,
    )


def accuracy_verdict(choice: ChampionChoice, results: list[VariantResult],
                     inputs: BenchmarkInputs, budget: MetricBudget,
                     class_names: Sequence[str] = ()) -> dict[str, Any] | None:
    """The champion's accuracy as the summary reports it (``accuracy_verdict``).

    Which split the budget was judged on, the metric and its budget in words; the champion's
    and the baseline's figures on both splits, each test accuracy with its 95% interval
    (Wilson; a metric that counts no right answers has none); and the two compared on the same
    test images (McNemar: the images only one of them got right), and on the validation images
    the budget was judged on (``paired_on_validation``: how strong the evidence the choice
    rested on was); the classes the champion lost most against the baseline on test
    (``classes_lost_most``, given the `class_names`). None without a champion.
    """
    from tfopt.measurement.accuracy_stats import paired_comparison, wilson_interval

    by_name = {result.name: result for result in results}
    champion, baseline = by_name.get(choice.name or ""), by_name.get(choice.reference or "")
    if champion is None or baseline is None:
        return None
    test_images = inputs.examples if champion.accuracy is not None else 0

    def figures(result: VariantResult) -> dict[str, Any]:
        interval = (wilson_interval(result.accuracy, test_images)
                    if result.accuracy is not None and counted(budget.metric.name) else None)
        return {"name": result.name, "val_accuracy": result.val_accuracy,
                "test_accuracy": result.accuracy,
                "test_ci95": None if interval is None else [round(v, 4) for v in interval]}

    return {"judged_on": choice.judged_on, "budget_points": budget.points(),
            "metric": budget.metric.name, "budget": budget.described(),
            "test_images": test_images, "champion": figures(champion),
            "baseline": figures(baseline),
            "paired": paired_comparison(champion, baseline, inputs.labels),
            "paired_on_validation": (
                paired_comparison(champion, baseline, inputs.selection_labels, "val")
                if choice.judged_on == "validation" else None),
            "classes_lost_most": _classes_lost_most(champion, baseline, inputs, class_names)}


def _classes_lost_most(champion: VariantResult, baseline: VariantResult,
                       inputs: BenchmarkInputs, class_names: Sequence[str],
                       ) -> list[dict[str, Any]] | None:
    """`tfopt.eval.classes.lost_most` on test (None: the predictions were not kept)."""
    from tfopt.eval.classes import lost_most, read_class_results

    theirs = read_class_results(inputs.labels, champion.predictions, class_names)
    ours = read_class_results(inputs.labels, baseline.predictions, class_names)
    return None if theirs is None or ours is None else lost_most(theirs, ours)
