"""Subflow: apply every enabled compression technique to the baseline, then convert each result.

The techniques come from the registry (`techniques.plan`) and are submitted to the subflow's
task runner, chosen by `ScaleConfig`: one at a time in this process (sequential), or at once on
Dask worker processes (a local cluster or a running scheduler). Benchmarks are not run here;
the main flow serializes them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.states import State
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.common import error_of, final_state, tflite_conversions
from tasks.convert_tflite import int8_kernel_stats
from tasks.export_savedmodel import export_savedmodel
from techniques import Planned, plan
from techniques.base import NotApplicable
from tfopt.artifacts import ModelArtifact, TrainingData, VariantSpec
from tfopt.config import PipelineConfig, ScaleConfig
from tfopt.orchestration import claim_flow_run, local_dask_cluster_kwargs
from tfopt.variants import built, failed, skipped


def task_runner_for(scale: ScaleConfig) -> TaskRunner:
    """The task runner `scale` asks for (a local Dask cluster: `local_dask_cluster_kwargs`)."""
    if scale.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if scale.dask_address:
            return DaskTaskRunner(address=scale.dask_address)
        return DaskTaskRunner(cluster_kwargs=local_dask_cluster_kwargs(scale.dask_workers))
    return ThreadPoolTaskRunner(max_workers=1)


@flow(name="compress_model", flow_run_name="compress-{config.name}", log_prints=True)
def compress_model(
    config: PipelineConfig, baseline: ModelArtifact, data: TrainingData, run_dir: Path
) -> tuple[list[VariantSpec], list[ModelArtifact]]:
    """Apply every enabled compression technique to the baseline and convert what it produces.

    Techniques that start from the baseline run at once (on the task runner); one that
    continues from another technique's model (`Planned.starts_from`) runs once that model is
    made. A technique that fails marks its planned variants failed (and those of the
    techniques continuing from it), one that does not apply to the model (`NotApplicable`)
    skipped with its reason; the others go on.

    Args:
        config: The pipeline configuration (compress, convert and scale sections).
        baseline: The trained baseline (never modified).
        data: The run's training data and input settings (every fine-tuning uses them).
        run_dir: The run's folder (models/ and variants/ go under it).

    Returns:
        The variants to benchmark, and the compressed models (for their technique metrics).
    """
    claim_flow_run()
    planned_all = plan(config.compress, baseline)
    plans = [p for p in planned_all if p.refusal is None]
    models_dir = run_dir / "models"
    futures = {p.technique.name: p.technique.apply.submit(baseline, p.cfg, data, models_dir)
               for p in plans if p.starts_from is None}
    variants = [spec for p in planned_all if p.refusal for spec in p.variants]
    made: dict[str, ModelArtifact] = {}
    missing = {p.technique.name: p.variants[0] for p in planned_all if p.refusal and p.variants}
    for planned in plans:
        starts_from = planned.starts_from
        if starts_from is not None and starts_from not in made:
            variants += _without_base(planned, missing.get(starts_from))
            continue
        future = (futures[planned.technique.name] if starts_from is None else
                  planned.technique.apply.submit(made[starts_from], planned.cfg, data,
                                                 models_dir))
        state = final_state(future)
        if not state.is_completed():
            not_built = _not_built(planned, state)
            missing[planned.technique.name] = not_built[0] if not_built else None
            variants += not_built
            continue
        forms = _forms_of(state.result(), planned, config, data, run_dir)
        made[planned.technique.name] = _with_int8_readback(state.result(), forms)
        variants += forms
    return variants, list(made.values())


def _with_int8_readback(model: ModelArtifact, forms: list[VariantSpec]) -> ModelArtifact:
    """`model` with its int8 TFLite file's kernel statistics (`int8_kernel_stats`) as metrics.

    Read from the very file the benchmark measures, so the sparsity and clusters a technique
    kept are checked where they must survive; a model without an int8 form, or whose file
    cannot be read (logged), is returned as is.
    """
    int8 = next((spec for spec in forms if spec.status == "ok" and spec.format == "tflite"
                 and spec.precision == "int8" and not spec.params.get("sparsity_encoding")),
                None)
    if int8 is None:
        return model
    try:
        kept = int8_kernel_stats(int8.path)
    except (OSError, ValueError, RuntimeError) as error:
        get_run_logger().warning("%s: could not read %s back: %s", model.name, int8.name, error)
        return model
    get_run_logger().info("%s: read back from %s: %s", model.name, int8.name,
                          {key: round(value, 3) for key, value in kept.items()})
    return model.model_copy(update={"metrics": {**model.metrics, **kept}})


def _without_base(planned: Planned, base: VariantSpec | None) -> list[VariantSpec]:
    """A technique whose starting model is missing: skipped or failed as that model's variants."""
    why = f"{base.status}: {base.error}" if base is not None else "not built"
    reason = (f"{planned.source} continues from the {planned.starts_from} technique's model, "
              f"which was {why}")
    mark = skipped if base is not None and base.status == "skipped" else failed
    return [mark(spec, reason) for spec in planned.variants]


def _not_built(planned: Planned, state: State) -> list[VariantSpec]:
    """The technique's variants, skipped if it does not apply to the model, else failed."""
    if isinstance(state.result(raise_on_failure=False), NotApplicable):
        reason = f"{planned.technique.name} does not apply: {state.result(raise_on_failure=False)}"
        return [skipped(spec, reason) for spec in planned.variants]
    error = f"{planned.source} failed: {error_of(state)}"
    return [failed(spec, error) for spec in planned.variants]


def _forms_of(
    model: ModelArtifact, planned: Planned, config: PipelineConfig, data: TrainingData,
    run_dir: Path,
) -> list[VariantSpec]:
    """The planned variants of one technique's model: its graph form and TFLite conversions."""
    savedmodel = (model if model.format == "savedmodel"
                  else export_savedmodel.submit(model, run_dir / "models").result())
    graphs = [built(spec, model.path) for spec in planned.variants if spec.format == "graph"]
    tflite = [spec for spec in planned.variants if spec.format == "tflite"]
    return graphs + tflite_conversions(savedmodel, tflite, data.dataset, config.convert,
                                       run_dir / "variants", submit=True)
