"""Subflow: apply every enabled compression technique to the baseline, then build their forms.

The techniques come from the registry (`compress.plan`), run in the plan's order
(`compress.planner.Planner`: every technique's shortest run before any search goes deep) on
the subflow's task runner, chosen by `ScaleConfig` (`tfopt.scaling.task_runner`). Each outcome
becomes its variants (`compress.outcomes`). Benchmarks are not run here; the main flow
serializes them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from compress import Planned, cut_short_in_run, plan
from compress.outcomes import not_built, replanned, with_read_back
from compress.planner import Planner
from flows.common import build_forms, build_sources
from flows.parameters import PipelineConfig
from tasks.export_savedmodel import export_savedmodel
from tasks.run_trial import run_trial
from techniques.base import Skipped
from tfopt.artifacts import (
    BenchmarkInputs,
    Compressed,
    Cut,
    ModelArtifact,
    TrainingData,
    VariantSpec,
)
from tfopt.orchestration import claim_flow_run, error_of, final_state
from tfopt.search import search_summary
from tfopt.tracking import RunRef
from tfopt.variants import failed, skipped


@flow(name="compress_model", flow_run_name="compress-{config.name}", log_prints=True)
def compress_model(
    config: PipelineConfig, baseline: ModelArtifact, data: TrainingData, run_dir: Path,
    inputs: BenchmarkInputs | None = None, parent: RunRef | None = None,
) -> Compressed:
    """Apply every enabled compression technique to the baseline and build its model's forms.

    A technique whose strength is ``auto`` is searched (`tfopt.search`: each trial a Prefect
    task run and a nested MLflow run) and its chosen trial's model is its model. A technique
    that fails marks its variants failed, one that is `Skipped` (not applicable, cut by the
    budget, or continuing from a skipped one) skipped with its reason, as are the forms of a
    model the time budget stopped far from the accuracy it had to keep (`cut_short_in_run`); the
    others go on.

    Args:
        config: The pipeline configuration (compress, convert and scale sections).
        baseline: The trained baseline (never modified).
        data: The run's training data and input settings (every fine-tuning uses them).
        run_dir: The run's folder (models/ and variants/ go under it).
        inputs: The benchmark inputs (a search times its trials on them).
        parent: The pipeline's MLflow run (a search's trials are nested runs of it).

    Returns:
        The variants to benchmark, the compressed models, and each search's trials.
    """
    claim_flow_run()
    plans = plan(config, baseline)
    planner = Planner(config, baseline, data, run_dir, inputs, parent, run_trial)
    get_run_logger().info(planner.plan_line(plans))
    states = {name: final_state(outcome) for name, outcome in planner.run(plans).items()}
    variants: list[VariantSpec] = []
    made: dict[str, ModelArtifact] = {}
    skips = [s.result() for s in states.values() if s.is_completed()
             and isinstance(s.result(), Skipped)]
    for planned in plans:
        state = states.get(planned.technique.name)
        if planned.refusal is not None or state is None:
            variants += planned.variants
        elif not state.is_completed() or isinstance(state.result(), Skipped):
            variants += not_built(planned, state, plans, states)
        else:
            variants += _built(planned, state.result(), config, (baseline, data), run_dir, made)
    return Compressed(variants=variants, models=list(made.values()),
                      searches={name: search_summary(search)
                                for name, search in planner.searches.items()},
                      cuts=[*(Cut(step=skip.technique, kind="not_started", reason=skip.line())
                              for skip in skips if skip.kind == "cut"),
                            *(search.cut for search in planner.searches.values()
                              if search.cut is not None)])


def _built(planned: Planned, model: ModelArtifact, config: PipelineConfig,
           start: tuple[ModelArtifact, TrainingData], run_dir: Path,
           made: dict[str, ModelArtifact]) -> list[VariantSpec]:
    """A technique's forms of its model (added to `made`), or why they are not worth building.

    A model whose SavedModel export fails has its forms failed with the export's error; the
    other techniques' models are built as usual.
    """
    baseline, data = start
    again = replanned(planned, model, config, baseline, made)
    made[planned.technique.name] = model
    if (short := cut_short_in_run(model, data,
                                  config.benchmark.accuracy_budget_points)) is not None:
        get_run_logger().warning(short)
        return [skipped(spec, short) for spec in again.variants]
    savedmodel = model
    if model.format != "savedmodel":
        exporting = final_state(export_savedmodel.submit(model, run_dir / "models"))
        if not exporting.is_completed():
            error = f"export_savedmodel failed: {error_of(exporting)}"
            get_run_logger().warning("%s: %s; the other techniques go on", model.name, error)
            return [failed(spec, error) for spec in again.variants]
        savedmodel = exporting.result()
    sources = build_sources(model, savedmodel, data, config, run_dir / "variants")
    forms = build_forms(again.variants, sources, config, submit=True)
    made[planned.technique.name] = with_read_back(model, forms)
    return forms
