"""A suspected slowdown timed again: the previous run's file beside this run's, side by side.

Two runs minutes or days apart each measure on their own machine state; a move between them may
be the machine's. Chromium's Pinpoint answers that by measuring the old build against the new,
interleaved on one machine. Here the previous run's file of the variant (from MLflow) and this
run's are loaded in one fresh process and timed in alternating rounds, as the run-off times its
contenders (`tfopt.measurement.worker.measure_runoff`), holding the machine's benchmark slot. The
slowdown is confirmed when this run's file was the slower of the two in enough rounds that two
equal files would do so at most once in 64 (a paired sign test: every one of 6 rounds; when
one of the 6 was not slower, 6 more rounds are timed and 11 of the 12 are needed) and the
median of their per-round ratios is beyond the minimum change; without the previous file
(gone, or the time budget ran out), only a move beyond the stricter rule counts, and never one
no larger than a move this run's checks found to be nothing (`confirm_all`: its own turns
moved that far with no file slower).
The rounds are paired because a round slowed by the machine slows both files in it (one slow
round can make an interval overlap a file several times slower: docs/measurements.md).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.measurement.runoff import side_by_side_in_worker
from tfopt.orchestration import benchmark_slot
from tfopt.report.compare import STRICTER
from tfopt.schedule.budget import CUT_BY_BUDGET


def confirm_slowdown(move: dict[str, Any], current: VariantResult, previous_file: Path | None,
                     inputs: BenchmarkInputs, protocol: MeasurementProtocol,
                     why_gone: str = "", cleared_ratio: float | None = None,
                     cut: bool = False) -> dict[str, Any]:
    """The side-by-side check of one slowdown (`tfopt.report.compare.settle` reads it).

    Args:
        move: The slowdown (`tfopt.report.compare.compare`'s move, with its minimum change).
        current: This run's measured variant (its file and form).
        previous_file: The previous run's file of the variant, or None when it is gone.
        inputs: This run's benchmark inputs (both files take the same arrays).
        protocol: The benchmark protocol (each round is a short turn of it).
        why_gone: Why the previous file could not be had.
        cleared_ratio: The largest move since the last run that this run's side-by-side checks
            found not slower: without a file, only a larger one counts.
        cut: The time budget left no room to time it (``cut`` in the check, typed: read by
            `tfopt.schedule.budget.confirmation_cuts`, never parsed from the reason).
    """
    threshold = move["minimum_change"]
    if previous_file is None or current.path is None:
        required = 1.0 + STRICTER * threshold
        counted = (move["ratio"] is not None and move["ratio"] >= required
                   and (cleared_ratio is None or move["ratio"] > cleared_ratio))
        check = {"verdict": "stricter_rule" if counted else "within_stricter_rule",
                 "required_ratio": required, "reason": why_gone or "no file", "cut": cut}
        return check if cleared_ratio is None else {**check, "cleared_ratio": cleared_ratio}
    specs = [_spec(current, previous_file, f"{current.name}@previous"),
             _spec(current, Path(current.path), current.name)]
    with benchmark_slot(f"{current.name} (side by side with the previous run's)"):
        runoff = side_by_side_in_worker(specs, inputs, protocol)
        ratios = runoff.round_ratios(specs[1].name, specs[0].name)
        if sum(r <= 1.0 for r in ratios) == 1 and runoff.ratio(
                specs[1].name, specs[0].name) >= 1.0 + threshold:
            runoff = runoff.followed_by(side_by_side_in_worker(specs, inputs, protocol))
    return side_by_side_verdict(runoff, specs[0].name, specs[1].name, threshold)


SIGN_TEST_LEVEL = 1 / 64
"""How often two equal files may pass for a slowdown: 6 rounds of 6 slower, 11 of 12."""


def sign_test_p(slower: int, rounds: int) -> float:
    """The chance that two equal files make one the slower in at least `slower` of `rounds`."""
    return sum(math.comb(rounds, k) for k in range(slower, rounds + 1)) / 2 ** rounds


def side_by_side_verdict(runoff: Runoff, old: str, new: str,
                         threshold: float) -> dict[str, Any]:
    """Whether `new` is slower than `old` in enough rounds of `runoff`, by `threshold` overall.

    Enough: the paired sign test's chance for two equal files is at most `SIGN_TEST_LEVEL`.
    """
    ratio = runoff.ratio(new, old)
    round_ratios = runoff.round_ratios(new, old)
    slower = sum(r > 1.0 for r in round_ratios)
    significant = sign_test_p(slower, len(round_ratios)) <= SIGN_TEST_LEVEL
    return {"verdict": ("confirmed" if significant and ratio >= 1.0 + threshold
                        else "not_confirmed"),
            "rounds": runoff.rounds, "round_ratios": round_ratios,
            "previous_p50_ms": runoff.p50(old),
            "current_p50_ms": runoff.p50(new), "ratio": ratio,
            "previous_interval": list(runoff.interval(old)),
            "current_interval": list(runoff.interval(new))}


def _spec(result: VariantResult, path: Path, name: str) -> VariantSpec:
    """The variant as measured, at `path` and under `name` (the same form and settings)."""
    from tfopt.models.references import detect_format

    if (path / "MLmodel").is_file():
        path = detect_format(path)[1]  # the model file inside an MLflow Model folder
    return VariantSpec(name=name, source=result.source, format=result.format,
                       precision=result.precision, path=path, derived_from=result.derived_from,
                       params=dict(result.runner_params))


def confirm_all(moves: list[dict[str, Any]], previous_run_id: str, tracking_uri: str,
                results: list[VariantResult], inputs: BenchmarkInputs,
                protocol: MeasurementProtocol, scratch: Path,
                deadline: float | None = None, first_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Each suspected slowdown's side-by-side check, by variant (`confirm_slowdown`).

    The previous run's file of each is downloaded from its MLflow child run; a file that is
    gone (or does not load) leaves the stricter rule to judge the move, said as such. So does
    the run's time budget: a check that would end after `deadline` (`first_s` expected for the
    first, then the longest one so far) is not started (`CUT_BY_BUDGET` in its reason). A move
    no larger than one a check before it cleared is within what this run's own turns were seen
    to move by with no file slower, so the stricter rule does not count it (`moves` come
    largest first, `tfopt.report.compare.to_confirm`: a machine whose speed flips moves a
    variant's own turn by more than the stricter rule's threshold with no file slower).
    """
    from tfopt.tracking import previous_variant_file

    by_name = {result.name: result for result in results}
    checks: dict[str, dict[str, Any]] = {}
    longest = first_s
    for move in moves:
        current = by_name.get(move["variant"])
        if current is None:
            continue
        cleared = _largest_cleared(moves, checks)
        started = time.time()
        if deadline is not None and started + longest > deadline:
            checks[move["variant"]] = confirm_slowdown(
                move, current, None, inputs, protocol,
                f"{CUT_BY_BUDGET}: no time left to time it beside the previous run's file",
                cleared, cut=True)
            continue
        previous = previous_variant_file(tracking_uri, previous_run_id, move["variant"], scratch)
        why = "" if previous is not None else "not in the previous run's MLflow artifacts"
        try:
            checks[move["variant"]] = confirm_slowdown(move, current, previous, inputs,
                                                       protocol, why, cleared)
        except (RuntimeError, OSError, ValueError) as error:
            checks[move["variant"]] = confirm_slowdown(
                move, current, None, inputs, protocol,
                f"it did not load beside this run's ({type(error).__name__}: "
                f"{str(error)[:200]})", cleared)
        longest = max(longest, time.time() - started)
    return checks


def _largest_cleared(moves: list[dict[str, Any]],
                     checks: dict[str, dict[str, Any]]) -> float | None:
    """The largest move whose side-by-side check found it not slower (None: none yet)."""
    cleared = [move["ratio"] for move in moves
               if checks.get(move["variant"], {}).get("verdict") == "not_confirmed"
               and move.get("ratio") is not None]
    return max(cleared) if cleared else None
