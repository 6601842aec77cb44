"""The report's Markdown: the whole report (``report.md``) and the run's short description."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfopt.cpu_features import SERVE_WITHOUT_AMX
from tfopt.models.health import health_line
from tfopt.report.compare import markdown_moves, markdown_overview
from tfopt.report.summary import (
    accuracy_sentence,
    classes_sentence,
    delta_cell,
    delta_header,
    metric_name,
    or_dash,
    peers_sentence,
    speedup_sentence,
)
from tfopt.search.front import combined_front, is_chosen, params_label

_WHOLE_REPORT = ("The whole report (every table, the plots, CSV and JSON) is in report/ among "
                 "this run's artifacts.")


def report_markdown(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The whole report: every table, every section (``report.md``)."""
    env = summary.get("environment", {})
    metric = metric_name(summary)
    lines = [
        *_verdict_lines(summary),
        f"MLflow run: {summary.get('mlflow_run_url', summary['mlflow_run_id'])}",
        "",
        *_context_lines(summary),
        *_since_lines(summary),
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        *_amx_lines(summary),
        "",
        "p50 95% interval: the lowest and highest median of 6 consecutive windows of the timed "
        "runs; intervals that overlap are ties. Floor: the p50 of a model that does next to "
        "nothing, through the same runner and threads (the harness's and runtime's own cost "
        "per call).",
        "",
        f"| variant | status | val {metric} | test {metric} (95% interval) "
        f"| {delta_header(summary)} (test) "
        "| p50 ms | p50 95% interval | floor ms | p99 ms "
        "| ex/s (b=1) | ex/s (batch) | size KB | gzip KB | peak MB | tied with | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]

    def interval(row: dict[str, Any]) -> str:
        if row["p50_ci95_low_ms"] is None:
            return "-"
        return f"{row['p50_ci95_low_ms']:.3f}–{row['p50_ci95_high_ms']:.3f}"

    for row in rows:
        lines.append(
            f"| {_name_cell(row, summary)} | {_status_cell(row)} "
            f"| {or_dash(row.get('val_accuracy'), '.4f')} | {_accuracy_cell(row)} "
            f"| {delta_cell(row, summary)} | {or_dash(row['p50_ms'], '.3f')} "
            f"| {interval(row)} | {or_dash(row['harness_floor_ms'], '.4f')} "
            f"| {or_dash(row['p99_ms'], '.3f')} | {or_dash(row['throughput_per_s'], ',.0f')} "
            f"| {or_dash(row['batch_throughput_per_s'], ',.0f')} "
            f"| {or_dash(_kib(row['size_bytes']), ',.1f')} "
            f"| {or_dash(_kib(row['gzip_bytes']), ',.1f')} "
            f"| {or_dash(row['peak_rss_mb'], ',.0f')} "
            f"| {row['tied_with']} | {row['notes']} |"
        )
    lines += _load_lines(summary)
    lines += search_lines(summary)
    lines += runtime_lines(summary)
    lines += api_lines(summary)
    lines += runoff_lines(summary)
    lines += op_profile_lines(summary)
    lines += _thread_lines(summary)
    return "\n".join(lines) + "\n"


def _kib(size_bytes: int | None) -> float | None:
    return None if size_bytes is None else size_bytes / 1024


def run_description(summary: dict[str, Any], limit: int) -> str:
    """The run's description (MLflow's Description box), at most `limit` characters.

    The verdicts come first and always; then the comparison with the last run and its moves,
    the variants, the searches and the runtimes side by side, in short tables, each kept whole
    if it fits (in the order of `_KEPT_FIRST`) and otherwise left out and named at the end.
    Cutting the text at the limit instead would lose whichever section came last as the report
    grows.
    """
    head = "\n".join([*_verdict_lines(summary), "", *_context_lines(summary)]).strip()
    compared = "since_last_run" in summary
    sections = {
        "the comparison with the last run": "\n".join(
            markdown_overview(summary["since_last_run"])).strip() if compared else "",
        "the moves since the last run": "\n".join(
            markdown_moves(summary["since_last_run"])).strip() if compared else "",
        "the variants": _short_variant_table(summary),
        "the searches": "\n".join(search_lines(summary)).strip(),
        "the runtimes side by side": _short_runtime_table(summary),
    }
    worst_footer = f"\n\nLeft out here for length: {', '.join(sections)}.\n{_WHOLE_REPORT}\n"
    room = limit - len(head) - len(worst_footer)
    fitting = set()
    for title in _KEPT_FIRST:
        if sections[title] and len(sections[title]) + 2 <= room:  # with the blank line before
            fitting.add(title)
            room -= len(sections[title]) + 2
    kept = [head, *(text for title, text in sections.items() if title in fitting)]
    left_out = [title for title, text in sections.items() if text and title not in fitting]
    footer = [f"Left out here for length: {', '.join(left_out)}."] if left_out else []
    return "\n\n".join(kept) + "\n\n" + "\n".join([*footer, _WHOLE_REPORT]) + "\n"


_KEPT_FIRST = ("the comparison with the last run", "the variants", "the searches",
               "the runtimes side by side", "the moves since the last run")
"""The description's sections in the order they claim its room (shown in the report's order):
the list of moves since the last run can run to thousands of characters on a noisy machine."""


def _amx_lines(summary: dict[str, Any]) -> list[str]:
    """Whether the measuring processes had AMX, and why (``benchmark.amx``)."""
    decision = summary.get("amx_decision")
    if not decision:
        return []
    line = f"{decision['reason']}."
    if decision["setting"] == "denied":
        line += f" Serve these files the same way: {SERVE_WITHOUT_AMX}."
    return ["", line]


def _verdict_lines(summary: dict[str, Any]) -> list[str]:
    """The title, the champion and its speed-ups."""
    speedups = " ".join(dict.fromkeys(filter(None, (  # one sentence when they share a reference
        speedup_sentence(summary.get(key))
        for key in ("champion_speedup", "champion_speedup_over_int8")))))
    return [
        f"# tfopt benchmark: {summary.get('config_name', '')}",
        "",
        f"Champion: **{summary['champion'] or 'none'}** ({summary['champion_reason']}).",
        *([speedups] if speedups else []),
        *filter(None, [peers_sentence(summary.get("champion_speedup_over_peers"),
                                      summary["champion"])]),
        *filter(None, [accuracy_sentence(summary.get("accuracy_verdict"))]),
        *filter(None, [classes_sentence(summary.get("accuracy_verdict"))]),
    ]


def _context_lines(summary: dict[str, Any]) -> list[str]:
    """What the verdicts rest on: training, time budget, crashes, steps that did not finish."""
    return [*training_lines(summary), *budget_lines(summary), *crash_lines(summary),
            *late_failure_lines(summary)]


def late_failure_lines(summary: dict[str, Any]) -> list[str]:
    """The steps after the measurements that failed before this report was written."""
    failures = summary.get("late_failures") or []
    if not failures:
        return []
    return ["Not finished (the figures below are kept):", "",
            *(f"- {failure['step']}: {failure['error']}" for failure in failures), ""]


def _since_lines(summary: dict[str, Any]) -> list[str]:
    """What moved since the last run of this config, where one was compared."""
    if "since_last_run" not in summary:
        return []
    since = summary["since_last_run"]
    return [*(markdown_overview(since) + markdown_moves(since))[1:], ""]


def _accuracy_cell(row: dict[str, Any]) -> str:
    if row["accuracy"] is None:
        return "-"
    if row.get("accuracy_ci95_low") is None:
        return f"{row['accuracy']:.4f}"
    return (f"{row['accuracy']:.4f} ({row['accuracy_ci95_low']:.3f}–"
            f"{row['accuracy_ci95_high']:.3f})")


def _name_cell(row: dict[str, Any], summary: dict[str, Any]) -> str:
    return ("★ " if row["name"] == summary["champion"] else "") + row["name"]


def _status_cell(row: dict[str, Any], longest: int | None = None) -> str:
    if row["status"] == "ok":
        return "ok"
    error = str(row["error"])
    if longest is not None and len(error) > longest:
        error = error[: longest - 1] + "…"
    return f"{row['status']}: {error}"


_SHORT_ERROR = 60


def _short_variant_table(summary: dict[str, Any]) -> str:
    """Every variant in six columns (the whole report has fifteen)."""
    lines = [f"| variant | status | {metric_name(summary)} | {delta_header(summary)} | p50 ms "
             "| size KB |",
             "|---|---|---:|---:|---:|---:|"]
    for entry in summary["variants"]:
        status = _status_cell(entry, _SHORT_ERROR)
        if entry["status"] != "ok":
            lines.append(f"| {entry['name']} | {status} | - | - | - | - |")
            continue
        lines.append(f"| {_name_cell(entry, summary)} | {status} "
                     f"| {or_dash(entry['accuracy'], '.4f')} "
                     f"| {delta_cell(entry, summary)} "
                     f"| {or_dash(entry['latency_ms'].get('p50'), '.3f')} "
                     f"| {entry['size_bytes'] / 1024:,.1f} |")
    return "\n".join(lines)


def _short_runtime_table(summary: dict[str, Any]) -> str:
    """Per model and precision, each runtime's fastest form and its p50, the fastest first."""
    groups = runtimes_side_by_side(summary)
    if not groups:
        return ""
    lines = ["Runtimes side by side (per model and precision, each runtime's fastest form, "
             "★ the fastest):", "", "| model | precision | runtime | variant | p50 ms |",
             "|---|---|---|---|---:|"]
    for (source, precision), entries in groups.items():
        lines += [f"| {source} | {precision} | {'★ ' if rank == 0 else ''}{entry['runtime']} "
                  f"| {entry['name']} | {entry['latency_ms']['p50']:.3f} |"
                  for rank, entry in enumerate(entries)]
    return "\n".join(lines)


def _load_lines(summary: dict[str, Any]) -> list[str]:
    """The MLPerf LoadGen scenarios, where they ran."""
    loaded = [entry for entry in summary["variants"]
              if entry.get("offline_examples_per_s") is not None
              or entry.get("server_qps_within_budget") is not None]
    if not loaded:
        return []
    lines = ["", "Load scenarios (MLPerf LoadGen): Offline = best examples/s over batch "
             "sizes; Server = highest Poisson arrival rate whose p99 met the budget.", "",
             "| variant | offline ex/s | at batch | server q/s within budget | its p99 ms "
             "| why no rate |",
             "|---|---:|---:|---:|---:|---|"]
    for entry in loaded:
        lines.append(
            f"| {entry['name']} | {or_dash(entry.get('offline_examples_per_s'), ',.0f')} "
            f"| {or_dash(entry.get('offline_batch_size'), 'd')} "
            f"| {or_dash(entry.get('server_qps_within_budget'), ',.0f')} "
            f"| {or_dash(entry.get('server_p99_ms'), '.3f')} "
            f"| {entry.get('server_reason') or ''} |")
    return lines


def _thread_lines(summary: dict[str, Any]) -> list[str]:
    """Batch-1 p50 by thread count, where benchmark.thread_sweep ran."""
    swept = [entry for entry in summary["variants"] if len(entry.get("p50_ms_by_threads", {})) > 1]
    if not swept:
        return []
    counts = sorted({int(t) for entry in swept for t in entry["p50_ms_by_threads"]})
    lines = ["", "Batch-1 p50 (ms) by threads (benchmark.thread_sweep):", "",
             "| variant | " + " | ".join(f"{t} thr" for t in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    for entry in swept:
        by_threads = entry["p50_ms_by_threads"]
        lines.append(f"| {entry['name']} | " + " | ".join(
            or_dash(by_threads.get(str(t)), ".3f") for t in counts) + " |")
    return lines


def training_lines(summary: dict[str, Any]) -> list[str]:
    """How the baseline's training ended: every verdict is judged against it."""
    training = summary.get("baseline_training")
    if not training:
        return []
    health = [f"Baseline health: {health_line(training['health'])}."] if training.get(
        "health") else []
    if not training["epochs_run"]:
        return [f"Baseline: {training['stop_reason']}.", *health, ""]
    state = "converged" if training["converged"] else "NOT converged"
    best = f", best epoch {training['best_epoch']}" if training.get("best_epoch") else ""
    return [f"Baseline: {state} after {training['epochs_run']} epochs{best} "
            f"({training['stop_reason']}).", *health, ""]


def budget_lines(summary: dict[str, Any]) -> list[str]:
    """The time budget: what was planned, what it took, what it cut."""
    budget = summary.get("budget") or {}
    if budget.get("minutes") is None:
        return []
    lines = [f"Time budget: {budget['minutes']:g} min, used {budget['used_minutes']:.1f} min. "
             f"Plan: {budget['plan']}."]
    lines += [f"- cut: {cut}" for cut in budget.get("cuts") or []]
    return [*lines, ""]


def search_lines(summary: dict[str, Any]) -> list[str]:
    """Each searched technique's trials: setting, accuracies, its file's p50, speed-up, verdict.

    On array data the figures are the run's metric's (a search compares scores, an error
    negated: `tfopt.search.trials.scored`; shown here as the metric reads).
    """
    name, shown = _search_figures(summary)
    lines = []
    for technique, search in (summary.get("search") or {}).items():
        lines += ["", f"Search of {technique}.{search['knob']} ({name} to keep: its model "
                  f"{shown(search.get('target_val_accuracy'))} on the split its training chose "
                  f"on, a TFLite file {shown(search.get('target_file_val_accuracy'))} on "
                  "validation; test reported, not chosen on; chosen: "
                  f"{_chosen_label(search)}"
                  + (f"; {search['cut']}" if search.get("cut") else "") + "):", "",
                  f"| {search['knob']} | status | held-out {name} | file | file val {name} "
                  f"| test {name} | p50 ms | speed-up (x, side by side) | epochs | s |",
                  "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for trial in search["trials"]:
            star = "★ " if is_chosen(search, trial) else ""
            lines.append(f"| {star}{params_label(trial['params'])} | {trial['status']} "
                         f"| {shown(trial['val_accuracy'])} "
                         f"| {trial.get('file') or '-'} "
                         f"| {shown(trial.get('file_val_accuracy'))} "
                         f"| {shown(trial.get('test_accuracy'))} "
                         f"| {or_dash(trial['p50_ms'], '.4f')} "
                         f"| {or_dash(trial.get('speedup'), '.2f')} "
                         f"| {trial['epochs_run']} | {trial['seconds']:g} |")
    return lines + front_lines(summary.get("search") or {}, summary)


def _search_figures(summary: dict[str, Any]) -> tuple[str, Callable[[float | None], str]]:
    """The metric a search's figures are of, and how one reads (a score turned back)."""
    budget = summary.get("metric_budget") or {}
    sign = 1.0 if budget.get("higher_is_better", True) else -1.0
    return budget.get("metric") or "accuracy", lambda score: or_dash(
        None if score is None else sign * score, ".4f")


def _chosen_label(search: dict[str, Any]) -> str:
    chosen = search.get("chosen")
    return params_label(chosen) if isinstance(chosen, dict) else or_dash(chosen, "g")


def front_lines(searches: dict[str, Any], summary: dict[str, Any] | None = None) -> list[str]:
    """The searches' combined front: the trials no other beats on both speed and accuracy.

    Their figures as `search_lines` shows them (the run's metric, from its `summary`).
    """
    name, shown = _search_figures(summary or {})
    front = combined_front(searches)
    if len(searches) < 2 or not front:
        return []
    lines = ["", "The searches' combined front (fastest first; no other trial is both faster "
             "and better on validation):", "",
             f"| search | setting | val {name} | p50 ms | speed-up (x) | within the budget |",
             "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {p['technique']} | {p['knob']} {p['setting']} | {shown(p['val_accuracy'])} "
              f"| {p['p50_ms']:.4f} | {or_dash(p['speedup'], '.2f')} "
              f"| {'yes' if p['within'] else 'no'} |" for p in front]
    return lines


def crash_lines(summary: dict[str, Any]) -> list[str]:
    """The native steps whose process crashed, and what the run did about it."""
    crashes = summary.get("native_crashes") or []
    if not crashes:
        return []
    lines = ["Contained crashes (each native step runs in a process of its own):", ""]
    for crash in crashes:
        if crash["retried"] and crash["recovered"]:
            done = (f"rerun with {crash['retry']} (oneDNN's custom operations off): it worked; "
                    "its speed and rounding may differ from a default run")
        elif crash["retried"]:
            done = f"rerun with {crash['retry']}: it crashed again; the run went on without it"
        else:
            done = "not rerun; the run went on without it"
        lines.append(f"- {crash['step']}: {crash['signal']} in {crash['what']}; {done}.")
    return [*lines, ""]



def _interval(latency: dict[str, Any]) -> str:
    low_high = latency.get("p50_ci95")
    return "-" if not low_high else f"{low_high[0]:.3f}–{low_high[1]:.3f}"


def runtimes_side_by_side(summary: dict[str, Any]) -> dict[tuple[str, str], list[dict]]:
    """Per model and precision, each runtime's fastest ok variant, fastest first.

    Only groups where more than one runtime measured that model at that precision.
    """
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for entry in summary["variants"]:
        if entry["status"] != "ok" or entry["latency_ms"].get("p50") is None:
            continue
        best = groups.setdefault((entry["source"], entry["precision"]), {})
        known = best.get(entry["runtime"])
        if known is None or entry["latency_ms"]["p50"] < known["latency_ms"]["p50"]:
            best[entry["runtime"]] = entry
    return {key: sorted(found.values(), key=lambda e: e["latency_ms"]["p50"])
            for key, found in groups.items() if len(found) > 1}


def runtime_lines(summary: dict[str, Any]) -> list[str]:
    """"Runtimes side by side": per model and precision, every runtime, the fastest marked."""
    groups = runtimes_side_by_side(summary)
    if not groups:
        return []
    lines = ["", "Runtimes side by side: per model and precision, each runtime's fastest form "
             "(★ the fastest; an interval overlapping the fastest's is a tie). The runtime "
             "often matters more than the compression.", "",
             "| model | precision | runtime | variant | p50 ms | p50 95% interval "
             "| offline ex/s | accuracy | size KB | runs as |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for (source, precision), entries in groups.items():
        fastest = entries[0]["latency_ms"].get("p50_ci95") or [0.0, 0.0]
        for rank, entry in enumerate(entries):
            latency = entry["latency_ms"]
            low = (latency.get("p50_ci95") or [latency["p50"]])[0]
            mark = "★ " if rank == 0 else ("= " if low <= fastest[1] else "")
            runs_as = ", ".join(f"{k} {v}" for k, v in (entry.get("runner") or {}).items())
            lines.append(
                f"| {source} | {precision} | {mark}{entry['runtime']} | {entry['name']} "
                f"| {latency['p50']:.3f} | {_interval(latency)} "
                f"| {or_dash(entry.get('offline_examples_per_s'), ',.0f')} "
                f"| {or_dash(entry['accuracy'], '.4f')} | {entry['size_bytes'] / 1024:,.1f} "
                f"| {runs_as} |")
    return lines


def api_verdict(by_api: dict[str, dict[str, Any]]) -> str:
    """Which API was faster on one file: the one whose interval lies wholly below, or a tie."""
    ranked = sorted(by_api.items(), key=lambda item: item[1]["p50"])
    (first, best), (_, second) = ranked[0], ranked[1]
    best_high = (best.get("p50_ci95") or [best["p50"], best["p50"]])[1]
    second_low = (second.get("p50_ci95") or [second["p50"], second["p50"]])[0]
    if best_high < second_low:
        return f"{first}, {second['p50'] / best['p50']:.2f}x"
    return "tie (intervals overlap)"


def api_lines(summary: dict[str, Any]) -> list[str]:
    """Each file timed through its runtime's APIs (LiteRT's Interpreter and CompiledModel)."""
    timed = [entry for entry in summary["variants"]
             if len(entry.get("latency_ms_by_api") or {}) > 1]
    if not timed:
        return []
    apis = sorted({api for entry in timed for api in entry["latency_ms_by_api"]})
    lines = ["", "The same file through each API of its runtime, in the same process and "
             "protocol (the table above shows the first API's figure):", "",
             "| variant | " + " | ".join(f"{api} p50 ms" for api in apis)
             + " | faster | fully accelerated |",
             "|---|" + "---:|" * len(apis) + "---|---|"]
    for entry in timed:
        by_api = entry["latency_ms_by_api"]
        cells = " | ".join(or_dash((by_api.get(api) or {}).get("p50"), ".3f") for api in apis)
        accelerated = next((value for key, value in (entry.get("runner") or {}).items()
                            if key.endswith("fully_accelerated")), "-")
        lines.append(f"| {entry['name']} | {cells} | {api_verdict(by_api)} | {accelerated} |")
    return lines


def runoff_lines(summary: dict[str, Any]) -> list[str]:
    """The run-off: the contenders' p50 on their own turns and side by side."""
    runoff = summary.get("runoff")
    if not runoff:
        return []
    lines = ["", f"Run-off: the contenders for champion timed again side by side, in "
             f"{runoff['rounds']} rounds alternating between them in one process (the machine's "
             "drift between turns reaches all of them alike); the champion is chosen on these.",
             "", "| variant | p50 on its turn ms | run-off p50 ms | run-off interval "
             "| run-off threads |", "|---|---:|---:|---:|---:|"]
    threads = (summary.get("environment") or {}).get("benchmark_threads", "-")
    for entry in summary["variants"]:
        if entry.get("runoff_p50_ms") is not None:
            low, high = entry["runoff_p50_ci95"]
            lines.append(f"| {entry['name']} | {entry['latency_ms']['p50']:.4f} "
                         f"| {entry['runoff_p50_ms']:.4f} | {low:.4f}–{high:.4f} "
                         f"| {_threads_cell(runoff, entry['name'], threads)} |")
    if runoff.get("under_load"):
        lines += ["", f"**Under load**: other processes kept {runoff['background_cores']:.2f} "
                  "cores busy on average while it ran (limit `benchmark.max_background_cores`), "
                  "in both tries: its figures may not hold on a quiet machine."]
    if runoff.get("threads"):
        lines += ["", "Each contender was first timed at each thread count in rounds of their "
                  "own (their p50s in brackets) and then at its fastest "
                  "(`benchmark.runoff_threads: fastest`); its packaged model serves with that "
                  f"count. Its turn ran at `benchmark.threads` ({threads})."]
    return lines


def _threads_cell(runoff: dict[str, Any], name: str, benchmark_threads: str) -> str:
    """The threads a contender's rounds ran with, and its p50 at each count tried to pick it."""
    picked = runoff.get("threads", {}).get(name)
    if picked is None:
        return benchmark_threads
    tried = runoff.get("thread_pick_p50_ms", {}).get(name, {})
    return f"{picked} ({', '.join(f'{count}: {p50:.4f}' for count, p50 in tried.items())} ms)"


_TOP_OPS_SHOWN = 4


def op_profile_lines(summary: dict[str, Any]) -> list[str]:
    """"Where the time goes": each profiled variant's top operators and their shares."""
    profiled = [entry for entry in summary["variants"]
                if (entry.get("op_profile") or {}).get("ops")]
    if not profiled:
        return []
    lines = ["", "Where the time goes: each variant's top operators (node, op type, share; ms per "
             "call where a profiler timed them, profilers slow calls down, so compare shares).",
             "", "| variant | measured by | top operators |", "|---|---|---|"]
    for entry in profiled:
        profile = entry["op_profile"]
        cells = []
        for op in profile["ops"][:_TOP_OPS_SHOWN]:
            timed = "" if op["ms"] is None else f", {op['ms']:.3f} ms"
            cells.append(f"{_layer_of(op['node'])} {op['kind']} {op['share']:.0%}{timed}")
        lines.append(f"| {entry['name']} | {profile['method']} | {' · '.join(cells)} |")
    return lines


def _layer_of(node: str) -> str:
    """The layer a graph node belongs to: ``model/block0_conv/Conv2D`` -> ``block0_conv``."""
    parts = node.split("/")
    return parts[-2] if len(parts) > 1 else node


