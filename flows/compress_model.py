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
from prefect.states import Completed, State

from flows.common import build_forms, build_sources, error_of, final_state
from flows.parameters import PipelineConfig
from tasks.export_savedmodel import export_savedmodel
from tasks.run_trial import run_trial
from techniques import (
    Planned,
    after_skipped,
    contained,
    cut_short,
    epochs_of,
    finishing,
    open_search,
    plan,
    shortest_run_s,
    skipped_state,
)
from techniques.base import NotApplicable, Skipped
from tfopt.artifacts import BenchmarkInputs, Compressed, ModelArtifact, TrainingData, VariantSpec
from tfopt.budget import CUT_BY_BUDGET
from tfopt.models.baseline import validation_margin
from tfopt.orchestration import claim_flow_run
from tfopt.runtimes import read_back_file
from tfopt.search import Search, search_line, search_summary, trial_of
from tfopt.tracking import RunRef
from tfopt.variants import failed, skipped


@flow(name="compress_model", flow_run_name="compress-{config.name}", log_prints=True)
def compress_model(
    config: PipelineConfig, baseline: ModelArtifact, data: TrainingData, run_dir: Path,
    inputs: BenchmarkInputs | None = None, parent: RunRef | None = None,
) -> Compressed:
    """Apply every enabled compression technique to the baseline and build its model's forms.

    Every technique runs before any search goes deep (`_apply_techniques`); one that continues
    from another technique's model (`Planned.starts_from`) waits for it. A technique whose
    strength is ``auto`` is searched (`tfopt.search`: each trial a Prefect task run and a nested
    MLflow run) and its chosen trial's model is its model. A technique that fails marks its
    variants failed, one that is `Skipped` (not applicable, cut by the budget, or continuing
    from a skipped one) skipped with its reason, as are the forms of a model the time budget
    stopped far from the accuracy it had to keep (`cut_short`); the others go on.

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
    searches: dict[str, Search] = {}
    outcomes = _apply_techniques(plans, config, baseline, data, run_dir, inputs, parent,
                                 searches)
    variants: list[VariantSpec] = []
    made: dict[str, ModelArtifact] = {}
    margin = validation_margin(config.benchmark.accuracy_budget_points,
                               data.dataset.splits["val"].examples)
    for planned in plans:
        if planned.refusal is not None:
            variants += planned.variants
            continue
        state = _state_of(outcomes[planned.technique.name])
        if not state.is_completed():
            variants += _not_built(planned, state, plans, outcomes)
            continue
        model = state.result()
        if isinstance(model, Skipped):
            variants += [skipped(spec, model.line()) for spec in planned.variants]
            continue
        replanned = _replanned(planned, model, config, baseline, made)
        short = cut_short(model, data, margin)
        if short is not None:
            get_run_logger().warning(short)
            made[planned.technique.name] = model
            variants += [skipped(spec, short) for spec in replanned.variants]
            continue
        forms = _forms_of(model, replanned, config, data, run_dir)
        made[planned.technique.name] = _with_read_back(model, forms)
        variants += forms
    return Compressed(variants=variants, models=list(made.values()),
                      searches={name: search_summary(search) for name, search in
                                searches.items()})


def searches_first(plans: list[Planned]) -> list[Planned]:
    """`plans` in run order, with the searches that start from the baseline moved first.

    A search's trials go to the task runner the other techniques were submitted to; with one
    worker (the default) those submitted before them run first: on EfficientNetB0 (30 minutes)
    depth pruning's search, which the run order puts after distillation and QAT, started once
    both were done and was cut after one trial. Among them, those that try their strongest
    setting first (`Knob.strongest_first`) go first: on EfficientNetB0 channel pruning's
    search, run first, took the 7 minutes the budget left for all searches and left depth
    pruning's one trial a single epoch. Then those whose first trial is not the middle of a
    bisection (`Knob.first`).
    """
    def order(planned: Planned) -> tuple[bool, bool, bool]:
        knob = planned.technique.knob
        return (not searched_from_baseline(planned),
                not (knob is not None and knob.strongest_first),
                knob is None or knob.first is None)
    return sorted(plans, key=order)


def searched_from_baseline(planned: Planned) -> bool:
    """Whether a technique's strength is searched, starting from the baseline."""
    return planned.starts_from is None and planned.technique.searched(planned.cfg)


def _apply_techniques(plans: list[Planned], config: PipelineConfig, baseline: ModelArtifact,
                      data: TrainingData, run_dir: Path, inputs: BenchmarkInputs | None,
                      parent: RunRef | None, searches: dict[str, Search]) -> dict[str, Any]:
    """Each technique's outcome (a final state, or a future): every technique before any depth.

    Coverage first: each search's first round (one trial, at its knob's `Knob.first` or the
    middle; the searches from the baseline first, `searches_first`), then every other
    technique's fine-tuning, submitted in run order and waited for, each ending by its epochs'
    share of the time left when it starts (`TrainingData.epochs_queued`); only then do the
    searches deepen, in the time left. A search that runs first no longer takes the time of the
    techniques after it: on the demo channel pruning's bisection cut distillation, pruning, QAT
    and clustering.
    """
    outcomes: dict[str, Any] = {}
    searched = [planned for planned in searches_first(plans) if planned.refusal is None
                and searched_from_baseline(planned) and inputs is not None and parent]
    after = [planned for planned in plans if planned.refusal is None and planned not in searched]
    deepen: dict[str, tuple[Planned, ModelArtifact, TrainingData]] = {}

    def finished(name: str) -> Any:
        """A technique's outcome; a search's once it has deepened in the time left."""
        if name in deepen and name not in outcomes:
            planned, start, trained = deepen[name]
            _run_rounds(searches[name], planned, config, start, trained, inputs, parent)
            outcomes[name] = _searched(searches[name], planned, start, trained)
        return outcomes[name]

    for planned in searched:
        search = _opened(planned, config, baseline, data, searches)
        _run_rounds(search, planned, config, baseline, data, inputs, parent, rounds=1)
        deepen[planned.technique.name] = (planned, baseline, data)
    fine_tunes = [planned for planned in after if not (
        planned.technique.searched(planned.cfg) and inputs is not None and parent)]
    workers = config.scale.dask_workers if config.scale.task_runner == "dask" else 1
    for planned in after:
        # A technique that continues from a search's choice waits for that search to end.
        start = baseline if planned.starts_from is None else finished(planned.starts_from)
        name = planned.technique.name
        if planned.technique.searched(planned.cfg) and inputs is not None and parent:
            start_state = _state_of(start) if planned.starts_from else Completed(data=start)
            made = start_state.result() if start_state.is_completed() else None
            if not isinstance(made, ModelArtifact):
                outcomes[name] = (skipped_state(after_skipped(name, made))
                                  if isinstance(made, Skipped) else start_state)
                continue
            search = _opened(planned, config, made, data, searches)
            _run_rounds(search, planned, config, made, data, inputs, parent, rounds=1)
            deepen[name] = (planned, made, data)
        else:
            queued = fine_tunes[fine_tunes.index(planned):]
            outcomes[name] = contained(name).submit(start, planned.cfg, data.model_copy(update={
                "epochs_queued": sum(epochs_of(p.cfg) for p in queued) // workers,
                "shortest_queued_s": sum(shortest_run_s(p.cfg, data) for p in queued) / workers,
            }), run_dir / "models")
    for outcome in list(outcomes.values()):
        if not isinstance(outcome, State):
            outcome.wait()
    for name in deepen:
        finished(name)
    return outcomes


def _opened(planned: Planned, config: PipelineConfig, start: ModelArtifact, data: TrainingData,
            searches: dict[str, Search]) -> Search:
    """A technique's search, added to `searches`, its rounds expected as long as theirs."""
    search = open_search(planned, config, start, data)
    search.expected_round_s = max(
        filter(None, (done.round_seconds for done in searches.values())), default=None)
    searches[planned.technique.name] = search
    return search


def _run_rounds(search: Search, planned: Planned, config: PipelineConfig, start: ModelArtifact,
                data: TrainingData, inputs: BenchmarkInputs, parent: RunRef,
                rounds: int | None = None) -> None:
    """Bisect a technique's strength with trials on the task runner, `rounds` rounds at most.

    A round tries as many settings as the runner has workers; each trial reports to the
    study, which is kept in the work folder (a killed run resumes it).
    """
    name = planned.technique.name
    workers = config.scale.dask_workers if config.scale.task_runner == "dask" else 1
    done = 0
    while (rounds is None or done < rounds) and not refusal_of(search) and (
            values := search.next_values(workers, data.deadline)):
        futures = {value: run_trial.submit(
            name, value, start, planned.cfg,
            data.model_copy(update={"trial": search.start(value)}),
            search.trial_folder(value), config.convert, inputs, config.benchmark,
            parent) for value in values}
        for value, future in futures.items():
            search.finish(trial_of(final_state(future), search, value))
        done += 1


def refusal_of(search: Search) -> str | None:
    """Why the technique does not apply to the model, if a trial found it does not.

    A model without what the technique works on (no residual block to remove) refuses every
    setting alike: one such trial ends the search.
    """
    return next((trial.error or "" for trial in search.trials()
                 if trial.status == "not_applicable"), None)


def _searched(search: Search, planned: Planned, start: ModelArtifact,
              data: TrainingData) -> State:
    """The state of a technique's search: its chosen trial's model, or why there is none."""
    name = planned.technique.name
    chosen = search.chosen()
    get_run_logger().info("%s search: %s", name, search_line(search))
    if not search.trials():
        return skipped_state(Skipped(technique=name, kind="cut", reason=(
            f"{CUT_BY_BUDGET}: the fine-tunings' time was used before {name}'s search could "
            "start")))
    if refusal := refusal_of(search):
        return skipped_state(Skipped(technique=name, kind="not_applicable", reason=refusal))
    if chosen is None or chosen.model is None:
        return skipped_state(Skipped(technique=name, kind="not_applicable", reason=(
            f"no {search.knob.field} tried kept the accuracy within the budget "
            f"({search_line(search)})")))
    if planned.technique.after_search is None:
        return Completed(data=chosen.model)
    return final_state(finishing(name).submit(
        start, planned.technique.at(planned.cfg, chosen.value), data,
        search.trial_folder(chosen.value), chosen.model))


def _state_of(outcome: Any) -> State:
    """The final state of a technique's outcome (a future is waited for)."""
    return outcome if isinstance(outcome, State) else final_state(outcome)


def _replanned(planned: Planned, model: ModelArtifact, config: PipelineConfig,
               baseline: ModelArtifact, made: dict[str, ModelArtifact]) -> Planned:
    """A technique's plan made again with what is known now.

    Its searched strength names its variants, and the model it started from (itself searched,
    perhaps) names what they derive from.
    """
    technique, cfg = planned.technique, planned.cfg
    if technique.searched(cfg):
        cfg = technique.at(cfg, float(model.params[technique.knob.field]))
    start = made[planned.starts_from].name if planned.starts_from in made else baseline.name
    return Planned(technique, cfg, technique.variants(cfg, config, start))


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
            kept = read_back_file(spec)
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
               outcomes: dict[str, Any]) -> list[VariantSpec]:
    """The variants of a technique that made no model: skipped, failed, or as its start was."""
    base = planned.starts_from
    if base is not None and not _state_of(outcomes[base]).is_completed():
        start = next(p for p in plans if p.technique.name == base)
        return without_base(planned, _not_built(start, _state_of(outcomes[base]), plans,
                                                outcomes)[0] if start.variants else None)
    outcome = state.result(raise_on_failure=False)
    if isinstance(outcome, NotApplicable):
        verdict = "" if str(outcome).startswith(CUT_BY_BUDGET) else " does not apply"
        reason = f"{planned.technique.name}{verdict}: {outcome}"
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
