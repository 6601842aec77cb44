"""What `tfopt run` and `tfopt benchmark` print at the end, the verdict last.

The measured variants in a table, the ones not measured in a compact block, then the verdict in four
lines. The table holds only variants that were measured; a skipped or failed variant is one line of
the block with its whole reason (variants that share a reason share a line). The verdict says how
the baseline every verdict rests on ended and whether it is healthy, the champion and its speed-up
over plain int8 within how many points, what the time budget cut, and where to look.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from tfopt.cpu_features import SERVE_WITHOUT_AMX
from tfopt.models.health import health_line
from tfopt.report.summary import (
    delta_cell,
    delta_header,
    in_points,
    load_clause,
    metric_name,
    not_held_on_test,
    or_dash,
    threads_clause,
)

COLUMNS = ("variant", "accuracy", "Δ pts", "p50 ms", "p99 ms", "ex/s", "size KB", "gzip KB")



def measured_table(summary: dict[str, Any]) -> Table:
    """The ok variants: the metric, its difference to the baseline, latency, throughput, sizes.

    The metric's column is named after it (accuracy unless ``eval.metric`` names another). The
    champion is starred.
    """
    table = Table(title="tfopt: variants measured on the same test inputs (★ champion)")
    named = {"accuracy": metric_name(summary), "Δ pts": delta_header(summary)}
    for column in COLUMNS:
        table.add_column(named.get(column, column),
                         justify="left" if column == "variant" else "right")
    for entry in summary["variants"]:
        if entry["status"] != "ok":
            continue
        latency = entry["latency_ms"]
        table.add_row(
            ("★ " if entry["name"] == summary.get("champion") else "") + entry["name"],
            or_dash(entry["accuracy"], ".4f"),
            delta_cell(entry, summary),
            or_dash(latency["p50"], ".3f"),
            or_dash(latency["p99"], ".3f"),
            or_dash(entry["throughput_per_s"], ",.0f"),
            or_dash(entry["size_bytes"] / 1024, ",.1f"),
            or_dash(entry["gzip_bytes"] / 1024, ",.1f"),
        )
    return table


def not_measured_lines(summary: dict[str, Any]) -> list[str]:
    """One line per reason a variant was not measured: ``<status>: <names>: <reason>``.

    Failed variants first; the reasons whole, variants of one reason on one line.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for entry in summary["variants"]:
        if entry["status"] != "ok":
            key = (entry["status"], entry["error"] or "no reason recorded")
            groups.setdefault(key, []).append(entry["name"])
    order = sorted(groups, key=lambda key: (key[0] != "failed", _first(summary, groups[key])))
    return [f"{status}: {', '.join(groups[(status, reason)])}: {reason}"
            for status, reason in order]


def _first(summary: dict[str, Any], names: list[str]) -> int:
    """Where the first of `names` stands among the summary's variants."""
    positions = {entry["name"]: index for index, entry in enumerate(summary["variants"])}
    return min(positions[name] for name in names)


def champion_line(summary: dict[str, Any]) -> str:
    """The champion, its speed-ups over ``baseline-tflite-int8`` and the fastest peer, its accuracy.

    The peers: the baseline's one-call forms (each runtime's int8, XLA), what a user would pick
    instead of tfopt (`tfopt.measurement.champion.is_peer`).
    """
    champion = summary.get("champion")
    if not champion:
        return f"champion: none ({summary.get('champion_reason') or 'no variant qualified'})"
    entry = next(v for v in summary["variants"] if v["name"] == champion)
    delta = entry.get("accuracy_delta_points")
    budget = summary.get("accuracy_budget_points")
    judged_on = (summary.get("accuracy_verdict") or {}).get("judged_on")
    judged = f", judged on {judged_on}" if judged_on else ""
    accuracy = ("" if delta is None else f", {delta:+.2f} points against the baseline on test"
                + (f" (budget {budget:g} point{'' if budget == 1 else 's'}{judged})"
                   if budget is not None else ""))
    metric_budget = summary.get("metric_budget") or {}
    if metric_budget.get("bound") and entry.get("accuracy") is not None:
        accuracy = (f", {metric_budget['metric']} {entry['accuracy']:.4g} on test against "
                    f"the baseline's own outputs (budget {metric_budget['described']}{judged})")
    elif not in_points(summary) and entry.get("metric_delta") is not None:
        accuracy = (f", {metric_budget['metric']} {entry['accuracy']:.4g} against the "
                    f"baseline's {entry['accuracy'] - entry['metric_delta']:.4g} on test "
                    f"(budget {metric_budget['described']}{judged})")
    speedup = summary.get("champion_speedup_over_int8")
    if speedup and speedup.get("ratio") is not None:
        how = _how(speedup)
        faster = (f"{speedup['ratio']:.2f}x the speed of {speedup['reference']} ({how}: "
                  f"{speedup['champion_p50_ms']:.4f} vs {speedup['reference_p50_ms']:.4f} ms"
                  f"{threads_clause(speedup)}{load_clause(speedup)})")
    elif champion == "baseline-tflite-int8":
        faster = "plain int8 itself: no compressed variant was faster within the budget"
    else:
        faster = f"batch-1 p50 {or_dash(entry['latency_ms']['p50'], '.4f')} ms"
    held_out = not_held_on_test(summary.get("accuracy_verdict"))
    return (f"champion: {champion}, {faster}{peers_clause(summary)}{accuracy}"
            + (f"; {held_out}" if held_out else ""))


def peers_clause(summary: dict[str, Any]) -> str:
    """"; 1.60x the fastest of the 4 peers, baseline-openvino-int8 (side by side)", or nothing."""
    peer = summary.get("champion_speedup_over_peers")
    if not peer or peer.get("ratio") is None:
        return ""
    count = len(peer["peers_p50_ms"])
    if peer["reference"] == summary.get("champion"):
        return (f"; itself one of the {count} peers (one converter call): "
                "no compressed variant beat them")
    if peer["reference"] == (summary.get("champion_speedup_over_int8") or {}).get("reference"):
        return f"; that file is the fastest of the {count} peers (one converter call each)"
    return (f"; {peer['ratio']:.2f}x the fastest of the {count} peers, {peer['reference']} "
            f"({_how(peer)})")


def _how(speedup: dict[str, Any]) -> str:
    """How a speed-up was measured: side by side in the run-off, or on each file's own turn."""
    return "side by side" if speedup["side_by_side"] else "each on its own turn"


def budget_line(summary: dict[str, Any]) -> str:
    """How much of the time budget the run used and what it cut, every cut named."""
    budget = summary.get("budget")
    if not budget or budget.get("minutes") is None:
        used = f" ({budget['used_minutes']:.1f} min)" if budget else ""
        return f"time budget: none set{used}"
    said = f"time budget: {budget['used_minutes']:.1f} of {budget['minutes']:g} min used"
    cuts = budget.get("cuts") or []
    return f"{said}; cut: {'; '.join(cuts)}" if cuts else f"{said}; nothing cut"


def where_to_look_line(summary: dict[str, Any], prefect_ui: str) -> str:
    """The run's Prefect flow run, MLflow run and report, on one line."""
    parts = [f"Prefect UI {prefect_ui}/runs/flow-run/{summary['prefect_flow_run_id']}",
             f"MLflow UI {summary['mlflow_run_url']}"]
    if summary.get("report"):
        parts.append(f"report {summary['report']}")
    return "look: " + "  |  ".join(parts)


def baseline_line(summary: dict[str, Any]) -> str | None:
    """The baseline every verdict is judged against: how its training ended, its health."""
    training = summary.get("baseline_training")
    if not training or not training.get("health"):
        return None
    ended = ("taken as it is" if not training["epochs_run"] else
             f"{'converged' if training['converged'] else 'NOT converged'} after "
             f"{training['epochs_run']} epochs")
    return f"baseline: {ended}, {health_line(training['health'])}"


def amx_line(summary: dict[str, Any]) -> str | None:
    """How to serve the files when every variant was measured with AMX refused (else None)."""
    decision = summary.get("amx_decision")
    if not decision or decision["setting"] != "denied":
        return None
    return f"{decision['reason']}: serve the same way: {SERVE_WITHOUT_AMX}"


def late_failure_lines(summary: dict[str, Any]) -> list[str]:
    """One line per step after the measurements that failed (the figures above are kept)."""
    return [f"not finished: {failure['step']}: {failure['error']}"
            for failure in summary.get("late_failures") or []]


def verdict_lines(summary: dict[str, Any], prefect_ui: str) -> list[str]:
    """The run's last lines: baseline, champion (and AMX), what did not finish, cuts, where."""
    optional = [baseline_line(summary), champion_line(summary), amx_line(summary)]
    return [*(line for line in optional if line), *late_failure_lines(summary),
            budget_line(summary), where_to_look_line(summary, prefect_ui)]
