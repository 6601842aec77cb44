"""The main pipeline: image folder -> TFRecords -> training -> variants -> benchmarks -> summary."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.common import (
    benchmark_serialized,
    built_or_failed,
    error_of,
    sharded_data,
    tflite_conversions,
)
from flows.compress_model import all_failed, compress_model, task_runner_for
from tasks.bundle_tensorrt import bundle_tensorrt, tftrt_unavailable_reason
from tasks.export_onnx import export_onnx
from tasks.export_savedmodel import export_savedmodel
from tasks.measure_data_layout import measure_data_layout
from tasks.measure_input_pipeline import measure_input_pipeline
from tasks.pick_champion import pick_champion
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tasks.sweep_batch_size import sweep_batch_size
from tasks.train_model import train_model
from tasks.write_report import write_report
from tfopt import tracking
from tfopt.artifacts import (
    BatchSweepResult,
    BenchmarkInputs,
    DatasetArtifact,
    ModelArtifact,
    VariantResult,
    VariantSpec,
)
from tfopt.config import BenchmarkConfig, PipelineConfig, check_paths
from tfopt.fileio import atomic_write_json
from tfopt.orchestration import StepProgress
from tfopt.prefect_artifacts import publish_prefect_artifacts
from tfopt.provenance import environment, git_commit, mlflow_tracking_uri
from tfopt.summary import build_summary


@dataclass(frozen=True)
class _RunContext:
    mlflow: tracking.MlflowClient
    tracking_uri: str
    experiment_id: str
    parent_id: str
    flow_run_id: str
    tags: dict[str, str]


def _checkpoint_dir(
    config: PipelineConfig, dataset: DatasetArtifact, work_dir: Path, batch_size: int
) -> Path:
    """A training folder named after the data and the training settings, not after the run.

    A rerun after a crash therefore finds the last epoch's backup.
    """
    key = json.dumps([dataset.manifest_path.read_text(), config.model.model_dump(mode="json"),
                      config.train.model_dump(mode="json"), batch_size], sort_keys=True)
    return work_dir / "checkpoints" / f"baseline-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _sweep_points(sweep: BatchSweepResult) -> list[Metric]:
    """The sweep as metric series with the batch size as step (MLflow plots them as curves)."""
    now = int(time.time() * 1000)
    return [
        Metric(name, value, now, point.batch_size)
        for point in sweep.points
        for name, value in (("sweep_examples_per_s", point.examples_per_s),
                            ("sweep_step_ms", point.step_ms),
                            ("sweep_peak_extra_mb", point.peak_extra_mb))
    ]


def _unmeasured(spec: VariantSpec, status: str, error: str | None) -> VariantResult:
    return VariantResult(
        name=spec.name, source=spec.source, format=spec.format, precision=spec.precision,
        status=status, error=error,
    )


def _benchmark_isolated(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> VariantResult:
    """Benchmark a built variant; a variant that failed or was skipped earlier keeps its status."""
    if spec.status != "ok":
        return _unmeasured(spec, spec.status, spec.error)
    state = benchmark_serialized(spec, inputs, cfg)
    return state.result() if state.is_completed() else _unmeasured(spec, "failed", error_of(state))


def _baseline_variants(
    config: PipelineConfig,
    dataset: DatasetArtifact,
    keras_model: ModelArtifact,
    savedmodel: ModelArtifact,
    run_dir: Path,
    context: _RunContext,
) -> list[VariantSpec]:
    """Every form of the baseline: graph, SavedModel, XLA, TFLite, ONNX, TF-TRT."""
    source = keras_model.name
    variants_dir = run_dir / "variants"
    variants = [
        VariantSpec(name=f"{source}-graph", source=source, format="graph", precision="fp32",
                    path=keras_model.path),
        VariantSpec(name=f"{source}-savedmodel", source=source, format="savedmodel",
                    precision="fp32", path=savedmodel.path),
    ]
    for mode in config.convert.xla:
        name = f"{source}-xla" if mode == "jit_compile" else f"{source}-xla-{mode}"
        params: dict[str, str | int | float | bool] = {"xla_mode": mode}
        if config.convert.dump_hlo and mode == "jit_compile":
            variants_dir.mkdir(parents=True, exist_ok=True)
            params["hlo_path"] = str(variants_dir / f"{name}.hlo.txt")
        variants.append(VariantSpec(name=name, source=source, format="xla", precision="fp32",
                                    path=keras_model.path, params=params))
    variants += tflite_conversions(keras_model, savedmodel, config.convert.tflite, dataset,
                                   config.convert, variants_dir)
    if config.convert.onnx:
        planned = VariantSpec(name=f"{source}-onnx", source=source, format="onnx",
                              precision="fp32", path=None)
        onnx = built_or_failed(
            export_onnx(savedmodel, dataset, config.convert, variants_dir, return_state=True),
            planned,
        )
        variants.append(onnx)
        if onnx.status == "ok":
            bundled = bundle_tensorrt(savedmodel, onnx, config.convert.tensorrt_max_batch,
                                      run_dir / "export", return_state=True)
            if bundled.is_completed():
                bundle = bundled.result()
                tracking.log_artifact(context.mlflow, context.parent_id, bundle,
                                      f"export/{bundle.name}")
            else:
                get_run_logger().warning("TensorRT bundle failed: %s", error_of(bundled))
    variants.append(VariantSpec(
        name=f"{source}-tftrt-fp32", source=source, format="savedmodel", precision="fp32",
        path=None, status="skipped",
        error=tftrt_unavailable_reason()
        or "TF-TRT conversion is not built into tfopt; use the ONNX TensorRT bundle",
    ))
    return variants


@flow(
    name="optimize_model",
    flow_run_name="{config.name}-{config.model.architecture}",
    log_prints=True,
)
def optimize_model(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Turn a folder of labelled images into a trained model and benchmarked, optimized variants.

    Every step is a Prefect task; every result is logged to MLflow under one parent run with a
    child run per variant. A variant that fails to build or to benchmark is recorded as failed
    and the others go on.

    Args:
        config: All parameters of the run (data, model, training, conversions, benchmark).

    Returns:
        The run summary (the JSON contract in DESIGN.md).
    """
    logger = get_run_logger()
    check_paths(config)
    work_dir = config.work_dir.resolve()
    tracking_uri = mlflow_tracking_uri()
    mlflow = tracking.client(tracking_uri)
    experiment_id = tracking.ensure_experiment(mlflow, config.experiment)
    flow_run_id = str(flow_run.id)
    run_tags = {"prefect.flow_run_id": flow_run_id, "tfopt.config": config.name}
    parent_id = tracking.start_run(
        mlflow, experiment_id, run_name=f"{config.name}-{flow_run.name}",
        params=config.model_dump(mode="json"),
        tags={**run_tags, "mlflow.source.git.commit": git_commit(), "tfopt.role": "pipeline"},
    )
    logger.info("MLflow run: %s", tracking.run_url(tracking_uri, experiment_id, parent_id))
    run_dir = work_dir / "runs" / f"{config.name}-{parent_id[:12]}"
    context = _RunContext(mlflow, tracking_uri, experiment_id, parent_id, flow_run_id, run_tags)
    try:
        summary = _run_steps(config, work_dir, run_dir, context)
    except BaseException:
        tracking.end_run(mlflow, parent_id, "FAILED")
        raise
    summary_path = run_dir / "summary.json"
    atomic_write_json(summary_path, summary)
    tracking.log_artifact(mlflow, parent_id, summary_path, "report")
    tracking.end_run(mlflow, parent_id, "FINISHED")
    failed = sum(1 for v in summary["variants"] if v["status"] == "failed")
    logger.info(
        "%d variants benchmarked, %d failed; champion: %s", len(summary["variants"]), failed,
        summary["champion"] or "none",
    )
    return summary


def _run_steps(
    config: PipelineConfig,
    work_dir: Path,
    run_dir: Path,
    context: _RunContext,
) -> dict[str, Any]:
    mlflow, parent_id = context.mlflow, context.parent_id
    dataset = sharded_data(config.data, work_dir)
    tracking.log_metrics(mlflow, parent_id, {
        **{f"dataset_{split}_examples": info.examples for split, info in dataset.splits.items()},
        "dataset_shards": dataset.shards,
        "dataset_skipped_records": dataset.skipped_records,
    })
    tracking.log_artifact(mlflow, parent_id, dataset.manifest_path, "dataset")

    sweep = sweep_batch_size(dataset, config.model, config.input, run_dir / "report")
    tracking.log_metric_points(mlflow, parent_id, _sweep_points(sweep))
    tracking.log_artifact(mlflow, parent_id, sweep.plot_path, "report")
    batch_size = config.train.batch_size or sweep.chosen_batch_size
    tracking.log_params(mlflow, parent_id, {
        "batch_sweep.rule": sweep.rule, "training_batch_size": batch_size,
    })

    pipeline = measure_input_pipeline(dataset, sweep.chosen_batch_size, config.input)
    tracking.log_metrics(mlflow, parent_id, {
        "input_naive_examples_per_s": pipeline.naive_examples_per_s,
        "input_tuned_examples_per_s": pipeline.tuned_examples_per_s,
        "input_cached_examples_per_s": pipeline.cached_examples_per_s,
        "input_tuned_speedup": pipeline.tuned_examples_per_s / pipeline.naive_examples_per_s,
        "chosen_batch_size": pipeline.chosen_batch_size,
    })
    tracking.log_params(mlflow, parent_id, {
        "input.cache_decision": f"{pipeline.cache_mode}: {pipeline.cache_reason}",
    })
    layout = None
    if config.input.measure_layouts:
        layout = measure_data_layout(dataset, config.model, batch_size, config.input.sweep_steps)
        tracking.log_metrics(mlflow, parent_id, {
            "layout_nhwc_examples_per_s": layout.nhwc_examples_per_s,
            **({"layout_nchw_examples_per_s": layout.nchw_examples_per_s}
               if layout.nchw_examples_per_s else {}),
        })
        tracking.log_params(mlflow, parent_id, {
            "layout.faster": layout.faster, "layout.device": layout.device,
            "layout.note": layout.note,
        })

    models_dir = run_dir / "models"
    baseline = train_model(
        dataset, config.model, config.train, batch_size, models_dir, config.input,
        checkpoint_dir=_checkpoint_dir(config, dataset, work_dir, batch_size),
    )
    tracking.log_metric_history(mlflow, parent_id, {
        f"train_{name}": values for name, values in baseline.history.items()
    })
    tracking.log_metrics(mlflow, parent_id, baseline.metrics)
    tracking.log_params(mlflow, parent_id, {"baseline": baseline.params})
    savedmodel = export_savedmodel(baseline, models_dir)
    tracking.log_artifact(mlflow, parent_id, savedmodel.path, "models/baseline-savedmodel")
    reference = VariantSpec(name=f"{savedmodel.name}-savedmodel", source=savedmodel.name,
                            format="savedmodel", precision="fp32", path=savedmodel.path)
    inputs = prepare_benchmark_inputs(reference, dataset, run_dir / "benchmark-inputs",
                                      batch_size)

    variants = _baseline_variants(config, dataset, baseline, savedmodel, run_dir, context)
    compressing = compress_model.with_options(task_runner=task_runner_for(config.scale))(
        config, dataset, baseline, batch_size, run_dir, return_state=True)
    if compressing.is_completed():
        compressed, technique_models = compressing.result()
    else:
        get_run_logger().warning("compress_model failed: %s", error_of(compressing))
        compressed = all_failed(config, f"compress_model failed: {error_of(compressing)}")
        technique_models = []
    variants += compressed
    for model in technique_models:
        tracking.log_metrics(mlflow, parent_id,
                             {f"{model.name}.{k}": v for k, v in model.metrics.items()})
        tracking.log_metric_history(mlflow, parent_id, {
            f"{model.name}.train_{k}": v for k, v in model.history.items()
        })
    progress = StepProgress("benchmark-variants", "variants benchmarked")
    results = []
    for spec in variants:
        results.append(_benchmark_isolated(spec, inputs, config.benchmark))
        progress.update(len(results), len(variants))
    sources = {model.name: model for model in [baseline, *technique_models]}
    run_ids = {}
    for result in results:
        source = sources.get(result.source)
        run_ids[result.name] = tracking.log_variant_run(
            mlflow, context.experiment_id, parent_id, result, tags=context.tags,
            source_params=source.params if source else None,
            source_metrics=source.metrics if source else None,
        )
    choice = pick_champion(results, config.benchmark.accuracy_budget_points,
                           config.benchmark.objective)
    champion_model = None
    if choice.name:
        tracking.set_tags(mlflow, parent_id, {"tfopt.champion": choice.name})
        if config.benchmark.register_champion:
            model_name = f"tfopt-{config.name}"
            version = tracking.register_champion(mlflow, model_name, run_ids[choice.name])
            champion_model = {"name": model_name, "version": version, "alias": "champion",
                              "uri": f"models:/{model_name}@champion"}
    summary = build_summary(
        tracking_uri=context.tracking_uri,
        experiment_id=context.experiment_id,
        run_id=parent_id,
        flow_run_id=context.flow_run_id,
        dataset=dataset,
        input_pipeline=pipeline,
        results=results,
        champion=choice.name,
        champion_reason=choice.reason,
        baseline_accuracy=choice.baseline_accuracy,
        budget_points=config.benchmark.accuracy_budget_points,
        techniques={model.name: {"params": model.params, "metrics": model.metrics}
                    for model in technique_models},
        extras={
            "config_name": config.name,
            "mlflow_run_url": tracking.run_url(context.tracking_uri, context.experiment_id,
                                               parent_id),
            "environment": environment(config.benchmark.threads),
            "champion_model": champion_model,
            "batch_size_sweep": sweep.model_dump(mode="json"),
            "training_batch_size": batch_size,
            "data_layout": layout.model_dump(mode="json") if layout else None,
            "input_cache": {"mode": pipeline.cache_mode, "reason": pipeline.cache_reason},
        },
    )
    report_files = write_report(summary, results, run_dir / "report")
    for path in report_files:
        tracking.log_artifact(mlflow, parent_id, path, "report")
    publish_prefect_artifacts(summary)
    return summary
