"""Subflow: apply every enabled compression technique to the baseline, then build their forms.

The techniques come from the registry (`techniques.plan`) and are submitted to the subflow's
task runner, chosen by `ScaleConfig` (`tfopt.scaling.task_runner`): one at a time in this
process (sequential), or at once on Dask worker processes. A technique that continues from
another's model is handed that technique's future, so Prefect starts it once that model is made.
Benchmarks are not run here; the main flow serializes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.states import State

from flows.common import build_forms, build_sources, error_of, final_state
from flows.parameters import PipelineConfig
from tasks.export_savedmodel import export_savedmodel
from techniques import Planned, contained, plan
from techniques.base import NotApplicable
from tfopt.artifacts import ModelArtifact, TrainingData, VariantSpec
from tfopt.orchestration import claim_flow_run
from tfopt.runtimes import runtime_of
from tfopt.variants import failed, skipped


@flow(name="compress_model", flow_run_name="compress-{config.name}", log_prints=True)
def compress_model(
    config: PipelineConfig, baseline: ModelArtifact, data: TrainingData, run_dir: Path
) -> tuple[list[VariantSpec], list[ModelArtifact]]:
    """Apply every enabled compression technique to the baseline and build its model's forms.

    Every technique is submitted at once; one that continues from another technique's model
    (`Planned.starts_from`) gets that technique's future as its input, so it waits for it. A
    technique that fails marks its planned variants failed (and those of the techniques
    continuing from it), one that does not apply to the model (`NotApplicable`) skipped with
    its reason; the others go on.

    Args:
        config: The pipeline configuration (compress, convert and scale sections).
        baseline: The trained baseline (never modified).
        data: The run's training data and input settings (every fine-tuning uses them).
        run_dir: The run's folder (models/ and variants/ go under it).

    Returns:
        The variants to benchmark, and the compressed models (for their technique metrics).
    """
    claim_flow_run()
    plans = plan(config, baseline)
    futures = _submit_techniques([p for p in plans if p.refusal is None], baseline, data,
                                 run_dir / "models")
    variants: list[VariantSpec] = []
    made: list[ModelArtifact] = []
    for planned in plans:
        if planned.refusal is not None:
            variants += planned.variants
            continue
        state = final_state(futures[planned.technique.name])
        if not state.is_completed():
            variants += _not_built(planned, state, plans, futures)
            continue
        forms = _forms_of(state.result(), planned, config, data, run_dir)
        made.append(_with_read_back(state.result(), forms))
        variants += forms
    return variants, made


def _submit_techniques(plans: list[Planned], baseline: ModelArtifact, data: TrainingData,
                       models_dir: Path) -> dict[str, PrefectFuture]:
    """Each technique submitted, in run order, on the baseline or its starting model's future."""
    futures: dict[str, PrefectFuture] = {}
    for planned in plans:
        start = baseline if planned.starts_from is None else futures[planned.starts_from]
        futures[planned.technique.name] = contained(planned.technique.name).submit(
            start, planned.cfg, data, models_dir)
    return futures


def _with_read_back(model: ModelArtifact, forms: list[VariantSpec]) -> ModelArtifact:
    """`model` with what its runtimes read back from its built files (`Runtime.read_back`).

    Read from the very files the benchmark measures, so the sparsity and clusters a technique
    kept are checked where they must survive; a file that cannot be read is logged and passed
    over.
    """
    found: dict[str, float] = {}
    for spec in forms:
        if spec.status != "ok":
            continue
        try:
            kept = runtime_of(spec.format).read_back(spec)
        except (OSError, ValueError, RuntimeError) as error:
            get_run_logger().warning("%s: could not read %s back: %s", model.name, spec.name,
                                     error)
            continue
        if kept:
            get_run_logger().info("%s: read back from %s: %s", model.name, spec.name,
                                  {key: round(value, 3) for key, value in kept.items()})
        found = {**kept, **found}
    if not found:
        return model
    return model.model_copy(update={"metrics": {**model.metrics, **found}})


def _not_built(planned: Planned, state: State, plans: list[Planned],
               futures: dict[str, PrefectFuture]) -> list[VariantSpec]:
    """The variants of a technique that made no model: skipped, failed, or as its start was."""
    base = planned.starts_from
    if base is not None and not final_state(futures[base]).is_completed():
        start = next(p for p in plans if p.technique.name == base)
        return without_base(planned, _not_built(start, futures[base].state, plans, futures)[0]
                            if start.variants else None)
    outcome = state.result(raise_on_failure=False)
    if isinstance(outcome, NotApplicable):
        reason = f"{planned.technique.name} does not apply: {outcome}"
        return [skipped(spec, reason) for spec in planned.variants]
    error = f"{planned.source} failed: {error_of(state)}"
    return [failed(spec, error) for spec in planned.variants]


def without_base(planned: Planned, base: VariantSpec | None) -> list[VariantSpec]:
    """A technique whose starting model is missing: skipped or failed as that model's variants."""
    why = f"{base.status}: {base.error}" if base is not None else "not built"
    reason = (f"{planned.source} continues from the {planned.starts_from} technique's model, "
              f"which was {why}")
    mark = skipped if base is not None and base.status == "skipped" else failed
    return [mark(spec, reason) for spec in planned.variants]


def _forms_of(model: ModelArtifact, planned: Planned, config: Any, data: TrainingData,
              run_dir: Path) -> list[VariantSpec]:
    """The planned variants of one technique's model, built by their runtimes at once."""
    savedmodel = (model if model.format == "savedmodel"
                  else export_savedmodel.submit(model, run_dir / "models").result())
    sources = build_sources(model, savedmodel, data, config, run_dir / "variants")
    return build_forms(planned.variants, sources, config, submit=True)
