"""The benchmark report files: JSON, CSV, Markdown and plots, with a diagnosis of surprises."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from tfopt.artifacts import VariantResult
from tfopt.fileio import atomic_write_text
from tfopt.report.compare import markdown as markdown_since
from tfopt.report.summary import speedup_sentence


def pareto_front(points: list[tuple[str, float, float]]) -> set[str]:
    """Names on the accuracy/latency Pareto front: no other point is faster and as accurate."""
    front = set()
    for name, latency, accuracy in points:
        dominated = any(
            other_latency <= latency and other_accuracy >= accuracy
            and (other_latency < latency or other_accuracy > accuracy)
            for _, other_latency, other_accuracy in points
        )
        if not dominated:
            front.add(name)
    return front


_CSV_COLUMNS = ("name", "source", "format", "precision", "status", "accuracy",
                "accuracy_delta_points", "top1_agreement", "max_abs_diff", "p50_ms",
                "p50_ci95_low_ms", "p50_ci95_high_ms", "harness_floor_ms", "tied_with", "p90_ms",
                "p95_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "trimmed_mean_ms",
                "cv", "stable", "throughput_per_s", "batch_throughput_per_s", "batch_size",
                "size_bytes", "gzip_bytes", "peak_rss_mb", "load_seconds", "first_inference_ms",
                "timed_runs", "gflops_per_inference", "achieved_gflops_per_s",
                "offline_examples_per_s", "offline_batch_size", "server_qps_within_budget",
                "server_p99_ms",
                "p50_ms_by_threads", "error", "notes")


def report_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per variant (the CSV and Markdown tables)."""
    rows = []
    for entry in summary["variants"]:
        latency = entry["latency_ms"]
        row = {key: entry.get(key) for key in _CSV_COLUMNS}
        for stat in ("p50", "p90", "p95", "p99", "mean", "std", "min", "max", "trimmed_mean"):
            row[f"{stat}_ms"] = latency.get(stat)
        row["cv"], row["stable"] = latency.get("cv"), latency.get("stable")
        row["p50_ci95_low_ms"], row["p50_ci95_high_ms"] = latency.get("p50_ci95") or (None, None)
        row["tied_with"] = " ".join(entry.get("tied_with", []))
        row["p50_ms_by_threads"] = " ".join(
            f"{threads}:{p50:.4f}" for threads, p50 in entry.get("p50_ms_by_threads", {}).items())
        row["notes"] = " | ".join(entry.get("flags", []) + entry.get("notes", []))
        rows.append(row)
    return rows


def _markdown(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    env = summary.get("environment", {})
    lines = [
        f"# tfopt benchmark: {summary.get('config_name', '')}",
        "",
        f"Champion: **{summary['champion'] or 'none'}** ({summary['champion_reason']}).",
        " ".join(dict.fromkeys(filter(None, (  # one sentence when the two share a reference
            speedup_sentence(summary.get(key))
            for key in ("champion_speedup", "champion_speedup_over_int8"))))),
        f"MLflow run: {summary.get('mlflow_run_url', summary['mlflow_run_id'])}",
        "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        "p50 95% interval: the lowest and highest median of 6 consecutive windows of the timed "
        "runs; intervals that overlap are ties. Floor: the p50 of a model that does next to "
        "nothing, through the same runner and threads (the harness's and runtime's own cost "
        "per call).",
        "",
        "| variant | status | accuracy | Δ pts | p50 ms | p50 95% interval | floor ms | p99 ms "
        "| ex/s (b=1) | ex/s (batch) | size KB | gzip KB | peak MB | tied with | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    if "since_last_run" in summary:  # a scheduled run is read for this first
        lines[6:6] = [*markdown_since(summary["since_last_run"])[1:], ""]
    lines[6:6] = [*_training_lines(summary), *_budget_lines(summary), *_crash_lines(summary)]

    def fmt(value: Any, pattern: str) -> str:
        return "-" if value is None else format(value, pattern)

    def interval(row: dict[str, Any]) -> str:
        if row["p50_ci95_low_ms"] is None:
            return "-"
        return f"{row['p50_ci95_low_ms']:.3f}–{row['p50_ci95_high_ms']:.3f}"

    for row in rows:
        star = "★ " if row["name"] == summary["champion"] else ""
        status = row["status"] if row["status"] == "ok" else f"{row['status']}: {row['error']}"
        lines.append(
            f"| {star}{row['name']} | {status} | {fmt(row['accuracy'], '.4f')} "
            f"| {fmt(row['accuracy_delta_points'], '+.2f')} | {fmt(row['p50_ms'], '.3f')} "
            f"| {interval(row)} | {fmt(row['harness_floor_ms'], '.4f')} "
            f"| {fmt(row['p99_ms'], '.3f')} | {fmt(row['throughput_per_s'], ',.0f')} "
            f"| {fmt(row['batch_throughput_per_s'], ',.0f')} "
            f"| {fmt(row['size_bytes'] / 1024, ',.1f')} "
            f"| {fmt(row['gzip_bytes'] / 1024, ',.1f')} | {fmt(row['peak_rss_mb'], ',.0f')} "
            f"| {row['tied_with']} | {row['notes']} |"
        )
    loaded = [entry for entry in summary["variants"]
              if entry.get("offline_examples_per_s") is not None
              or entry.get("server_qps_within_budget") is not None]
    if loaded:
        lines += ["", "Load scenarios (MLPerf LoadGen): Offline = best examples/s over batch "
                  "sizes; Server = highest Poisson arrival rate whose p99 met the budget.", "",
                  "| variant | offline ex/s | at batch | server q/s within budget | its p99 ms "
                  "| why no rate |",
                  "|---|---:|---:|---:|---:|---|"]
        for entry in loaded:
            lines.append(
                f"| {entry['name']} | {fmt(entry.get('offline_examples_per_s'), ',.0f')} "
                f"| {fmt(entry.get('offline_batch_size'), 'd')} "
                f"| {fmt(entry.get('server_qps_within_budget'), ',.0f')} "
                f"| {fmt(entry.get('server_p99_ms'), '.3f')} "
                f"| {entry.get('server_reason') or ''} |")
    lines += _search_lines(summary)
    lines += _runtime_lines(summary)
    lines += _api_lines(summary)
    lines += _runoff_lines(summary)
    lines += _op_profile_lines(summary)
    swept = [entry for entry in summary["variants"] if len(entry.get("p50_ms_by_threads", {})) > 1]
    if swept:
        counts = sorted({int(t) for entry in swept for t in entry["p50_ms_by_threads"]})
        lines += ["", "Batch-1 p50 (ms) by threads (benchmark.thread_sweep):", "",
                  "| variant | " + " | ".join(f"{t} thr" for t in counts) + " |",
                  "|---|" + "---:|" * len(counts)]
        for entry in swept:
            by_threads = entry["p50_ms_by_threads"]
            lines.append(f"| {entry['name']} | " + " | ".join(
                fmt(by_threads.get(str(t)), ".3f") for t in counts) + " |")
    return "\n".join(lines) + "\n"


def _training_lines(summary: dict[str, Any]) -> list[str]:
    """How the baseline's training ended: every verdict is judged against it."""
    training = summary.get("baseline_training")
    if not training:
        return []
    if not training["epochs_run"]:
        return [f"Baseline: {training['stop_reason']}.", ""]
    state = "converged" if training["converged"] else "NOT converged"
    best = f", best epoch {training['best_epoch']}" if training.get("best_epoch") else ""
    return [f"Baseline: {state} after {training['epochs_run']} epochs{best} "
            f"({training['stop_reason']}).", ""]


def _budget_lines(summary: dict[str, Any]) -> list[str]:
    """The time budget: what was planned, what it took, what it cut."""
    budget = summary.get("budget") or {}
    if budget.get("minutes") is None:
        return []
    lines = [f"Time budget: {budget['minutes']:g} min, used {budget['used_minutes']:.1f} min. "
             f"Plan: {budget['plan']}."]
    lines += [f"- cut: {cut}" for cut in budget.get("cuts") or []]
    return [*lines, ""]


def _search_lines(summary: dict[str, Any]) -> list[str]:
    """Each searched technique's trials: setting, accuracies, its file's p50, speed-up, verdict."""
    lines = []
    for technique, search in (summary.get("search") or {}).items():
        target = search.get("target_val_accuracy")
        tested = search.get("target_test_accuracy")
        lines += ["", f"Search of {technique}.{search['knob']} (accuracy to keep: validation "
                  f"{_fmt(target, '.4f')}, a TFLite file on test {_fmt(tested, '.4f')}; chosen: "
                  f"{_fmt(search['chosen'], 'g')}"
                  + (f"; {search['cut']}" if search.get("cut") else "") + "):", "",
                  f"| {search['knob']} | status | val accuracy | file "
                  "| test accuracy | p50 ms | speed-up (x, side by side) | epochs | s |",
                  "|---:|---|---:|---|---:|---:|---:|---:|---:|"]
        for trial in search["trials"]:
            value = next(iter(trial["params"].values()))
            star = "★ " if value == search["chosen"] else ""
            lines.append(f"| {star}{value:g} | {trial['status']} "
                         f"| {_fmt(trial['val_accuracy'], '.4f')} "
                         f"| {trial.get('file') or '-'} "
                         f"| {_fmt(trial.get('test_accuracy'), '.4f')} "
                         f"| {_fmt(trial['p50_ms'], '.4f')} "
                         f"| {_fmt(trial.get('speedup'), '.2f')} "
                         f"| {trial['epochs_run']} | {trial['seconds']:g} |")
    return lines


def _crash_lines(summary: dict[str, Any]) -> list[str]:
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


def _fmt(value: Any, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


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


def _runtime_lines(summary: dict[str, Any]) -> list[str]:
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
                f"| {_fmt(entry.get('offline_examples_per_s'), ',.0f')} "
                f"| {_fmt(entry['accuracy'], '.4f')} | {entry['size_bytes'] / 1024:,.1f} "
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


def _api_lines(summary: dict[str, Any]) -> list[str]:
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
        cells = " | ".join(_fmt((by_api.get(api) or {}).get("p50"), ".3f") for api in apis)
        accelerated = next((value for key, value in (entry.get("runner") or {}).items()
                            if key.endswith("fully_accelerated")), "-")
        lines.append(f"| {entry['name']} | {cells} | {api_verdict(by_api)} | {accelerated} |")
    return lines


def _runoff_lines(summary: dict[str, Any]) -> list[str]:
    """The run-off: the contenders' p50 on their own turns and side by side."""
    runoff = summary.get("runoff")
    if not runoff:
        return []
    lines = ["", f"Run-off: the contenders for champion timed again side by side, in "
             f"{runoff['rounds']} rounds alternating between them in one process (the machine's "
             "drift between turns reaches all of them alike); the champion is chosen on these.",
             "", "| variant | p50 on its turn ms | run-off p50 ms | run-off interval |",
             "|---|---:|---:|---:|"]
    for entry in summary["variants"]:
        if entry.get("runoff_p50_ms") is not None:
            low, high = entry["runoff_p50_ci95"]
            lines.append(f"| {entry['name']} | {entry['latency_ms']['p50']:.4f} "
                         f"| {entry['runoff_p50_ms']:.4f} | {low:.4f}–{high:.4f} |")
    return lines


_TOP_OPS_SHOWN = 4


def _op_profile_lines(summary: dict[str, Any]) -> list[str]:
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


def save_figure(fig: object, path: Path) -> Path:
    """Lay out, write as PNG and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _accuracy_plot(summary: dict[str, Any], ok: list[VariantResult], path: Path) -> Path:
    """Accuracy against batch-1 p50 with the Pareto front (variants measured on labelled data)."""
    import matplotlib.pyplot as plt

    front = pareto_front([(r.name, r.latency_ms.p50, r.accuracy) for r in ok])
    fig, axis = plt.subplots(figsize=(8, 5))
    for result in ok:
        on_front = result.name in front
        axis.scatter(result.latency_ms.p50, result.accuracy, s=60 if on_front else 30,
                     color="tab:red" if on_front else "tab:gray", zorder=3)
        axis.annotate(result.name, (result.latency_ms.p50, result.accuracy), fontsize=7,
                      xytext=(4, 2), textcoords="offset points")
    front_points = sorted((r.latency_ms.p50, r.accuracy) for r in ok if r.name in front)
    axis.plot(*zip(*front_points, strict=True), color="tab:red", linestyle="--",
              label="Pareto front")
    axis.set_xscale("log")
    axis.set_xlabel("batch-1 p50 latency (ms, log)")
    axis.set_ylabel("test accuracy")
    axis.set_title(f"Accuracy vs latency (champion: {summary['champion'] or 'none'})")
    axis.legend()
    return save_figure(fig, path)


def _history_plot(history: list[dict[str, Any]], path: Path) -> Path:
    """The champion's p50 and accuracy over the config's runs, this one last."""
    import matplotlib.pyplot as plt

    runs = list(range(1, len(history) + 1))
    fig, latency_axis = plt.subplots(figsize=(8, 4))
    latency_axis.plot(runs, [point["p50_ms"] for point in history], "o-", color="tab:blue")
    latency_axis.set_xlabel("run of this config (oldest first)")
    latency_axis.set_ylabel("champion p50 (ms)", color="tab:blue")
    accuracy_axis = latency_axis.twinx()
    accuracy_axis.plot(runs, [point.get("accuracy") for point in history], "s--",
                       color="tab:green")
    accuracy_axis.set_ylabel("champion accuracy", color="tab:green")
    for run, point in zip(runs, history, strict=True):
        latency_axis.annotate(point.get("champion", ""), (run, point["p50_ms"]), fontsize=6,
                              xytext=(3, 3), textcoords="offset points")
    latency_axis.set_title("The champion over this config's runs")
    return save_figure(fig, path)


def _search_plot(searches: dict[str, Any], path: Path) -> Path:
    """Every search's trials: validation accuracy against p50, the target and the choice."""
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4.5))
    for technique, search in searches.items():
        timed = [t for t in search["trials"] if t["p50_ms"] is not None
                 and t["val_accuracy"] is not None]
        if not timed:
            continue
        points = axis.scatter([t["p50_ms"] for t in timed], [t["val_accuracy"] for t in timed],
                              label=technique)
        for trial in timed:
            value = next(iter(trial["params"].values()))
            chosen = " (chosen)" if value == search["chosen"] else ""
            axis.annotate(f"{value:g}{chosen}", (trial["p50_ms"], trial["val_accuracy"]),
                          fontsize=7, xytext=(3, 3), textcoords="offset points")
        if search.get("target_val_accuracy") is not None:
            axis.axhline(search["target_val_accuracy"], linestyle="--", linewidth=0.8,
                         color=points.get_facecolor()[0])
    axis.set_xlabel("the trial's fastest TFLite file within the budget: p50 (ms, batch 1)")
    axis.set_ylabel("validation accuracy")
    axis.set_title("Search trials: accuracy against latency (dashed: within the budget above)")
    axis.legend()
    return save_figure(fig, path)


def _plots(summary: dict[str, Any], results: list[VariantResult], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.status == "ok" and r.latency_ms]
    paths = []
    if not ok:
        return paths
    scored = [r for r in ok if r.accuracy is not None]
    if scored:
        paths.append(_accuracy_plot(summary, scored, out_dir / "accuracy_vs_latency.png"))
    if len(summary.get("champion_history") or []) > 1:
        paths.append(_history_plot(summary["champion_history"], out_dir / "champion_history.png"))
    if any(search["trials"] for search in (summary.get("search") or {}).values()):
        paths.append(_search_plot(summary["search"], out_dir / "search_front.png"))

    fig, axis = plt.subplots(figsize=(8, max(3, 0.35 * len(ok))))
    names = [r.name for r in ok]
    axis.barh(names, [r.size_bytes / 1024 for r in ok], color="tab:blue", label="size")
    axis.barh(names, [r.gzip_bytes / 1024 for r in ok], color="tab:orange", alpha=0.7,
              label="gzip size")
    axis.set_xlabel("KB")
    axis.set_title("Model size per variant")
    axis.legend()
    paths.append(save_figure(fig, out_dir / "size.png"))

    fig, axis = plt.subplots(figsize=(8, max(3, 0.35 * len(ok))))
    axis.boxplot([r.samples_ms or [r.latency_ms.p50] for r in ok], vert=False,
                 tick_labels=names, showfliers=False)
    axis.set_xscale("log")
    axis.set_xlabel("batch-1 latency (ms, log), warm-up excluded")
    axis.set_title("Latency distributions")
    paths.append(save_figure(fig, out_dir / "latency_distributions.png"))
    swept = [r for r in ok if len(r.p50_ms_by_threads) > 1]
    if swept:
        paths.append(_thread_scaling_plot(swept, out_dir / "thread_scaling.png"))
    counted = [entry for entry in summary["variants"]
               if entry.get("achieved_gflops_per_s") and entry.get("size_bytes")]
    if counted:
        paths.append(_roofline_plot(counted, summary.get("environment", {}),
                                    out_dir / "roofline.png"))
    return paths


def _roofline_plot(entries: list[dict[str, Any]], env: dict[str, Any], path: Path) -> Path:
    """Achieved GFLOP/s against FLOPs per byte of model, under the machine's measured roofs.

    The model's bytes stand in for the bytes an inference must read (its weights), so a point's
    distance below the roof shows how far the variant is from what this CPU could do.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axis = plt.subplots(figsize=(8, 5))
    intensity = [e["gflops_per_inference"] * 1e9 / e["size_bytes"] for e in entries]
    for entry, x in zip(entries, intensity, strict=True):
        axis.scatter(x, entry["achieved_gflops_per_s"], zorder=3)
        axis.annotate(entry["name"], (x, entry["achieved_gflops_per_s"]), fontsize=7,
                      xytext=(4, 2), textcoords="offset points")
    peak, bandwidth = env.get("machine_peak_gflops"), env.get("machine_memory_gb_per_s")
    xs = np.geomspace(min(intensity) / 4, max(intensity) * 4, 100)
    if peak:
        roof = np.full_like(xs, float(peak))
        if bandwidth:
            roof = np.minimum(roof, float(bandwidth) * xs)
        axis.plot(xs, roof, color="tab:red", linestyle="--",
                  label=f"roof: {float(peak):.0f} GFLOP/s matmul peak"
                  + (f", {float(bandwidth):.0f} GB/s copy" if bandwidth else ""))
        axis.legend(fontsize=8)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("FLOPs per byte of model (log)")
    axis.set_ylabel("achieved GFLOP/s at batch 1 (log)")
    axis.set_title("Where each variant stands against this machine's limits")
    return save_figure(fig, path)


def _thread_scaling_plot(swept: list[VariantResult], path: Path) -> Path:
    """Speed-up over one thread against the thread count, one line per variant."""
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 5))
    most = max(max(r.p50_ms_by_threads) for r in swept)
    axis.plot([1, most], [1, most], color="tab:gray", linestyle=":", label="linear")
    for result in swept:
        threads = sorted(result.p50_ms_by_threads)
        single = result.p50_ms_by_threads[threads[0]]
        axis.plot(threads, [single / result.p50_ms_by_threads[t] for t in threads], marker="o",
                  label=result.name)
    axis.set_xlabel("threads")
    axis.set_ylabel("batch-1 p50 speed-up over 1 thread")
    axis.set_xticks(range(1, most + 1))
    axis.set_title("Thread scaling (benchmark.thread_sweep)")
    axis.legend(fontsize=7)
    return save_figure(fig, path)


def write_report_files(summary: dict[str, Any], results: list[VariantResult],
                       out_dir: Path) -> list[Path]:
    """Write ``report.json``, ``report.csv``, ``report.md`` and the PNG plots into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report_rows(summary)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(_CSV_COLUMNS))
    writer.writeheader()
    writer.writerows(rows)
    files = {
        "report.json": json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n",
        "report.csv": buffer.getvalue(),
        "report.md": _markdown(summary, rows),
    }
    paths = []
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths + _plots(summary, results, out_dir)
