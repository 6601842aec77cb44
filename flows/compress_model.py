"""Subflow: prune, distill and quantization-aware train the baseline, then convert each result.

The techniques are submitted to the subflow's task runner, chosen by `ScaleConfig`: one at a
time in this process (sequential), or at once on Dask worker processes (a local cluster or a
running scheduler). Benchmarks are not run here; the main flow serializes them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.common import error_of, failed_variant, final_state, tflite_conversions
from tasks.distill_model import distill_model
from tasks.export_savedmodel import export_savedmodel
from tasks.prune_model import prune_model, pruned_name
from tasks.quantize_aware_train import quantize_aware_train
from tfopt.artifacts import DatasetArtifact, ModelArtifact, Precision, VariantSpec
from tfopt.config import PipelineConfig, ScaleConfig


def task_runner_for(scale: ScaleConfig) -> TaskRunner:
    """The task runner `scale` asks for.

    Dask workers are processes with one thread each, so two TensorFlow trainings do not share
    one interpreter's global Keras state.
    """
    if scale.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if scale.dask_address:
            return DaskTaskRunner(address=scale.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": scale.dask_workers,
                                              "threads_per_worker": 1, "processes": True})
    return ThreadPoolTaskRunner(max_workers=1)


def planned_variants(config: PipelineConfig) -> list[tuple[str, list[VariantSpec]]]:
    """Each enabled technique's source name and the variants it will yield (not built yet)."""
    cfg = config.compress
    tflite = [("tflite", p) for p in cfg.tflite]
    plan: list[tuple[str, list[tuple[str, Precision]]]] = []
    if cfg.prune:
        plan.append((pruned_name(cfg), [("graph", "fp32"), *tflite]))
    if cfg.distill:
        plan.append(("distilled-small", [("graph", "fp32"), *tflite]))
    if cfg.qat:
        plan.append(("qat", [("tflite", "int8")]))
    return [
        (source, [VariantSpec(name=f"{source}-{fmt}" + (f"-{p}" if fmt == "tflite" else ""),
                              source=source, format=fmt, precision=p, path=None)
                  for fmt, p in forms])
        for source, forms in plan
    ]


def all_failed(config: PipelineConfig, error: str) -> list[VariantSpec]:
    """Every planned compressed variant, marked failed with `error`."""
    return [failed_variant(spec, error) for _, specs in planned_variants(config) for spec in specs]


@flow(name="compress_model", flow_run_name="compress-{config.name}", log_prints=True)
def compress_model(
    config: PipelineConfig,
    dataset: DatasetArtifact,
    baseline: ModelArtifact,
    batch_size: int,
    run_dir: Path,
) -> tuple[list[VariantSpec], list[ModelArtifact]]:
    """Run every enabled compression technique on the baseline and convert what it produces.

    A technique that fails marks its planned variants failed; the others go on.

    Args:
        config: The pipeline configuration (compress, train, convert and scale sections).
        dataset: The sharded data set.
        baseline: The trained baseline (never modified).
        batch_size: Fine-tuning batch size.
        run_dir: The run's folder (models/ and variants/ go under it).

    Returns:
        The variants to benchmark, and the compressed models (for their technique metrics).
    """
    cfg, seed = config.compress, config.train.seed
    models_dir, variants_dir = run_dir / "models", run_dir / "variants"
    submit = {
        pruned_name(cfg): lambda: prune_model.submit(baseline, dataset, cfg, batch_size, seed,
                                                     models_dir),
        "distilled-small": lambda: distill_model.submit(
            baseline, dataset, cfg, config.train.learning_rate, batch_size, seed, models_dir),
        "qat": lambda: quantize_aware_train.submit(baseline, dataset, cfg, batch_size, seed,
                                                   models_dir),
    }
    plan = planned_variants(config)
    futures = [submit[source]() for source, _ in plan]
    variants: list[VariantSpec] = []
    models: list[ModelArtifact] = []
    for (source, specs), future in zip(plan, futures, strict=True):
        state = final_state(future)
        if not state.is_completed():
            error = f"{source} failed: {error_of(state)}"
            variants += [failed_variant(spec, error) for spec in specs]
            continue
        model = state.result()
        models.append(model)
        savedmodel = (model if model.format == "savedmodel"
                      else export_savedmodel.submit(model, models_dir).result())
        variants += [spec.model_copy(update={"path": model.path})
                     for spec in specs if spec.format == "graph"]
        precisions = [spec.precision for spec in specs if spec.format == "tflite"]
        variants += tflite_conversions(model, savedmodel, precisions, dataset, config.convert,
                                       variants_dir, submit=True)
    return variants, models
