"""Subflow: prune, distill and quantization-aware train the baseline, then convert each result.

The techniques are submitted to the subflow's task runner, chosen by `ScaleConfig`: one at a
time in this process (sequential), or at once on Dask worker processes (a local cluster or a
running scheduler). Benchmarks are not run here; the main flow serializes them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.common import error_of, final_state, tflite_conversions
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


def _planned_names(source: str, forms: list[tuple[str, Precision]]) -> list[tuple[str, str,
                                                                                 Precision]]:
    return [(f"{source}-{fmt}" + (f"-{p}" if fmt == "tflite" else ""), fmt, p) for fmt, p in forms]


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
    tflite_forms: list[tuple[str, Precision]] = [("tflite", p) for p in cfg.tflite]
    planned = []
    if cfg.prune:
        planned.append((pruned_name(cfg), [("graph", "fp32"), *tflite_forms],
                        prune_model.submit(baseline, dataset, cfg, batch_size, seed, models_dir)))
    if cfg.distill:
        planned.append(("distilled-small", [("graph", "fp32"), *tflite_forms],
                        distill_model.submit(baseline, dataset, cfg, config.train.learning_rate,
                                             batch_size, seed, models_dir)))
    if cfg.qat:
        planned.append(("qat", [("tflite", "int8")],
                        quantize_aware_train.submit(baseline, dataset, cfg, batch_size, seed,
                                                    models_dir)))
    variants: list[VariantSpec] = []
    models: list[ModelArtifact] = []
    for source, forms, future in planned:
        state = final_state(future)
        if not state.is_completed():
            error = f"{source} failed: {error_of(state)}"
            variants += [VariantSpec(name=name, source=source, format=fmt, precision=p,
                                     path=None, status="failed", error=error)
                         for name, fmt, p in _planned_names(source, forms)]
            continue
        model = state.result()
        models.append(model)
        savedmodel = (model if model.format == "savedmodel"
                      else export_savedmodel.submit(model, models_dir).result())
        if ("graph", "fp32") in forms:
            variants.append(VariantSpec(name=f"{source}-graph", source=source, format="graph",
                                        precision="fp32", path=model.path))
        precisions = [p for fmt, p in forms if fmt == "tflite"]
        variants += tflite_conversions(model, savedmodel, precisions, dataset, config.convert,
                                       variants_dir, submit=True)
    return variants, models
