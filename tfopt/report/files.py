"""The benchmark report files: JSON, CSV, Markdown and plots, with a diagnosis of surprises."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from tfopt.artifacts import VariantResult
from tfopt.eval.classes import ClassResults
from tfopt.fileio import atomic_write_text
from tfopt.report.markdown import report_markdown
from tfopt.search.front import combined_front, is_chosen, params_label


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
                "accuracy_ci95_low", "accuracy_ci95_high", "val_accuracy",
                "accuracy_delta_points", "metric_delta", "top1_agreement", "max_abs_diff", "p50_ms",
                "p50_ci95_low_ms", "p50_ci95_high_ms", "harness_floor_ms", "tied_with", "p90_ms",
                "p95_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "trimmed_mean_ms",
                "cv", "stable", "throughput_per_s", "batch_throughput_per_s", "batch_size",
                "size_bytes", "gzip_bytes", "peak_rss_mb", "load_seconds", "first_inference_ms",
                "timed_runs", "gflops_per_inference", "achieved_gflops_per_s",
                "offline_examples_per_s", "offline_batch_size", "server_qps_within_budget",
                "server_p99_ms",
                "p50_ms_by_threads", "error", "notes")


_NOT_FIGURES = ("name", "source", "format", "precision", "status", "tied_with", "error", "notes")


def report_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per variant (the CSV and Markdown tables).

    A variant not measured (failed or skipped) shows no figures, only why.
    """
    rows = []
    for entry in summary["variants"]:
        latency = entry["latency_ms"]
        row = {key: entry.get(key) for key in _CSV_COLUMNS}
        for stat in ("p50", "p90", "p95", "p99", "mean", "std", "min", "max", "trimmed_mean"):
            row[f"{stat}_ms"] = latency.get(stat)
        row["cv"], row["stable"] = latency.get("cv"), latency.get("stable")
        row["p50_ci95_low_ms"], row["p50_ci95_high_ms"] = latency.get("p50_ci95") or (None, None)
        row["accuracy_ci95_low"], row["accuracy_ci95_high"] = (entry.get("accuracy_ci95")
                                                               or (None, None))
        row["tied_with"] = " ".join(entry.get("tied_with", []))
        row["p50_ms_by_threads"] = " ".join(
            f"{threads}:{p50:.4f}" for threads, p50 in entry.get("p50_ms_by_threads", {}).items())
        row["notes"] = " | ".join(entry.get("flags", []) + entry.get("notes", []))
        if entry["status"] != "ok":
            row.update({key: None for key in row if key not in _NOT_FIGURES})
        rows.append(row)
    return rows


def save_figure(fig: object, path: Path) -> Path:
    """Lay out, write as PNG and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def confusion_figure(results: ClassResults, title: str, path: Path) -> Path:
    """The confusion matrix as a picture, each true class's row shaded by its share.

    Counts are written in the cells (up to 30 classes), each class's accuracy beside its row.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    count = len(results.names)
    images = np.maximum(results.images, 1)[:, None]
    size = min(12.0, 2.5 + 0.45 * count)
    fig, axis = plt.subplots(figsize=(size + 1.5, size))
    axis.imshow(results.confusion / images, cmap="Blues", vmin=0.0, vmax=1.0)
    if count <= 30:
        for row in range(count):
            for column in range(count):
                value = int(results.confusion[row, column])
                if value:
                    axis.text(column, row, str(value), ha="center", va="center", fontsize=7,
                              color="white" if value / images[row, 0] > 0.5 else "black")
    labels = [f"{name} ({accuracy:.0%})" if not np.isnan(accuracy) else name
              for name, accuracy in zip(results.names, results.accuracies, strict=True)]
    axis.set_yticks(range(count), labels, fontsize=7)
    axis.set_xticks(range(count), results.names, fontsize=7, rotation=90)
    axis.set_ylabel("true class (its accuracy)")
    axis.set_xlabel("predicted class")
    axis.set_title(title, fontsize=9)
    return save_figure(fig, path)


def _accuracy_plot(summary: dict[str, Any], ok: list[VariantResult], path: Path) -> Path:
    """Accuracy against batch-1 p50 with the Pareto front (variants measured on labelled data).

    Colours name the runtime; only the front, the champion and ``baseline-tflite-int8`` (the
    yardstick of every speed-up) are labelled, so the names stay legible; the dotted line is the
    lowest accuracy the champion rule accepts.
    """
    import matplotlib.pyplot as plt

    from tfopt.runtimes import runtime_of

    front = pareto_front([(r.name, r.latency_ms.p50, r.accuracy) for r in ok])
    judged_on = (summary.get("accuracy_verdict") or {}).get("judged_on")
    labelled = {*front, summary.get("champion"), "baseline-tflite-int8"}
    fig, axis = plt.subplots(figsize=(9, 5.5))
    for runtime in sorted({runtime_of(r.format).name for r in ok}):
        members = [r for r in ok if runtime_of(r.format).name == runtime]
        axis.scatter([r.latency_ms.p50 for r in members], [r.accuracy for r in members],
                     s=[70 if r.name in front else 30 for r in members], label=runtime,
                     edgecolors=["black" if r.name in front else "none" for r in members],
                     zorder=3)
    for result in ok:
        if result.name in labelled:
            star = "★ " if result.name == summary.get("champion") else ""
            axis.annotate(star + result.name, (result.latency_ms.p50, result.accuracy),
                          fontsize=8, xytext=(5, -10 if result.name in front else 4),
                          textcoords="offset points")
    front_points = sorted((r.latency_ms.p50, r.accuracy) for r in ok if r.name in front)
    axis.plot(*zip(*front_points, strict=True), color="tab:red", linestyle="--",
              label="Pareto front")
    floor = _accuracy_floor(summary)
    if floor is not None:
        axis.axhline(floor, color="tab:gray", linestyle=":",
                     label="accuracy budget" if judged_on != "validation"
                     else "baseline less the budget (judged on validation)")
    axis.set_xscale("log")
    axis.set_xlabel("batch-1 p50 latency (ms, log): left is faster")
    axis.set_ylabel("test accuracy")
    axis.set_title(f"Accuracy vs latency (★ champion: {summary['champion'] or 'none'})")
    axis.legend(fontsize=8)
    return save_figure(fig, path)


def _accuracy_floor(summary: dict[str, Any]) -> float | None:
    """The baseline's accuracy less the accuracy budget, if both are known."""
    baseline, points = summary.get("baseline_accuracy"), summary.get("accuracy_budget_points")
    return None if baseline is None or points is None else baseline - points / 100.0


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
    """Every search's trials: validation accuracy against p50, the target and the choice.

    With the searches' combined front (`combined_front`) drawn through them.
    """
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
            chosen = " (chosen)" if is_chosen(search, trial) else ""
            axis.annotate(f"{params_label(trial['params'])}{chosen}",
                          (trial["p50_ms"], trial["val_accuracy"]),
                          fontsize=7, xytext=(3, 3), textcoords="offset points")
        if search.get("target_val_accuracy") is not None:
            axis.axhline(search["target_val_accuracy"], linestyle="--", linewidth=0.8,
                         color=points.get_facecolor()[0])
    front = sorted(combined_front(searches), key=lambda point: point["p50_ms"])
    if len(front) > 1:
        axis.plot([p["p50_ms"] for p in front], [p["val_accuracy"] for p in front],
                  color="black", linewidth=0.8, drawstyle="steps-post",
                  label="the searches' combined front")
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
        "report.md": report_markdown(summary, rows),
    }
    paths = []
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths + _plots(summary, results, out_dir)
