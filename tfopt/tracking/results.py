"""One typed function per result a run logs, so one fact has one metric name in every flow.

The dataset, the batch-size sweep, the readers, the layouts, the baseline's training, each
technique's model, each variant's child run, the comparison with the last run: flows log them
here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tfopt.artifacts import (
    BatchSweepResult,
    DatasetArtifact,
    InputPipelineResult,
    LayoutResult,
    ModelArtifact,
    ModelFacts,
    VariantResult,
)
from tfopt.eval.classes import ClassResults, metric_key, read_class_results
from tfopt.tracking.client import (
    client,
    log_artifact,
    log_metric_history,
    log_metric_points,
    log_metrics,
    log_params,
    set_tags,
    with_retries,
)
from tfopt.tracking.registry import log_variant_model
from tfopt.tracking.runs import RunRef, TrackedRun, end_run, start_run

DESCRIPTION_LIMIT = 8000  # MLflow's longest tag value (MAX_TAG_VAL_LENGTH)


def variant_metrics(result: object) -> dict[str, float]:
    """Flatten a benchmarked variant's numbers into MLflow metric names.

    The figure it is judged by is named after its metric: ``accuracy`` and ``val_accuracy``, or
    ``mae`` and ``val_mae`` (``eval.metric``).
    """
    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    metric = data.get("metric") or "accuracy"
    metrics = {
        name: float(data[key])
        for key, name in (("accuracy", metric), ("val_accuracy", f"val_{metric}"))
        if data.get(key) is not None
    }
    metrics |= {
        key: float(data[key])
        for key in ("size_bytes", "gzip_bytes", "throughput_per_s",
                    "timed_runs", "load_seconds", "first_inference_ms", "peak_rss_mb",
                    "top1_agreement", "max_abs_diff", "batch_throughput_per_s",
                    "background_cores_before", "background_cores", "under_load",
                    "harness_floor_ms", "gflops_per_inference", "offline_examples_per_s",
                    "server_qps_within_budget", "server_p99_ms")
        if data.get(key) is not None
    }
    for threads, p50 in (data.get("p50_ms_by_threads") or {}).items():
        metrics[f"latency_p50_ms_{threads}_threads"] = float(p50)
    for api, stats in (data.get("latency_ms_by_api") or {}).items():
        metrics[f"latency_p50_ms_{api}"] = float(stats["p50"])
    for key, value in (data.get("latency_ms") or {}).items():
        if key == "p50_ci95":
            if value is not None:
                metrics["latency_p50_ci95_low_ms"], metrics["latency_p50_ci95_high_ms"] = value
            continue
        name = key if key in ("cv", "stable") else f"latency_{key}_ms"
        metrics[name] = float(value)
    return metrics


def log_variant_run(
    mlflow: MlflowClient,
    experiment_id: str,
    parent_run_id: str,
    result: object,
    tags: Mapping[str, str] | None = None,
    log_model_files: bool = True,
    source_params: Mapping[str, object] | None = None,
    source_metrics: Mapping[str, float] | None = None,
    mlflow_model: Path | None = None,
    run_name: str | None = None,
    classes: ClassResults | None = None,
) -> str:
    """Create a child run for one benchmarked variant with its params, metrics and model.

    Args:
        mlflow: Tracking client.
        experiment_id: Experiment of the parent run.
        parent_run_id: The pipeline's run.
        result: A `VariantResult`.
        tags: Extra tags (e.g. the Prefect flow run id).
        log_model_files: Upload the variant's model as the ``model`` artifact: its MLflow
            Model folder if given, else its model file or folder as it is.
        source_params: Parameters of the technique that made the variant's model.
        source_metrics: Metrics of that technique (e.g. sparsity reached), logged as
            ``source.<name>``.
        mlflow_model: The variant packaged as an MLflow Model folder.
        run_name: The child run's name (default: the variant's).
        classes: Its predictions class by class: each class's accuracy as
            ``class_accuracy.<class>``, the numbers (``classes/per_class.json``) and the
            confusion matrix (``classes/confusion_matrix.png``).

    Returns:
        The child run's id.
    """
    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    run_id = start_run(
        mlflow,
        experiment_id,
        run_name=run_name or data["name"],
        params={
            **{key: data[key] for key in ("name", "source", "format", "precision")},
            **{f"source.{key}": value for key, value in (source_params or {}).items()},
            **{f"runner.{key}": value for key, value in (data.get("runner_params") or {}).items()},
        },
        tags={
            **(tags or {}),
            "tfopt.variant": data["name"],
            "tfopt.status": data["status"],
            **({"tfopt.error": str(data["error"])[:5000]} if data["error"] else {}),
        },
        parent_run_id=parent_run_id,
    )
    model_id = None
    if data["status"] == "ok" and log_model_files and mlflow_model is not None and (
            mlflow_model.exists()):
        model_id = log_variant_model(mlflow, experiment_id, run_id, result, mlflow_model,
                                     source_params or {})
    if source_metrics:
        log_metrics(mlflow, run_id, {f"source.{k}": v for k, v in source_metrics.items()},
                    model_id=model_id)
    if data["status"] == "ok":
        log_metrics(mlflow, run_id, variant_metrics(result), model_id=model_id)
        path = mlflow_model or (Path(data["path"]) if data.get("path") else None)
        if log_model_files and path is not None and path.exists():
            log_artifact(mlflow, run_id, path, "model")
        for extra in data.get("extra_files") or []:
            log_artifact(mlflow, run_id, Path(extra), "extra")
        if classes is not None:
            _log_classes(mlflow, run_id, data["name"], classes, model_id)
    end_run(mlflow, run_id, "FINISHED" if data["status"] != "failed" else "FAILED")
    return run_id


def _log_classes(mlflow: MlflowClient, run_id: str, name: str, classes: ClassResults,
                 model_id: str | None) -> None:
    """A variant's per-class accuracies, their numbers and its confusion matrix.

    See `log_variant_run`.
    """
    import tempfile

    from tfopt.fileio import atomic_write_json
    from tfopt.report.files import confusion_figure

    log_metrics(mlflow, run_id, {metric_key(class_name): float(accuracy)
                                 for class_name, accuracy in zip(classes.names,
                                                                 classes.accuracies, strict=True)
                                 if not math.isnan(accuracy)}, model_id=model_id)
    with tempfile.TemporaryDirectory() as folder:
        numbers = Path(folder) / "per_class.json"
        atomic_write_json(numbers, classes.as_json())
        picture = confusion_figure(classes, f"{name}: test images by true and predicted class",
                                   Path(folder) / "confusion_matrix.png")
        for path in (numbers, picture):
            log_artifact(mlflow, run_id, path, "classes")


def log_file(run: TrackedRun, path: Path, artifact_path: str | None = None) -> None:
    """Upload a file or folder to the run's artifacts."""
    log_artifact(run.client, run.run_id, path, artifact_path)


def log_dataset(run: TrackedRun, dataset: DatasetArtifact) -> None:
    """Examples per split, shards and skipped records, the manifest, and the run's input.

    The input fills MLflow's Datasets panel: source folder, manifest digest, counts.
    """
    log_metrics(run.client, run.run_id, {
        **{f"dataset_{split}_examples": info.examples for split, info in dataset.splits.items()},
        "dataset_shards": dataset.shards,
        "dataset_skipped_records": dataset.skipped_records,
    })
    log_file(run, dataset.manifest_path, "dataset")
    digest = hashlib.sha256(dataset.manifest_path.read_bytes()).hexdigest()[:16]
    profile = {"classes": dataset.num_classes, "shards": dataset.shards,
               "skipped_records": dataset.skipped_records,
               **{f"{split}_examples": info.examples for split, info in dataset.splits.items()}}
    entity = Dataset(name=dataset.root.name, digest=digest, source_type="local",
                     source=json.dumps({"uri": str(dataset.root)}), profile=json.dumps(profile))
    inputs = [DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])]
    try:
        with_retries(lambda: run.client.log_inputs(run.run_id, datasets=inputs))
    except MlflowException as error:
        # The server looks a data set up, then inserts it: two runs logging the same data set at
        # once (PostgreSQL store) both insert, one fails. Logged again, it is found and linked.
        if "already exists" not in str(error):
            raise
        with_retries(lambda: run.client.log_inputs(run.run_id, datasets=inputs))


def describe_run(run: TrackedRun, markdown: str) -> None:
    """Set the run's description (the MLflow UI's Description box), cut to MLflow's limit.

    `tfopt.report.markdown.run_description` writes one that fits; the cut is the last resort.
    """
    note = markdown if len(markdown) <= DESCRIPTION_LIMIT else (
        markdown[: DESCRIPTION_LIMIT - 60] + "\n\n... (cut; the whole report is in report/)")
    set_tags(run.client, run.run_id, {"mlflow.note.content": note})


def log_sweep(run: TrackedRun, sweep: BatchSweepResult, training_batch_size: int) -> None:
    """The batch-size sweep as curves over the batch size, its rule, plot and the batch used."""
    now = int(time.time() * 1000)
    log_metric_points(run.client, run.run_id, (
        Metric(name, value, now, point.batch_size)
        for point in sweep.points
        for name, value in (("sweep_examples_per_s", point.examples_per_s),
                            ("sweep_step_ms", point.step_ms),
                            ("sweep_peak_extra_mb", point.peak_extra_mb))
    ))
    if sweep.plot_path:
        log_file(run, sweep.plot_path, "report")
    log_params(run.client, run.run_id, {
        "batch_sweep.rule": sweep.rule, "training_batch_size": training_batch_size,
    })


def log_input_pipeline(run: TrackedRun, pipeline: InputPipelineResult) -> None:
    """Naive, tuned and cached reader throughput, and the cache rule's decision."""
    log_metrics(run.client, run.run_id, {
        "input_naive_examples_per_s": pipeline.naive_examples_per_s,
        "input_tuned_examples_per_s": pipeline.tuned_examples_per_s,
        "input_cached_examples_per_s": pipeline.cached_examples_per_s,
        "input_tuned_speedup": pipeline.tuned_examples_per_s / pipeline.naive_examples_per_s,
        "chosen_batch_size": pipeline.chosen_batch_size,
    })
    log_params(run.client, run.run_id, {
        "input.cache_decision": f"{pipeline.cache_mode}: {pipeline.cache_reason}",
    })


def log_layout(run: TrackedRun, layout: LayoutResult) -> None:
    """NHWC and NCHW training throughput and which was faster on this device."""
    log_metrics(run.client, run.run_id, {
        "layout_nhwc_examples_per_s": layout.nhwc_examples_per_s,
        **({"layout_nchw_examples_per_s": layout.nchw_examples_per_s}
           if layout.nchw_examples_per_s else {}),
    })
    log_params(run.client, run.run_id, {
        "layout.faster": layout.faster, "layout.device": layout.device, "layout.note": layout.note,
    })


def log_training(run: TrackedRun, model: ModelArtifact) -> None:
    """The baseline's per-epoch curves (``train_<name>``), final metrics and build params."""
    log_metric_history(run.client, run.run_id, {
        f"train_{name}": values for name, values in model.history.items()
    })
    log_metrics(run.client, run.run_id, model.metrics)
    log_params(run.client, run.run_id, {model.name: model.params})


def log_continued_training(run: TrackedRun, model: ModelArtifact) -> None:
    """A baseline trained further after compression, and its new figures.

    Its params go under ``baseline_continued.*`` (those logged first cannot change), its
    accuracies as ``baseline_continued_*`` metrics.
    """
    keys = ("continued_epochs", "continued_gain", "epochs_run", "converged", "stop_reason")
    log_params(run.client, run.run_id, {"baseline_continued": {
        key: model.params[key] for key in keys if key in model.params}})
    log_metrics(run.client, run.run_id, {
        f"baseline_continued_{key}": model.metrics[key]
        for key in ("test_accuracy", "best_val_accuracy", "select_accuracy")
        if key in model.metrics})


def log_baseline_health(run: TrackedRun, health: Mapping[str, Any]) -> None:
    """The baseline's health check, its status and reasons as tags, its figures as metrics.

    Tags ``tfopt.baseline_health`` and ``tfopt.baseline_health.reasons``; metrics
    ``baseline_health_*``.
    """
    set_tags(run.client, run.run_id, {
        "tfopt.baseline_health": health["status"],
        "tfopt.baseline_health.reasons": "; ".join(health["reasons"]) or "none"})
    log_metrics(run.client, run.run_id, {
        f"baseline_health_{key}": float(health[key])
        for key in ("train_accuracy", "val_accuracy", "chance_accuracy")
        if health.get(key) is not None})


def log_amx_decision(run: TrackedRun, setting: str, reason: str,
                     denied_speedup: float | None) -> None:
    """Whether the measuring processes ran with AMX (``benchmark.amx``) and why.

    Tags ``tfopt.benchmark_amx`` and ``tfopt.benchmark_amx.reason``; with ``auto``'s timing, the
    metric ``amx_denied_speedup`` (the timed file's p50 with AMX over its p50 without).
    """
    set_tags(run.client, run.run_id, {"tfopt.benchmark_amx": setting,
                                      "tfopt.benchmark_amx.reason": reason})
    if denied_speedup is not None:
        log_metrics(run.client, run.run_id, {"amx_denied_speedup": denied_speedup})


def log_model_facts(run: TrackedRun, facts: ModelFacts) -> None:
    """What the baseline's model was found to be (``model_facts.kind``, ``.channels`` ...)."""
    log_params(run.client, run.run_id, {"model_facts": facts.params()})


def log_technique(run: TrackedRun, model: ModelArtifact) -> None:
    """A technique's metrics and curves, prefixed with the model's name (``pruned-80.``)."""
    log_metrics(run.client, run.run_id,
                {f"{model.name}.{key}": value for key, value in model.metrics.items()})
    log_metric_history(run.client, run.run_id, {
        f"{model.name}.train_{key}": values for key, values in model.history.items()
    })


def log_variants(
    run: TrackedRun,
    results: list[VariantResult],
    sources: Mapping[str, ModelArtifact],
    tags: Mapping[str, str],
    mlflow_models: Mapping[str, Path] | None = None,
    labels: Path | None = None,
    class_names: Sequence[str] = (),
) -> dict[str, str]:
    """A child run per variant, with the params and metrics of the model it was made from.

    A variant packaged in `mlflow_models` is logged as that MLflow Model, so it loads with
    ``mlflow.pyfunc.load_model("runs:/<child run>/model")``; others as their file. A variant
    whose predicted classes were kept is also judged class by class against the test `labels`
    (`class_names`).

    Returns:
        Variant name to child run id.
    """
    run_ids = {}
    for result in results:
        source = sources.get(result.source)
        run_ids[result.name] = log_variant_run(
            run.client, run.experiment_id, run.run_id, result, tags=tags,
            source_params=source.params if source else None,
            source_metrics=source.metrics if source else None,
            mlflow_model=(mlflow_models or {}).get(result.name),
            classes=read_class_results(labels, result.predictions, class_names),
        )
    return run_ids


def log_comparison(run: TrackedRun, since: dict[str, Any] | None,
                   champion: dict[str, Any] | None,
                   speedup: dict[str, Any] | None = None,
                   speedup_over_int8: dict[str, Any] | None = None,
                   speedup_over_peers: dict[str, Any] | None = None) -> None:
    """Tag the run with its regressions since the last run; log its champion's figures.

    ``tfopt.regression`` is ``true`` when a variant got slower or less accurate beyond the noise or
    started failing (``tfopt.regression.variants`` names them), else ``false``; ``champion_p50_ms``
    and ``champion_accuracy`` are what the next run's history plots; ``champion_speedup`` how many
    times faster the champion is than `speedup`'s reference (tag ``tfopt.champion.speedup_over``),
    ``champion_speedup_over_int8`` than the baseline's int8 TFLite file (`speedup_over_int8`),
    ``champion_speedup_over_peers`` than the fastest peer (`speedup_over_peers`, tag
    ``tfopt.champion.fastest_peer``); tag ``tfopt.champion.threads`` the thread count the run-off
    timed it at and its model serves with, where it picked one.
    """
    regressions = (since or {}).get("regressions") or []
    set_tags(run.client, run.run_id, {
        "tfopt.regression": "true" if regressions else "false",
        **({"tfopt.regression.variants": ", ".join(sorted({r["variant"] for r in regressions}))
            [:5000]} if regressions else {}),
    })
    if champion and champion.get("latency_ms", {}).get("p50") is not None:
        log_metrics(run.client, run.run_id, {
            "champion_p50_ms": champion["latency_ms"]["p50"],
            **({"champion_accuracy": champion["accuracy"]}
               if champion.get("accuracy") is not None else {})})
    if speedup and speedup.get("ratio") is not None:
        log_metrics(run.client, run.run_id, {"champion_speedup": speedup["ratio"]})
        how = "side by side" if speedup["side_by_side"] else "own turns"
        set_tags(run.client, run.run_id,
                 {"tfopt.champion.speedup_over": f"{speedup['reference']} ({how})"})
    if speedup_over_int8 and speedup_over_int8.get("ratio") is not None:
        log_metrics(run.client, run.run_id,
                    {"champion_speedup_over_int8": speedup_over_int8["ratio"]})
    if speedup_over_peers and speedup_over_peers.get("ratio") is not None:
        log_metrics(run.client, run.run_id,
                    {"champion_speedup_over_peers": speedup_over_peers["ratio"]})
        set_tags(run.client, run.run_id,
                 {"tfopt.champion.fastest_peer": speedup_over_peers["reference"]})
    threads = (speedup_over_int8 or speedup or {}).get("champion_threads")
    if threads is not None:
        set_tags(run.client, run.run_id, {"tfopt.champion.threads": str(threads)})


def log_native_crashes(run: TrackedRun, crashes: list[dict[str, Any]]) -> None:
    """Each contained crash as a parameter (``native.<step>``): its signal and what the retry did.

    A retried step ran without oneDNN's custom operations, which can change its speed and
    rounding: the parameter says so beside the figures.
    """
    if not crashes:
        return
    log_params(run.client, run.run_id, {
        f"native.{crash['step']}": (
            f"{crash['signal']} in {crash['what']}; "
            + (f"retried with {crash['retry']}: {'ok' if crash['recovered'] else 'failed again'}"
               if crash["retried"] else "not retried"))
        for crash in crashes})


def log_trial(parent: RunRef, name: str, trial: Mapping[str, Any], metric: Any = None) -> str:
    """A search trial as a nested run of the pipeline's run: its setting, accuracy, p50, status.

    Its figures are its fastest file's within the budget (tag ``tfopt.file``). On array data
    its scores are logged as the run's `metric` reads them (``val_mae``, ``file_val_mae``).

    Args:
        parent: The pipeline's run.
        name: The run's name (``channel_prune fraction=0.625``).
        trial: The trial as the summary lists it (`tfopt.search.Trial.summary`), with its
            technique under ``technique``.
        metric: The run's `tfopt.eval.metrics.Metric` its scores are of (None: accuracy).

    Returns:
        The trial's run id.
    """
    mlflow = client(parent.tracking_uri)
    run_id = start_run(
        mlflow, parent.experiment_id, name,
        params={"technique": trial["technique"], **trial["params"]},
        tags={"tfopt.role": "search-trial", "tfopt.technique": trial["technique"],
              "tfopt.status": trial["status"],
              **({"tfopt.file": trial["file"]} if trial.get("file") else {}),
              **({"tfopt.error": str(trial["error"])[:5000]} if trial.get("error") else {})},
        parent_run_id=parent.run_id)
    figures = {key: trial[key] for key in ("val_accuracy", "file_val_accuracy")
               if trial.get(key) is not None}
    if metric is not None:
        figures = {key.replace("accuracy", metric.name): metric.oriented(value)
                   for key, value in figures.items()}
    log_metrics(mlflow, run_id, {**figures, **{
        key: trial[key] for key in ("p50_ms", "speedup", "epochs_run", "seconds")
        if trial.get(key) is not None}})
    end_run(mlflow, run_id, "FAILED" if trial["status"] == "failed" else "FINISHED")
    return run_id
