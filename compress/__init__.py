"""How the enabled techniques run: the plan, their contained runs, the searches' trials.

`plan` lists the enabled techniques (`techniques.registry`) with their settings and variants;
each runs in a child process (`contained`, `finishing`), a search's trials through `make_trial`;
the order and the time each gets is `compress.planner`, what each outcome becomes
`compress.outcomes`. The compression subflow (`flows.compress_model`) wires them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.states import Completed, State

import tfopt  # noqa: F401  (environment before TensorFlow)
from techniques import registry
from techniques.base import NotApplicable, Skipped, Technique, TechniqueSection
from tfopt.artifacts import ModelArtifact, TrainingData, VariantSpec
from tfopt.logs import step_logger
from tfopt.native import NativeStep, run_native
from tfopt.runtimes import narrowed_to_int8
from tfopt.schedule.budget import Clock, Stop
from tfopt.schedule.prices import (
    PlannedRun,
    ended_by_deadline,
    epoch_cap,
    epochs_of,
    learn_cost,
    own_deadline,
    shortest_run_s,
    within_deadline,
)
from tfopt.search import TRIAL_FORMS, Point, Search, Trial, open_study, study_key
from tfopt.variants import failed, skipped


@dataclass(frozen=True)
class Planned:
    """An enabled technique with its settings and the variants it will yield."""

    technique: Technique
    cfg: TechniqueSection
    variants: list[VariantSpec]
    refusal: str | None = None

    @property
    def source(self) -> str:
        """The name of the model the technique makes."""
        return self.technique.source_name(self.cfg)

    @property
    def starts_from(self) -> str | None:
        """The technique whose model it continues from (None: the baseline)."""
        return self.technique.base_of(self.cfg)


def plan(config: Any, model: ModelArtifact) -> list[Planned]:
    """The enabled techniques in run order, each with its planned variants for `model`.

    A technique that cannot work on this kind of model, or continues from a technique that is
    not enabled, is planned with its refusal; its variants are marked skipped. Each section is
    the one that runs on `model` (`TechniqueSection.fitted_to`: a rebuilt model's ``epochs:
    auto`` made a number from the baseline's training).

    Args:
        config: The pipeline's configuration (its ``compress``, ``convert`` and ``runtimes``
            sections).
        model: The baseline.

    Raises:
        LookupError: A config section of the wrong class.
    """
    techniques = registry()
    compress = config.compress
    plans = []
    for name, cfg in compress.techniques():
        technique = techniques[name]
        if not isinstance(cfg, technique.section):
            raise LookupError(f"compress.{name} must be a {technique.section.__name__}")
        if not cfg.enabled:
            continue
        cfg = cfg.fitted_to(model)
        start, refusal, base = model.name, technique.refusal(model), technique.base_of(cfg)
        if base is not None:
            base_cfg = getattr(compress, base)
            start = techniques[base].source_name(base_cfg)
            if not base_cfg.enabled and refusal is None:
                refusal = f"{name} continues from the {base} technique's model: enable " \
                          f"compress.{base}"
        variants = technique.variants(cfg, config, start, arrays=model.keras_file is not None)
        if refusal:
            variants = [skipped(spec, refusal) for spec in variants]
        plans.append(Planned(technique, cfg, variants, refusal))
    return plans


COLLAPSE_SHARE = 0.25
"""A fine-tuned model that kept less than this share of the way from chance to the accuracy
it had to keep collapsed (QAT seen at 0.12 on 10 classes, chance 0.10, with 0.99 to keep)."""
GENTLER = 10.0
"""A collapsed fine-tuning is tried once more at its learning rate divided by this."""


class CollapsedError(RuntimeError):
    """A technique's fine-tuning collapsed, at its rate and at a gentler one."""


def collapsed(model: ModelArtifact, data: TrainingData) -> str | None:
    """Why `model`'s fine-tuning collapsed (back to about chance), or None.

    Judged against the accuracy it had to keep (`TrainingData.recover_to`): without one, or
    when that is itself about chance (a baseline that learned nothing), nothing collapsed. A
    weak model is not a collapsed one: a student below its teacher, or a compression that costs
    more than the budget, is judged by the accuracy budget like any other.
    """
    curve = model.history.get("val_accuracy") or []  # a classifier's (array data: none)
    chance = 1.0 / max(model.num_classes, 2)
    keep = data.recover_to
    if not curve or keep is None or keep <= 1.5 * chance:
        return None
    best = max(curve)
    if best > chance + COLLAPSE_SHARE * (keep - chance):
        return None
    return f"validation accuracy {best:.4f}, chance is {chance:.4f}"


def cut_short(model: ModelArtifact, data: TrainingData, margin: float) -> str | None:
    """Why `model`'s forms are not worth building: the time budget stopped it far from back.

    Its fine-tuning stopped by the budget (``stopped_by`` budget) with the accuracy of the epoch
    it kept (`ModelArtifact.at_kept_epoch`) more than `margin` below the accuracy it had to keep
    (`TrainingData.recover_to`): its files would be converted and measured, taking the run past
    its budget, for a verdict they cannot win.
    """
    kept = model.at_kept_epoch("val_accuracy")
    keep = data.recover_to
    if kept is None or keep is None or Stop.of(model.params) is not Stop.BUDGET:
        return None
    if kept >= keep - margin:
        return None
    return (f"{model.name}'s fine-tuning, stopped by the time budget after "
            f"{model.params.get('epochs_run')} epochs, kept a model at held-out accuracy "
            f"{kept:.4f}, more than the budget below {keep:.4f}: its forms were not built")


def cut_short_in_run(model: ModelArtifact, data: TrainingData,
                     budget_points: float) -> str | None:
    """`cut_short` with the run's margin, as the flow and the planner both judge it.

    The margin is the accuracy budget, or at least two images of the split trainings choose on
    (`tfopt.models.baseline.validation_margin`).
    """
    from tfopt.models.baseline import selection_examples, validation_margin

    return cut_short(model, data, validation_margin(budget_points, selection_examples(data)))


def apply_here(name: str, model: ModelArtifact, cfg: TechniqueSection, data: TrainingData,
               out_dir: Path) -> ModelArtifact:
    """Apply technique `name` in this process (what its child process runs: `contained`).

    A fine-tuning that collapses (`collapsed`) is tried once more at a gentler learning rate;
    collapsing again, the technique fails with both reasons rather than report a collapsed
    model as a result.

    Raises:
        CollapsedError: Both tries collapsed.
    """
    technique = registry()[name]
    made = technique.apply.fn(model, cfg, data, out_dir)
    why = collapsed(made, data)
    rate = getattr(cfg, "learning_rate", None)
    if why is None or rate is None:
        return made
    gentler = cfg.model_copy(update={"learning_rate": rate / GENTLER})
    step_logger().warning("%s collapsed (%s) at learning rate %g: trying %g", made.name, why,
                          rate, rate / GENTLER)
    again = technique.apply.fn(model, gentler, data, out_dir)
    still = collapsed(again, data)
    if still is not None:
        raise CollapsedError(f"{made.name} collapsed: {why} at learning rate {rate:g}, and "
                             f"{still} at {rate / GENTLER:g}")
    return again.model_copy(update={"params": {**again.params,
                                               "collapsed_at_learning_rate": rate}})


def make_trial(name: str, point: Point, start: ModelArtifact, cfg: TechniqueSection,
               data: TrainingData, out_dir: Path, convert: Any, target: float | None,
               forms: tuple[str, ...] = TRIAL_FORMS) -> Trial:
    """One search trial in this process (what its child process runs): model, then its files.

    The technique's model at `point` is fine-tuned until back within the budget (or stopped
    by the study's pruner), then exported and converted to TFLite in each of `forms`
    (`trial_forms`), the files the search times. Their timing is the parent's
    (`tfopt.search.time_files`), holding the benchmark slot.

    Args:
        name: The technique.
        point: Its searched strengths for this trial.
        start: The model it starts from.
        cfg: Its settings (the knobs are set to `point`'s here).
        data: The run's training data, with the trial to report to and the recovery target.
        out_dir: The trial's folder.
        convert: The ``convert`` section (calibration and int8 settings).
        target: The validation accuracy within the budget.
        forms: The TFLite precisions its files are converted to.
    """
    from tfopt.models.serving_export import export_serving_savedmodel
    from tfopt.runtimes import build_here, plan_variant
    from tfopt.runtimes.base import BuildSources
    from tfopt.search import trial_status

    technique = registry()[name]
    started = time.monotonic()
    model = technique.apply.fn(start, technique.at(cfg, point), data, out_dir)
    curve = model.history.get(data.held_out_key()) or []
    val = max(curve) if curve else None
    status = trial_status(Stop.of(model.params) is Stop.PRUNED, val,
                          target)
    ran = int(model.params.get("epochs_run", 0))
    if status == "pruned":
        return Trial(params=point, status=status, val_accuracy=val,
                     epochs_run=ran, seconds=time.monotonic() - started, model=model)
    savedmodel = (model if model.format == "savedmodel"
                  else export_serving_savedmodel(model, out_dir))
    sources = BuildSources(model=model, savedmodel=savedmodel, dataset=data.dataset,
                           out_dir=out_dir, calibration_examples=convert.calibration_examples)
    files = tuple(build_here(plan_variant(model.name, "tflite", precision), sources, convert)
                  for precision in forms)
    return Trial(params=point, status=status, val_accuracy=val,
                 epochs_run=ran, seconds=time.monotonic() - started, model=model, files=files)


def open_search(planned: Planned, config: Any, start: ModelArtifact,
                data: TrainingData) -> Search:
    """The study of a technique whose strength is ``auto``, in the work folder.

    The same starting model, settings and targets open the same study: a run killed during
    the search resumes it where it was. On array data its figures are scores of the run's
    metric (`tfopt.search.Search`).
    """
    technique = planned.technique
    assert technique.knob is not None
    settings = planned.cfg.model_dump(mode="json")
    key = study_key(technique.name, technique.knob, start, settings,
                    (data.recover_to, data.file_target), trial_forms(config))
    return open_study(technique.knob, config.work_dir.resolve() / "searches" / key, key,
                      data.recover_to, data.file_target, seed=data.seed,
                      metric=data.metric() if data.dataset.arrays else None)


def trial_forms(config: Any) -> tuple[str, ...]:
    """The TFLite precisions a search's trials convert and time.

    `tfopt.search.TRIAL_FORMS` (int8 is not the faster file everywhere, and the float file
    stands for the models' float forms on every runtime), or int8 alone once the compressed
    models are narrowed to their int8 files (`tfopt.runtimes.narrowed_to_int8`): a trial's
    float file would then be timed for nothing.
    """
    return ("int8",) if narrowed_to_int8(config) else TRIAL_FORMS


@cache
def contained(name: str) -> Task:
    """Technique `name`'s task as the flows run it: its name and tags, its body in a child process.

    Fine-tuning runs the model in TensorFlow's kernels: a crash there fails this technique
    (`tfopt.native`: one line, retried once without oneDNN), and the others go on. A model the
    technique does not apply to (`NotApplicable`), a cut by the time budget, or a `Skipped`
    technique it continues from end the task run Completed, named "Skipped" (`skipped_state`).
    """
    technique = registry()[name]
    step = NativeStep(technique.apply.name,
                      f"the {name} technique's fine-tuning in TensorFlow's kernels",
                      "the other techniques go on; this one's variants are reported failed")

    def run_technique(model: ModelArtifact | Skipped, cfg: TechniqueSection, data: TrainingData,
                      out_dir: Path) -> ModelArtifact | State:
        if isinstance(model, Skipped):
            return skipped_state(after_skipped(name, model))
        shortest, clock = shortest_run_s(name, cfg, data), Clock(deadline=data.deadline)
        if not clock.can_start(shortest):
            return skipped_state(Skipped(technique=name, kind="cut", reason=clock.cut(
                f"{name}'s fine-tuning", shortest)))
        data, started = own_deadline(data, epochs_of(cfg), shortest), time.monotonic()
        held = within_deadline(name, cfg, data)
        try:
            made = run_native(step, apply_here, name, model, held, data, out_dir)
        except NotApplicable as refusal:
            return skipped_state(Skipped(technique=name, kind="not_applicable",
                                         reason=str(refusal)))
        learn_cost(name, held, data, made, time.monotonic() - started)
        return made if held is cfg else ended_by_deadline(made, epoch_cap(cfg))

    return _in_place_of(technique.apply, run_technique)


def after_skipped(name: str, start: Skipped) -> Skipped:
    """Technique `name`, skipped because the technique it continues from was."""
    return Skipped(technique=name, kind="upstream",
                   reason=f"{name} continues from the {start.technique} technique's model, "
                          f"which was skipped: {start.line()}")


def skipped_state(skip: Skipped) -> State:
    """A technique's task run ended Completed, named "Skipped", its reason as the message."""
    return Completed(name="Skipped", message=skip.line(), data=skip)


def _in_place_of(declared: Task, body: Callable[..., ModelArtifact]) -> Task:
    """`body` as a Prefect task with `declared`'s name, tags, function name and docstring."""
    body.__doc__ = declared.fn.__doc__
    body.__name__ = body.__qualname__ = declared.fn.__name__
    return task(body, name=declared.name, tags=sorted(declared.tags))


def after_search_here(name: str, model: ModelArtifact, cfg: TechniqueSection,
                      data: TrainingData, out_dir: Path, made: ModelArtifact) -> ModelArtifact:
    """Technique `name`'s step after its search, in this process (`finishing` runs it)."""
    step = registry()[name].after_search
    assert step is not None
    return step.fn(model, cfg, data, out_dir, made)


@cache
def finishing(name: str) -> Task:
    """Technique `name`'s `Technique.after_search` as the flows run it: in a child process."""
    technique = registry()[name]
    assert technique.after_search is not None
    step = NativeStep(technique.after_search.name,
                      f"the {name} technique's last step after its search",
                      "the other techniques go on; this one's variants are reported failed")

    def after_search(model: ModelArtifact, cfg: TechniqueSection, data: TrainingData,
                     out_dir: Path, made: ModelArtifact) -> ModelArtifact:
        return run_native(step, after_search_here, name, model, cfg, data, out_dir, made)

    return _in_place_of(technique.after_search, after_search)


def planned_counts(config: Any) -> tuple[int, int]:
    """How many baseline and compressed variants a run of `config` plans (its time budget's)."""
    from tfopt.runtimes import plan_forms
    from tfopt.runtimes.base import PlanRequest

    kind = config.model.kind
    baseline = ModelArtifact(name="baseline", path=Path("baseline"), format=kind,
                             image_size=config.data.image_size, num_classes=2)
    forms = plan_forms(PlanRequest(source="baseline", kind=kind), config)
    compressed = [spec for planned in plan(config, baseline) for spec in planned.variants]
    return (sum(1 for spec in forms if spec.status == "ok"),
            sum(1 for spec in compressed if spec.status == "ok"))


def priced_runs(plans: list[Planned]) -> list[PlannedRun]:
    """The planned techniques that will run, as their prices read them."""
    return [PlannedRun(planned.technique.name, planned.cfg, planned.technique.searched(planned.cfg))
            for planned in plans if planned.refusal is None]


def compression_workers(config: Any) -> int:
    """How many trials or fine-tunings the compression's task runner runs at once."""
    scale = config.scale
    return scale.dask_workers if scale.task_runner == "dask" else 1


def compressed_formats(plans: list[Planned]) -> list[str]:
    """The formats of the compressed variants `plans` will build."""
    return [spec.format for planned in plans for spec in planned.variants
            if spec.status == "ok"]


def all_failed(plans: list[Planned], error: str) -> list[VariantSpec]:
    """Every planned variant marked failed with `error` (when the whole subflow failed)."""
    return [failed(spec, error) if spec.status == "ok" else spec
            for planned in plans for spec in planned.variants]
