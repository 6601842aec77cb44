"""The run summary: the JSON contract other tools rely on, and its table for people."""

from __future__ import annotations

from typing import Any

from tfopt.artifacts import (
    DatasetArtifact,
    InputPipelineResult,
    ModelArtifact,
    Runoff,
    VariantResult,
)
from tfopt.cpu_features import SERVE_WITHOUT_AMX
from tfopt.eval.metrics import MetricBudget, counted
from tfopt.models.health import baseline_health
from tfopt.report.diagnosis import diagnose
from tfopt.runtimes import runtime_of
from tfopt.services import redact

_LATENCY_KEYS = ("p50", "p90", "p99", "mean", "std", "min", "max", "p95", "trimmed_mean", "cv",
                 "stable", "p50_ci95")


def dataset_entry(dataset: DatasetArtifact) -> dict[str, Any]:
    """The summary's ``dataset`` block: examples per split, shards, skipped records.

    ``select_examples`` is the selection split carved from training (0: none; the trainings
    then chose on validation).
    """
    return {
        "train_examples": dataset.splits["train"].examples,
        "val_examples": dataset.splits["val"].examples,
        "test_examples": dataset.splits["test"].examples,
        "select_examples": dataset.examples("select"),
        "shards": dataset.shards,
        "skipped_records": dataset.skipped_records,
        "classes": dataset.num_classes,
        "manifest": str(dataset.manifest_path),
    }


def dataset_digest(dataset: DatasetArtifact) -> str:
    """A short digest of the data set's manifest: equal digests, equal shards and splits."""
    import hashlib

    return hashlib.sha256(dataset.manifest_path.read_bytes()).hexdigest()[:16]


def variant_entry(
    result: VariantResult,
    baseline_accuracy: float | None,
    budget: MetricBudget,
    notes: list[str] | None = None,
    tied_with: list[str] | None = None,
    gflops: float | None = None,
    runoff: Runoff | None = None,
    test_images: int = 0,
) -> dict[str, Any]:
    """One element of the summary's ``variants`` list.

    Its test accuracy comes with its 95% interval over the `test_images` it was measured on.
    `gflops` stands in for a variant whose own file could not be counted (a SavedModel
    signature): the FLOPs of another variant of the same network. A contender of the `runoff`
    gets its run-off p50 and interval.
    """
    in_runoff = runoff is not None and result.name in runoff.round_p50_ms
    gflops = result.gflops_per_inference if result.gflops_per_inference is not None else gflops
    achieved = None
    if gflops is not None and result.latency_ms is not None and result.latency_ms.p50 > 0:
        achieved = gflops / (result.latency_ms.p50 / 1000.0)
    latency = (
        result.latency_ms.model_dump() if result.latency_ms
        else dict.fromkeys(_LATENCY_KEYS)
    )
    difference = None
    if result.status == "ok" and None not in (baseline_accuracy, result.accuracy):
        difference = result.accuracy - baseline_accuracy
    share = budget.metric.unit == "share"
    return {
        "name": result.name,
        "source": result.source,
        "derived_from": result.derived_from,
        "format": result.format,
        "runtime": runtime_of(result.format).name,
        "precision": result.precision,
        "status": result.status,
        "error": result.error,
        "size_bytes": result.size_bytes,
        "gzip_bytes": result.gzip_bytes,
        "accuracy": result.accuracy,
        "metric": result.metric,
        "accuracy_ci95": _interval(result.accuracy, test_images) if counted(result.metric)
        else None,
        "val_accuracy": result.val_accuracy,
        "accuracy_delta_points": (None if difference is None or not share
                                  else 100.0 * difference),
        "metric_delta": difference,
        "latency_ms": latency,
        "throughput_per_s": result.throughput_per_s,
        "timed_runs": result.timed_runs,
        "first_inference_ms": result.first_inference_ms,
        "peak_rss_mb": result.peak_rss_mb,
        "top1_agreement": result.top1_agreement,
        "max_abs_diff": result.max_abs_diff,
        "flags": variant_flags(result.accuracy if difference is not None else None,
                               baseline_accuracy, budget),
        "notes": notes or [],
        "batch_throughput_per_s": result.batch_throughput_per_s,
        "batch_size": result.batch_size,
        "load_seconds": result.load_seconds,
        "tied_with": tied_with or [],
        "background_cores_before": result.background_cores_before,
        "background_cores": result.background_cores,
        "under_load": result.under_load,
        "load_retried": result.load_retried,
        "harness_floor_ms": result.harness_floor_ms,
        "gflops_per_inference": gflops,
        "achieved_gflops_per_s": achieved,
        "offline_examples_per_s": result.offline_examples_per_s,
        "offline_batch_size": result.offline_batch_size,
        "server_qps_within_budget": result.server_qps_within_budget,
        "server_p99_ms": result.server_p99_ms,
        "server_reason": result.server_reason,
        "op_profile": result.op_profile.model_dump() if result.op_profile else None,
        "runoff_p50_ms": runoff.p50(result.name) if in_runoff else None,
        "runoff_p50_ci95": list(runoff.interval(result.name)) if in_runoff else None,
        "runoff_threads": runoff.threads.get(result.name) if in_runoff else None,
        "p50_ms_by_threads": {str(threads): p50
                              for threads, p50 in sorted(result.p50_ms_by_threads.items())},
        "latency_ms_by_api": {api: stats.model_dump()
                              for api, stats in result.latency_ms_by_api.items()},
        "runner": dict(result.runner_params),
    }


def _interval(accuracy: float | None, images: int) -> list[float] | None:
    from tfopt.measurement.accuracy_stats import wilson_interval

    interval = None if accuracy is None else wilson_interval(accuracy, images)
    return None if interval is None else [round(value, 4) for value in interval]


def variant_flags(value: float | None, baseline: float | None,
                  budget: MetricBudget) -> list[str]:
    """Warnings a reader should not miss, e.g. a metric given up beyond the budget."""
    if value is None or baseline is None or budget.within(value, baseline):
        return []
    metric = budget.metric
    if budget.points() is not None:
        return [f"{metric.name} drop {100 * (baseline - value):.2f} points exceeds the "
                f"{budget.points():g} budget"]
    if budget.bound:
        return [f"{metric.name} {metric.shown(value)} misses the budget ({budget.described()})"]
    return [f"{metric.name} {metric.shown(value)} is beyond the budget ({budget.described()}) "
            f"of the baseline's {metric.shown(baseline)}"]


def or_dash(value: float | None, pattern: str) -> str:
    """`value` formatted with `pattern`, or ``-`` where there is none (a table cell)."""
    return "-" if value is None else format(value, pattern)


def baseline_training(baseline: ModelArtifact) -> dict[str, Any]:
    """How the baseline's training ended (summary ``baseline_training``), and its health.

    ``converged`` is true only when the training reached its plateau and the baseline is
    healthy (`tfopt.models.health.baseline_health`): a broken baseline is never converged.
    """
    health = baseline_health(baseline)
    params = baseline.params
    if "stop_reason" not in params:
        return {"epochs_run": 0, "best_epoch": None, "converged": False,
                "stop_reason": "not trained here: the model is taken as it is",
                "health": health}
    best = params.get("kept_epoch")
    return {"epochs_run": params["epochs_run"], "best_epoch": best if best != "last" else None,
            "converged": bool(params["converged"]) and health["status"] != "unhealthy",
            "stopped_by": params.get("stopped_by"), "stop_reason": params["stop_reason"],
            "health": health}


def build_summary(
    *,
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    flow_run_id: str,
    dataset: DatasetArtifact,
    input_pipeline: InputPipelineResult | None,
    results: list[VariantResult],
    champion: str | None,
    champion_reason: str,
    baseline_accuracy: float | None,
    budget: MetricBudget,
    tied: list[str] | None = None,
    techniques: dict[str, Any] | None = None,
    extras: dict[str, Any] | None = None,
    runoff: Runoff | None = None,
) -> dict[str, Any]:
    """Assemble the summary JSON (DESIGN.md's contract; keys are only ever added).

    `input_pipeline` is None for array data (nothing decoded, nothing trained). `tied` names the
    variants tied with the champion; each of them, and the champion, lists the
    others of that group in its ``tied_with``. `runoff` holds the contenders' side-by-side
    timings, if a run-off took place.
    """
    notes = diagnose(results)
    group = [champion, *(tied or [])] if champion else []
    network_gflops = {r.source: r.gflops_per_inference for r in results
                      if r.gflops_per_inference is not None}
    return {
        "mlflow_tracking_uri": redact(tracking_uri),
        "mlflow_experiment_id": experiment_id,
        "mlflow_run_id": run_id,
        "prefect_flow_run_id": flow_run_id,
        "dataset": dataset_entry(dataset),
        "dataset_digest": dataset_digest(dataset),
        "input_pipeline": None if input_pipeline is None else {
            "naive_examples_per_s": input_pipeline.naive_examples_per_s,
            "tuned_examples_per_s": input_pipeline.tuned_examples_per_s,
            "cached_examples_per_s": input_pipeline.cached_examples_per_s,
            "chosen_batch_size": input_pipeline.chosen_batch_size,
            "tuned_uncached_examples_per_s": input_pipeline.tuned_uncached_examples_per_s,
            "decode_ceiling_examples_per_s": input_pipeline.decode_ceiling_examples_per_s,
            "passes": input_pipeline.passes,
            "cache": input_pipeline.cache_mode,
        },
        "variants": [
            variant_entry(result, baseline_accuracy, budget, notes.get(result.name),
                          [name for name in group if name != result.name]
                          if result.name in group else [], network_gflops.get(result.source),
                          runoff, dataset.splits["test"].examples)
            for result in results
        ],
        "runoff": runoff.model_dump() if runoff else None,
        "baseline_accuracy": baseline_accuracy,
        "metric_budget": {"metric": budget.metric.name, "amount": budget.amount,
                          "relative": budget.relative, "bound": budget.bound,
                          "described": budget.described(),
                          "higher_is_better": budget.metric.higher_is_better,
                          "unit": budget.metric.unit},
        "techniques": techniques or {},
        **(extras or {}),
        "champion": champion or "",
        "champion_reason": champion_reason,
    }


def benchmark_summary(
    *,
    config_name: str,
    model: str,
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    flow_run_id: str,
    environment: dict[str, Any],
    result: VariantResult,
    budget: MetricBudget,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of one model benchmarked alone (``tfopt benchmark``), the pipeline's keys.

    `extras` adds what the kind of benchmark knows: the run's address, or the machine and the
    pipeline run it measured for.
    """
    return {
        "config_name": config_name,
        "model": model,
        "mlflow_tracking_uri": redact(tracking_uri),
        "mlflow_experiment_id": experiment_id,
        "mlflow_run_id": run_id,
        "prefect_flow_run_id": flow_run_id,
        "environment": environment,
        "variants": [variant_entry(result, None, budget)],
        **(extras or {}),
    }



def metric_name(summary: dict[str, Any]) -> str:
    """What the variants' ``accuracy`` holds (``accuracy`` unless ``eval.metric`` named another)."""
    return next((entry.get("metric") for entry in summary.get("variants", [])
                 if entry.get("status") == "ok" and entry.get("metric")), None) or "accuracy"


def in_points(summary: dict[str, Any]) -> bool:
    """Whether the run's metric is a share whose differences read as points (accuracy)."""
    return (summary.get("metric_budget") or {}).get("unit", "share") == "share"


def delta_header(summary: dict[str, Any]) -> str:
    """The column of each variant's difference to the baseline: ``Δ pts``, or ``Δ <metric>``.

    Against a bound (an SNR's floor: the baseline's own figure is the metric's cap), each
    variant's margin over it: ``over 30`` (``under 0.03`` for a lower-is-better metric).
    """
    bound = _bound(summary)
    if bound is not None:
        higher = summary["metric_budget"]["higher_is_better"]
        return f"{'over' if higher else 'under'} {bound:g}"
    return "Δ pts" if in_points(summary) else f"Δ {metric_name(summary)}"


def delta_cell(entry: dict[str, Any], summary: dict[str, Any]) -> str:
    """A variant's difference to the baseline (`delta_header`).

    In points for a share, else in the metric's units; against a bound, the margin over it
    (negative: the variant misses it).
    """
    bound = _bound(summary)
    if bound is not None:
        value = entry.get("accuracy")
        higher = summary["metric_budget"]["higher_is_better"]
        return or_dash(None if value is None else (value - bound if higher else bound - value),
                       "+.4g")
    if in_points(summary):
        return or_dash(entry.get("accuracy_delta_points"), "+.2f")
    return or_dash(entry.get("metric_delta"), "+.4f")


def _bound(summary: dict[str, Any]) -> float | None:
    """The worst figure a variant keeps, where the budget is one (`MetricBudget.bound`)."""
    budget = summary.get("metric_budget") or {}
    return budget["amount"] if budget.get("bound") else None


def speedup_sentence(speedup: dict[str, Any] | None) -> str:
    """The champion's speed-up over its reference in one sentence (empty without one)."""
    if not speedup or speedup.get("ratio") is None:
        return ""
    how = ("side by side in the run-off" if speedup["side_by_side"]
           else "each on its own turn, not side by side")
    return (f"{speedup['ratio']:.2f}x the speed of {speedup['reference']} (batch-1 p50 "
            f"{speedup['champion_p50_ms']:.4f} vs {speedup['reference_p50_ms']:.4f} ms"
            f"{threads_clause(speedup)}, {how}{load_clause(speedup)}).")


def peers_sentence(speedup: dict[str, Any] | None, champion: str | None) -> str:
    """The champion against the peers (`champion_speedup_over_peers`) in one sentence."""
    if not speedup or speedup.get("ratio") is None:
        return ""
    peers = ", ".join(f"{name} {p50:.4f} ms" for name, p50 in
                      sorted(speedup["peers_p50_ms"].items(), key=lambda item: item[1]))
    said = f"The peers, what one converter call gives on each runtime (batch-1 p50): {peers}."
    if speedup["reference"] == champion:
        return f"{said} The champion is one of them: no compressed variant beat them."
    return f"{said} Against the fastest: {speedup_sentence(speedup)}"


def load_clause(speedup: dict[str, Any]) -> str:
    """", under load: ..." where the run-off ran twice with other work on the machine."""
    return (", under load: other processes kept cores busy during both tries, so the figure "
            "may not hold on a quiet machine" if speedup.get("under_load") else "")


def threads_clause(speedup: dict[str, Any]) -> str:
    """", at 1 vs 2 threads" where the run-off picked each file's thread count, else nothing."""
    ours, theirs = speedup.get("champion_threads"), speedup.get("reference_threads")
    return "" if ours is None or theirs is None else f", at {ours} vs {theirs} threads"


def classes_sentence(verdict: dict[str, Any] | None) -> str:
    """The classes the champion lost most against the baseline on test, in one sentence.

    Empty without a verdict or its per-class figures; said plainly when it lost none.
    """
    lost = (verdict or {}).get("classes_lost_most")
    if lost is None:
        return ""
    champion, baseline = verdict["champion"]["name"], verdict["baseline"]["name"]
    if not lost:
        return f"Per class: {champion} is no worse than {baseline} on any class of the test split."
    shown = "; ".join(f"{entry['class']} {entry['delta_points']:+.2f} points "
                      f"({entry['accuracy']:.4f} vs {entry['baseline_accuracy']:.4f}, "
                      f"{entry['images']} images)" for entry in lost)
    return (f"Classes {champion} lost most against {baseline} on test: {shown} (each variant's "
            "per-class accuracy and confusion matrix are in its MLflow run, `classes/`).")


def accuracy_sentence(verdict: dict[str, Any] | None) -> str:
    """The champion's accuracy against the baseline's in one sentence (empty without one).

    The split the budget was judged on (with the paired comparison the choice rested on, where
    the validation images' predictions were kept), the held-out test figures with their 95%
    intervals, and the paired comparison on the same test images.
    """
    if not verdict:
        return ""
    champion, baseline = verdict["champion"], verdict["baseline"]

    def tested(figures: dict[str, Any]) -> str:
        interval = figures.get("test_ci95")
        return (or_dash(figures["test_accuracy"], ".4f")
                + (f" (95% interval {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""))

    sentence = (f"Accuracy: the {verdict['budget_points']:g}-point budget was judged on the "
                f"{verdict['judged_on']} split" if verdict["budget_points"] is not None else
                f"Metric {verdict['metric']}: the budget ({verdict['budget']}) was judged on "
                f"the {verdict['judged_on']} split")
    examples = "images" if verdict["budget_points"] is not None else "examples"
    if verdict["judged_on"] == "validation":
        chosen_on = _image_by_image(verdict.get("paired_on_validation"), champion, baseline,
                                    within_brackets=True)
        sentence += (f" ({champion['name']} {or_dash(champion['val_accuracy'], '.4f')}, "
                     f"{baseline['name']} {or_dash(baseline['val_accuracy'], '.4f')}{chosen_on}"
                     f"); on {verdict['test_images']} held-out test {examples} no choice used")
    else:
        sentence += f", on its {verdict['test_images']} {examples}"
    sentence += f", {champion['name']} {tested(champion)}, {baseline['name']} {tested(baseline)}"
    sentence += _image_by_image(verdict.get("paired"), champion, baseline)
    held_out = not_held_on_test(verdict)
    return f"{sentence}." + (f" {held_out[0].upper()}{held_out[1:]}." if held_out else "")


def _image_by_image(paired: dict[str, Any] | None, champion: dict[str, Any],
                    baseline: dict[str, Any], within_brackets: bool = False) -> str:
    """The paired comparison's clause (empty without one, or when the champion is the baseline).

    `within_brackets`: McNemar's p after a comma, not in brackets of its own.
    """
    if not paired or champion["name"] == baseline["name"]:
        return ""
    p_value = f"McNemar p = {paired['mcnemar_p_value']:.2g}"
    return (f"; image by image, {paired['only_first_right']} only the champion got right, "
            f"{paired['only_second_right']} only the baseline"
            + (f", {p_value}" if within_brackets else f" ({p_value})"))


SIGNIFICANT_P = 0.05


def not_held_on_test(verdict: dict[str, Any] | None) -> str:
    """Words for a champion the held-out test puts beyond the budget, significantly; else "".

    The budget is judged on validation, and the champion is chosen there among many files (ties
    go to the more accurate), so its validation figure is its luckiest: the test split, read
    once, can disagree. Beyond the budget there and McNemar's p below `SIGNIFICANT_P`: said.
    """
    paired = (verdict or {}).get("paired")
    if not paired or verdict["judged_on"] != "validation" or verdict["budget_points"] is None:
        return ""
    champion, baseline = verdict["champion"]["test_accuracy"], verdict["baseline"]["test_accuracy"]
    if champion is None or baseline is None:
        return ""
    drop = (baseline - champion) * 100.0
    if drop <= verdict["budget_points"] or paired["mcnemar_p_value"] >= SIGNIFICANT_P:
        return ""
    return (f"on test the champion is {drop:.2f} points below the baseline, beyond the budget "
            f"(McNemar p = {paired['mcnemar_p_value']:.2g}): the choice made on validation "
            "did not hold on held-out images")


def champion_card(result: VariantResult, reason: str, budget_points: float,
                  parent_run_url: str, dataset: DatasetArtifact,
                  baseline_note: str | None = None,
                  speedup: dict[str, Any] | None = None) -> tuple[dict[str, str], str]:
    """The registered champion version's tags and description: what it is and why it won.

    `baseline_note` says the verdicts were judged against an unconverged baseline, if so;
    `speedup` how many times faster it is than what it was made from
    (`tfopt.measurement.champion.champion_speedup`). A champion measured with AMX refused to its
    process (``benchmark.amx``) is tagged so, and its description says to serve it that way.

    Returns:
        Tags (variant, runtime, precision, accuracy, p50_ms, derived_from, dataset digest,
        tfopt version, git commit) and a Markdown description (its report row, why it won, the
        accuracy budget, the parent run).
    """
    import importlib.metadata

    from tfopt.provenance import git_commit

    latency = result.latency_ms
    digest = dataset_digest(dataset)
    tags = {
        "variant": result.name, "runtime": runtime_of(result.format).name,
        "format": result.format, "precision": result.precision,
        "accuracy": or_dash(result.accuracy, ".4f"),
        "p50_ms": or_dash(latency.p50 if latency else None, ".4f"),
        "derived_from": result.derived_from or "none", "dataset_digest": digest,
        "tfopt_version": importlib.metadata.version("tfopt"), "git_commit": git_commit(),
    }
    interval = latency.p50_ci95 if latency else None
    faster = speedup_sentence(speedup)
    description = (
        f"**{result.name}** ({tags['runtime']}, {result.format}, {result.precision}): accuracy "
        f"{tags['accuracy']}, batch-1 p50 {tags['p50_ms']} ms"
        + (f" (95% interval {interval[0]:.4f}-{interval[1]:.4f})" if interval else "")
        + f", {result.size_bytes / 1024:,.1f} KB, derived from {tags['derived_from']}.\n\n"
        f"Why it won: {reason}\n\n" + (f"{faster}\n\n" if faster else "")
        + f"Accuracy budget: {budget_points:g} points below the baseline.\n\nData: manifest "
        f"digest {digest} ({dataset.num_classes} classes, {dataset.image_size} px). Pipeline run: "
        f"{redact(parent_run_url)}")
    if baseline_note:
        tags["baseline_converged"] = "false"
        description += f"\n\n**Judged against an unconverged baseline**: {baseline_note}"
    if result.runner_params.get("amx_permitted") == "false":
        tags["amx"] = "denied"
        description += ("\n\n**Measured with AMX refused to its process** (benchmark.amx): serve "
                        f"it the same way ({SERVE_WITHOUT_AMX}), or measure it again as you "
                        "serve it.")
    return tags, description
