"""What changed since the last run of the same config: the reason to schedule a benchmark.

`compare` reads two summaries (the previous finished run's and this one's) and says whether the
champion changed, which variants moved beyond the measurement's own noise, which started or
stopped failing, and whether the data changed. A latency move counts only when the two runs'
p50 intervals do not overlap (each interval holds its run's true median with 97% probability,
see the README's "Ties"), an accuracy move only beyond `ACCURACY_TOLERANCE_POINTS`.
"""

from __future__ import annotations

from typing import Any

ACCURACY_TOLERANCE_POINTS = 0.5
"""Accuracy moves smaller than this (in points) are not reported: on the demo's test split one
image is 0.3 points, and retraining with the same seed is not bit-exact across machines."""


def _interval(entry: dict[str, Any]) -> tuple[float, float] | None:
    latency = entry.get("latency_ms") or {}
    interval = latency.get("p50_ci95")
    return (float(interval[0]), float(interval[1])) if interval else None


def _latency_move(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """A p50 move beyond both runs' intervals, or None."""
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
    return {"variant": after["name"], "what": "p50", "direction": direction,
            "before": p50_old, "after": p50_new, "ratio": p50_new / p50_old if p50_old else None}


def _accuracy_move(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """An accuracy move beyond `ACCURACY_TOLERANCE_POINTS`, or None."""
    if before.get("accuracy") is None or after.get("accuracy") is None:
        return None
    points = (after["accuracy"] - before["accuracy"]) * 100.0
    if abs(points) <= ACCURACY_TOLERANCE_POINTS:
        return None
    return {"variant": after["name"], "what": "accuracy",
            "direction": "lower" if points < 0 else "higher", "before": before["accuracy"],
            "after": after["accuracy"], "points": points}


def compare(previous: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """What changed from `previous` to `current` (two summaries of the same config).

    Returns:
        ``previous_run_id``, ``champion`` (before, after, changed), ``data_changed``,
        ``moves`` (latency and accuracy moves beyond the noise), ``status_changes``,
        ``new_variants``, ``gone_variants``, and ``regressions``: the moves that are worse
        (slower, lower accuracy) and the variants that started failing.
    """
    before = {entry["name"]: entry for entry in previous.get("variants", [])}
    after = {entry["name"]: entry for entry in current.get("variants", [])}
    moves, status_changes = [], []
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old["status"] != new["status"]:
            status_changes.append({"variant": name, "before": old["status"],
                                   "after": new["status"], "error": new.get("error")})
        if old["status"] == new["status"] == "ok":
            moves += [move for move in (_latency_move(old, new), _accuracy_move(old, new))
                      if move]
    regressions = [move for move in moves if move["direction"] in ("slower", "lower")]
    regressions += [change for change in status_changes if change["after"] == "failed"]
    return {
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
        "regressions": regressions,
        "accuracy_tolerance_points": ACCURACY_TOLERANCE_POINTS,
    }


def _move_line(move: dict[str, Any]) -> str:
    if move["what"] == "p50":
        ratio = f" ({move['ratio']:.2f}x)" if move.get("ratio") else ""
        return (f"- {move['variant']}: p50 {move['before']:.4f} -> {move['after']:.4f} ms, "
                f"{move['direction']}{ratio}, beyond both runs' intervals")
    return (f"- {move['variant']}: accuracy {move['before']:.4f} -> {move['after']:.4f} "
            f"({move['points']:+.2f} points)")


def markdown(since: dict[str, Any] | None) -> list[str]:
    """The report's "Since the last run" section (a line saying there was none if None)."""
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
    if since["moves"]:
        lines += ["", "Moves beyond the measurement's noise (latency: the two p50 intervals "
                  "apart; accuracy: more than "
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
