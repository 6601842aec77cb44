"""What changed since the last run of the same config: the reason to schedule a benchmark.

`compare` reads two summaries (the previous finished run's and this one's) and says whether the
champion changed, which variants moved beyond the measurement's own noise, which started or
stopped failing, and whether the data changed. A latency move is a move only when the two runs'
p50 intervals do not overlap (each interval holds its run's true median with 97% probability,
see docs/runtimes.md, "Ties"); an accuracy move only beyond what two equally good models' accuracies
on the same test split differ by (`accuracy_noise_points`, at least
`ACCURACY_TOLERANCE_POINTS`): every run trains its models again.

Between two runs the machine itself moves (its clock, its neighbours, which core): a slowdown
within the variant's run-to-run spread over its last runs (`noise_band`, at least
`MIN_CHANGE`) is run-to-run noise. A larger one is a regression only once confirmed: the
previous run's file and this run's timed side by side in alternating rounds
(`tfopt.measurement.confirm`), this run's file the slower in all but what a sign test allows
(none of 6 rounds, one of 12) and the ratio beyond the same minimum change (`settle`); without
the previous file (or the time to time it), only a move `STRICTER` times the minimum change
counts, and none no larger than a move this run's checks cleared, said as such.
"""

from __future__ import annotations

import math
from typing import Any

MIN_CHANGE = 0.05
"""The smallest slowdown ever flagged: identical reruns move by a few percent."""
STRICTER = 2.0
"""Without the previous file to time beside this run's, a slowdown must be this many times the
minimum change to count."""
ACCURACY_TOLERANCE_POINTS = 0.5
"""Accuracy moves smaller than this (in points) are not reported: on the demo's test split one
image is 0.3 points, and retraining with the same seed is not bit-exact across machines."""
ACCURACY_Z = 1.96
"""Two-sided 95%: an accuracy move counts beyond this many standard errors of the difference."""


def accuracy_noise_points(before: float, after: float, test_examples: int | None) -> float:
    """How far (in points) two equally good models' accuracies on `test_examples` images differ.

    Each run retrains its models, so two runs' accuracies differ by their models' errors on the
    test split: a difference beyond ``ACCURACY_Z`` standard errors of two proportions on n
    images (``sqrt(2 p (1 - p) / n)``, p their mean; errors shared on the same images make it
    conservative) is a move. Measured on the demo (329 test images): identical reruns moved
    compressed variants by 0.6-1.2 points. Never below `ACCURACY_TOLERANCE_POINTS`.
    """
    if not test_examples:
        return ACCURACY_TOLERANCE_POINTS
    mean = (before + after) / 2.0
    band = ACCURACY_Z * math.sqrt(2.0 * mean * (1.0 - mean) / test_examples) * 100.0
    return max(ACCURACY_TOLERANCE_POINTS, band)


def _interval(entry: dict[str, Any]) -> tuple[float, float] | None:
    latency = entry.get("latency_ms") or {}
    interval = latency.get("p50_ci95")
    return (float(interval[0]), float(interval[1])) if interval else None


def noise_band(p50s: list[float]) -> float | None:
    """A variant's run-to-run spread: its highest p50 over its lowest, minus one (None: < 2)."""
    return max(p50s) / min(p50s) - 1.0 if len(p50s) >= 2 and min(p50s) > 0 else None


def minimum_change(band: float | None, configured: float | None) -> float:
    """The smallest slowdown of a variant that is not noise: `configured`, else its band."""
    if configured is not None:
        return max(configured, 0.0)
    return max(MIN_CHANGE, band or 0.0)


def _latency_move(before: dict[str, Any], after: dict[str, Any], history: list[float],
                  configured: float | None) -> dict[str, Any] | None:
    """A p50 move beyond both runs' intervals, or None; a slowdown's verdict so far.

    Verdicts: ``faster``; ``noise`` (within the run-to-run spread); ``to_confirm`` (to time
    side by side, `settle`).
    """
    old, new = _interval(before), _interval(after)
    if old is None or new is None:
        return None
    p50_old, p50_new = before["latency_ms"]["p50"], after["latency_ms"]["p50"]
    if new[0] > old[1]:
        direction = "slower"
    elif new[1] < old[0]:
        direction = "faster"
    else:
        return None
    ratio = p50_new / p50_old if p50_old else None
    band = noise_band(history)
    threshold = minimum_change(band, configured)
    verdict = "faster"
    if direction == "slower":
        verdict = "noise" if ratio is not None and ratio <= 1.0 + threshold else "to_confirm"
    return {"variant": after["name"], "what": "p50", "direction": direction,
            "before": p50_old, "after": p50_new, "ratio": ratio, "verdict": verdict,
            "minimum_change": threshold, "noise_band": band, "history_runs": len(history)}


def _accuracy_move(before: dict[str, Any], after: dict[str, Any],
                   test_examples: int | None,
                   budget: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """An accuracy move beyond `accuracy_noise_points` on the test split, or None.

    A metric that is no share (`budget`: the summary's ``metric_budget``, its unit not
    ``share``) moves when it changes by more than its budget allows of the earlier figure:
    ``worse`` or ``better`` in its own direction.
    """
    if before.get("accuracy") is None or after.get("accuracy") is None:
        return None
    if budget is not None and budget.get("unit", "share") != "share":
        return _metric_move(before, after, budget)
    points = (after["accuracy"] - before["accuracy"]) * 100.0
    noise = accuracy_noise_points(before["accuracy"], after["accuracy"], test_examples)
    if abs(points) <= noise:
        return None
    return {"variant": after["name"], "what": "accuracy",
            "direction": "lower" if points < 0 else "higher", "before": before["accuracy"],
            "after": after["accuracy"], "points": points, "noise_points": noise}


def _metric_move(before: dict[str, Any], after: dict[str, Any],
                 budget: dict[str, Any]) -> dict[str, Any] | None:
    """A move of a metric that is no share beyond its budget of the earlier figure, or None.

    A bound (``bound``: the worst figure kept, an SNR's floor) moves when it is crossed.
    """
    old, new = before["accuracy"], after["accuracy"]
    change = new - old
    higher = budget["higher_is_better"]
    if budget.get("bound"):
        floor = budget["amount"]
        kept_before, kept_after = ((old >= floor, new >= floor) if higher
                                   else (old <= floor, new <= floor))
        if kept_before == kept_after:
            return None
        allowance = 0.0
    else:
        allowance = budget["amount"] * abs(old) if budget["relative"] else budget["amount"]
        if abs(change) <= allowance:
            return None
    better = change > 0 if higher else change < 0
    return {"variant": after["name"], "what": budget["metric"],
            "direction": "better" if better else "worse", "before": old, "after": new,
            "change": change, "allowance": allowance}


def compare(previous: dict[str, Any], current: dict[str, Any],
            history: dict[str, list[float]] | None = None,
            configured: float | None = None) -> dict[str, Any]:
    """What changed from `previous` to `current` (two summaries of the same config).

    Args:
        previous: The config's last finished run's summary.
        current: This run's.
        history: Per variant, its p50 over the config's last runs (its run-to-run noise).
        configured: ``benchmark.regression_min_change`` (None: each variant's own band).

    Returns:
        ``previous_run_id``, ``champion`` (before, after, changed), ``data_changed``,
        ``moves`` (latency and accuracy moves beyond the measurement's noise, each slowdown
        with its verdict), ``status_changes``, ``new_variants``, ``gone_variants``, and
        ``regressions``: lower accuracy and variants that started failing; a slowdown joins
        them once confirmed (`settle`).
    """
    before = {entry["name"]: entry for entry in previous.get("variants", [])}
    after = {entry["name"]: entry for entry in current.get("variants", [])}
    moves, status_changes = [], []
    test_examples = (current.get("dataset") or {}).get("test_examples")
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old["status"] != new["status"]:
            status_changes.append({"variant": name, "before": old["status"],
                                   "after": new["status"], "error": new.get("error")})
        if old["status"] == new["status"] == "ok":
            moves += [move for move in (
                _latency_move(old, new, (history or {}).get(name, []), configured),
                _accuracy_move(old, new, test_examples, current.get("metric_budget")))
                if move]
    since = {
        "previous_run_id": previous.get("mlflow_run_id"),
        "previous_run_url": previous.get("mlflow_run_url"),
        "champion": {"before": previous.get("champion") or "",
                     "after": current.get("champion") or "",
                     "changed": (previous.get("champion") or "") != (current.get("champion")
                                                                     or "")},
        "data_changed": previous.get("dataset_digest") != current.get("dataset_digest"),
        "moves": moves,
        "status_changes": status_changes,
        "new_variants": sorted(set(after) - set(before)),
        "gone_variants": sorted(set(before) - set(after)),
        "accuracy_tolerance_points": ACCURACY_TOLERANCE_POINTS,
    }
    return {**since, "regressions": _regressions(since)}


def to_confirm(since: dict[str, Any]) -> list[dict[str, Any]]:
    """The slowdowns beyond the run-to-run noise, to time side by side before they count.

    Largest first: when the time budget cuts the checks, the slowdowns left to the stricter
    rule are the smallest (the largest are the likeliest to be a machine's slow state rather
    than a real slowdown, and only a check side by side tells).
    """
    moves = [move for move in since["moves"] if move.get("verdict") == "to_confirm"]
    return sorted(moves, key=lambda move: -(move.get("ratio") or 0.0))


def settle(since: dict[str, Any], checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`since` with each slowdown's side-by-side check (by variant) and its verdict.

    A check is `tfopt.measurement.confirm.confirm_slowdown`'s: ``confirmed`` (slower in enough
    rounds, ratio beyond the minimum change), ``not_confirmed``, or ``stricter_rule`` /
    ``within_stricter_rule`` when the previous file was gone.
    """
    moves = [{**move, "verdict": checks[move["variant"]]["verdict"],
              "side_by_side": checks[move["variant"]]}
             if move.get("verdict") == "to_confirm" and move["variant"] in checks else move
             for move in since["moves"]]
    settled = {**since, "moves": moves}
    return {**settled, "regressions": _regressions(settled)}


_COUNTED = frozenset({"confirmed", "stricter_rule"})


def _regressions(since: dict[str, Any]) -> list[dict[str, Any]]:
    """Lower accuracy or a worse metric, new failures, slowdowns confirmed (or past the rule)."""
    regressions = [move for move in since["moves"]
                   if move["direction"] in ("lower", "worse")
                   or (move["direction"] == "slower" and move.get("verdict") in _COUNTED)]
    return regressions + [change for change in since["status_changes"]
                          if change["after"] == "failed"]


def _move_line(move: dict[str, Any]) -> str:
    if "allowance" in move:
        return (f"- {move['variant']}: {move['what']} {move['before']:.4g} -> "
                f"{move['after']:.4g} ({move['direction']}, {move['change']:+.4g}, beyond the "
                f"budget's {move['allowance']:.4g})")
    if move["what"] != "p50":
        return (f"- {move['variant']}: accuracy {move['before']:.4f} -> {move['after']:.4f} "
                f"({move['points']:+.2f} points, noise {move.get('noise_points', 0.0):.2f})")
    ratio = f" ({move['ratio']:.2f}x)" if move.get("ratio") else ""
    line = (f"- {move['variant']}: p50 {move['before']:.4f} -> {move['after']:.4f} ms, "
            f"{move['direction']}{ratio}, beyond both runs' intervals")
    if move["direction"] != "slower":
        return line
    band = move.get("noise_band")
    spread = (f"its spread over {move['history_runs']} runs {band:.1%}" if band is not None
              else "no run-to-run spread measured yet")
    return line + f"; minimum change {move['minimum_change']:.1%} ({spread}): " + _verdict(move)


def _verdict(move: dict[str, Any]) -> str:
    """What a slowdown was found to be, with the side-by-side figures that say so."""
    check = move.get("side_by_side") or {}
    verdict = move.get("verdict")
    if verdict == "noise":
        return "within run-to-run noise"
    if verdict == "to_confirm":
        return "not confirmed (no side-by-side timing was made)"
    if verdict in ("stricter_rule", "within_stricter_rule"):
        counted = "a regression" if verdict == "stricter_rule" else "not a regression"
        cleared = (f" and above the {check['cleared_ratio']:.2f}x move this run cleared side "
                   "by side" if check.get("cleared_ratio") else "")
        return (f"{counted} by the stricter rule (>= {check['required_ratio']:.2f}x{cleared}): "
                f"not timed side by side ({check['reason']})")
    figures = (f"side by side in {check['rounds']} alternating rounds: previous "
               f"{check['previous_p50_ms']:.4f} ms ({check['previous_interval'][0]:.4f}-"
               f"{check['previous_interval'][1]:.4f}), this run's {check['current_p50_ms']:.4f} "
               f"ms ({check['current_interval'][0]:.4f}-{check['current_interval'][1]:.4f}), "
               f"{check['ratio']:.2f}x" + _rounds_slower(check))
    return f"{'confirmed' if verdict == 'confirmed' else 'NOT confirmed'} {figures}"


def _rounds_slower(check: dict[str, Any]) -> str:
    ratios = check.get("round_ratios") or []
    return f", slower in {sum(r > 1.0 for r in ratios)} of {len(ratios)} rounds" if ratios else ""


def regression_lines(since: dict[str, Any]) -> list[str]:
    """One line per regression: the move (with its confirming figures) or the new failure."""
    lines = []
    for regression in since["regressions"]:
        if "what" in regression:
            lines.append(_move_line(regression))
        else:
            why = f" ({str(regression['error'])[:150]})" if regression.get("error") else ""
            lines.append(f"- {regression['variant']}: {regression['before']} -> "
                         f"{regression['after']}{why}")
    return lines


def markdown(since: dict[str, Any] | None) -> list[str]:
    """The report's "Since the last run" section (a line saying there was none if None)."""
    return markdown_overview(since) + markdown_moves(since)


def markdown_overview(since: dict[str, Any] | None) -> list[str]:
    """The section's heading and overview: the run compared with, champion, data, regressions."""
    lines = ["", "## Since the last run", ""]
    if since is None:
        return [*lines, "This is the first finished run of this config in the experiment."]
    champion = since["champion"]
    lines.append(f"Compared with run {since['previous_run_id']} "
                 f"({since.get('previous_run_url') or 'MLflow'}).")
    lines.append("")
    lines.append(f"- Champion: {champion['before'] or 'none'} -> {champion['after'] or 'none'}"
                 if champion["changed"] else
                 f"- Champion: unchanged ({champion['after'] or 'none'})")
    lines.append(f"- Data: {'changed (another manifest)' if since['data_changed'] else 'same'}")
    regressions = since["regressions"]
    lines.append(f"- Regressions: {len(regressions)}" if regressions else "- Regressions: none")
    return lines


def markdown_moves(since: dict[str, Any] | None) -> list[str]:
    """The section's details: each move beyond the noise, status changes, variants come and gone."""
    if since is None:
        return []
    lines = []
    if since["moves"]:
        lines += ["", "Moves beyond the measurement's noise (latency: the two p50 intervals "
                  "apart, a slowdown a regression only beyond the run-to-run noise and "
                  "confirmed side by side; accuracy: beyond what two equally good models "
                  "differ by on the test split at 95%, at least "
                  f"{since['accuracy_tolerance_points']:g} points):", ""]
        lines += [_move_line(move) for move in since["moves"]]
    else:
        lines.append("- No latency or accuracy move beyond the noise.")
    for change in since["status_changes"]:
        why = f" ({str(change['error'])[:150]})" if change.get("error") else ""
        lines.append(f"- {change['variant']}: {change['before']} -> {change['after']}{why}")
    if since["new_variants"]:
        lines.append(f"- New variants: {', '.join(since['new_variants'])}")
    if since["gone_variants"]:
        lines.append(f"- No longer built: {', '.join(since['gone_variants'])}")
    return lines
