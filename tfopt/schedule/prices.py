"""What a technique's run costs at the baseline's pace, and the share of the time it gets.

A run's price is its fixed part (process start, model load, graph, export) and its epochs'
share of the baseline's epoch (`RunPrice`): learned on this machine for the model
(`tfopt.schedule.learned_costs`), else guessed (`STARTUP_S`, `WRAPPED_EPOCH_SHARE`). From it
come a technique's shortest useful run (a searched one's: its search's first trial), the share
of the time left it gets beside those queued after it (`own_deadline`: coverage before depth),
and the epochs its deadline holds (`within_deadline`). A technique's settings are read by their
field names (``epochs``, ``trainings``, ``learning_rate_schedule``, ``cool_down_epochs``): the
techniques are plug-ins above this core.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from tfopt.artifacts import LearnedCosts, ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.schedule.budget import Clock, Stop
from tfopt.schedule.learned_costs import record_cost
from tfopt.search.trials import TRIAL_FORMS

SHORTEST_EPOCHS = 2
"""The epochs of a technique's shortest useful run (fewer when its cap is lower)."""
WRAPPED_EPOCH_SHARE = 2.0
"""How much longer an epoch of a technique's model takes than the baseline's (tfmot's wrappers,
the distiller's teacher pass), until learned on this machine (`price_of`)."""
STARTUP_S = 5.0
"""A technique's process start, model load and export, beside its epochs, until learned on this
machine (`price_of`)."""


class RunPrice(NamedTuple):
    """What a technique's run costs beside and per epoch, at the baseline's pace."""

    startup_s: float = STARTUP_S
    """Its fixed part: process start, model load, graph, export."""
    epoch_share: float = WRAPPED_EPOCH_SHARE
    """One of its epochs in the baseline's epochs (a training of each model it trains)."""


GUESSED_PRICE = RunPrice()
"""A technique's price until this machine has run it for this model."""


class PlannedRun(NamedTuple):
    """A planned technique as its price reads it (`compress.priced_runs`)."""

    name: str
    cfg: Any
    searched: bool
    """Its strength is searched: its shortest run is its search's first trial."""


def full_runs_s(runs: Iterable[PlannedRun], epoch_s: float,
                costs: LearnedCosts | None = None) -> float:
    """What every planned technique's fine-tuning to its epoch cap takes at the baseline's pace.

    A searched technique counts one trial; `epoch_s` is the baseline's epoch (0: unknown);
    each one is priced by `price_of`.
    """
    return sum(fine_tuning_s(epochs_of(run.cfg), epoch_s, price_of(run.name, costs, epoch_s))
               for run in runs)


def shortest_runs_s(runs: Iterable[PlannedRun], epoch_s: float, workers: int = 1,
                    file_s: float = 0.0, trial_files: int = len(TRIAL_FORMS),
                    costs: LearnedCosts | None = None) -> float:
    """What every planned technique's shortest run takes, `workers` of them at once.

    The compression's least useful time: the planner cuts a technique whose shortest run does
    not fit (`compress.planner`). `epoch_s` is the baseline's epoch (0: unknown, 0 s); a
    searched technique's is its first trial, its `trial_files` priced at `file_s` each
    (`first_trial_s`); each one is priced by `price_of`.
    """
    return sum(shortest_at(run.cfg, epoch_s, file_s, trial_files if run.searched else 0,
                           price_of(run.name, costs, epoch_s))
               for run in runs) / max(1, workers)


def own_deadline(data: TrainingData, epochs: int, shortest_s: float) -> TrainingData:
    """`data` with this fine-tuning's deadline, from now (coverage before depth).

    Its shortest run, and its `epochs`' share of what the shortest runs of those queued leave: by
    their count, not their price, so a technique whose epochs cost less (a distilled student's)
    reaches further into its cap. Those whose shortest run no longer fits behind the ones before
    them (`fitting`) keep no time: they would be cut at their start, and the time kept for them
    would go unused.
    """
    clock = Clock(deadline=data.deadline)
    left = clock.left()
    if left is None or not data.queued:
        return data
    (own_s, own_epochs), after = data.queued[0], data.queued[1:]
    kept = [(own_s, own_epochs), *(run for run, fits in zip(
        after, fitting([s for s, _ in after], left - own_s), strict=True) if fits)]
    epochs_queued = sum(queued_epochs for _, queued_epochs in kept)
    if epochs_queued <= epochs:
        return data.model_copy(update={"queued": ()})
    shared = clock.share(shortest_s, sum(queued_s for queued_s, _ in kept),
                         epochs / epochs_queued)
    return data.model_copy(update={"deadline": shared.deadline, "queued": ()})


def within_deadline(name: str, cfg: Any, data: TrainingData) -> Any:
    """`cfg` with its ``epochs`` lowered to those its deadline holds at its price (`price_of`).

    What is laid over the epochs (pruning's sparsity ramp, a cosine rate) then ends before the
    deadline instead of being stopped by it midway: a pruning stopped in its ramp kept a model
    short of its sparsity (0.30 of 0.80) and of its accuracy, under a name that promised both.
    Never below its shortest run's epochs (it started because those fit); unchanged without a
    deadline, the baseline's pace or an ``epochs`` setting.
    """
    cap = getattr(cfg, "epochs", None)
    left = Clock(deadline=data.deadline).left()
    if not isinstance(cap, int) or left is None or data.epoch_s <= 0.0:
        return cfg
    price = price_of(name, data.costs, data.epoch_s)
    epoch_s = data.epoch_s * price.epoch_share * trainings(cfg)
    held = max(min(SHORTEST_EPOCHS, cap), int((left - price.startup_s) // epoch_s))
    if held >= cap:
        return cfg
    step_logger().info(
        "%s: %d of its %d epochs fit before its deadline (%.0f s left, %.1f s an epoch): what "
        "its schedule lays over the epochs is laid over those", name, held, cap, left, epoch_s)
    return cfg.model_copy(update={"epochs": held})


def ended_by_deadline(made: ModelArtifact, cap: int) -> ModelArtifact:
    """`made`, whose epochs were lowered to those its deadline held, as the budget ended it.

    Its training ran to its lowered cap: the time budget, not its cap of `cap` epochs, ended
    it, and a model it left far from back is not worth its forms (`cut_short`).
    """
    if Stop.of(made.params) is not Stop.CAP:
        return made
    return made.model_copy(update={"params": {
        **made.params, "stopped_by": Stop.BUDGET,
        "stop_reason": f"budget: the {made.params.get('epochs_run')} of its {cap} epochs its "
                       "deadline held"}})


def fitting(shortest_s: list[float], left_s: float) -> list[bool]:
    """Which of the runs queued in this order get their shortest run in `left_s`.

    Each fits if the shortest runs of those that fit before it and its own end within `left_s`;
    one that does not is passed over (cut at its start unless those before end sooner), and a
    shorter one after it may still fit.
    """
    fits, taken = [], 0.0
    for seconds in shortest_s:
        fits.append(taken + seconds <= left_s)
        taken += seconds if fits[-1] else 0.0
    return fits


def epochs_of(cfg: Any) -> int:
    """A technique's epochs at its cap, over every model it trains (1 for one without epochs).

    Distillation trains its controls as long as its student (`trainings`): its share of the
    time is that of all three, or its student gets a third of what its epochs' share says.
    """
    return epoch_cap(cfg) * trainings(cfg)


def epoch_cap(cfg: Any) -> int:
    """A technique's epoch cap (1 for one without epochs)."""
    return max(1, int(getattr(cfg, "epochs", 1) or 1))


def trainings(cfg: Any) -> int:
    """How many models a technique's run trains (a distilled student's controls too)."""
    return max(1, int(getattr(cfg, "trainings", 1)))


def price_of(name: str, costs: LearnedCosts | None, epoch_s: float) -> RunPrice:
    """Technique `name`'s price at the baseline's `epoch_s`: learned here, else the guesses.

    Its fixed part (process start, model load, graph, export) and its epochs' share: a technique
    whose graph takes long to build (CQAT's) or whose model is thinner than the baseline (a
    distilled student, a pruned trial) is priced as it ran in this config's earlier runs on this
    machine (`tfopt.schedule.learned_costs`); what was not learned is `STARTUP_S`,
    `WRAPPED_EPOCH_SHARE`.
    """
    if costs is None:
        return GUESSED_PRICE
    startup, share = costs.startup_s(name, epoch_s), costs.epoch_share(name)
    return RunPrice(STARTUP_S if startup is None else startup,
                    WRAPPED_EPOCH_SHARE if share is None else share)


def shortest_run_s(name: str, cfg: Any, data: TrainingData,
                   trial_files: int = 0) -> float:
    """What technique `name`'s shortest useful run takes at the baseline's pace (0: unknown).

    A searched technique's is its search's first trial, converting and timing `trial_files`
    files (`first_trial_s`; 0: not searched), each priced as a compressed variant
    (`trial_file_s`). It is priced by `price_of`.
    """
    return shortest_at(cfg, data.epoch_s, trial_file_s(data), trial_files,
                       price_of(name, data.costs, data.epoch_s))


def trial_file_s(data: TrainingData) -> float:
    """What one of a search trial's files costs to convert and time.

    As the baseline's LiteRT files did (`TrainingData.file_s`), else a compressed variant's
    share of the budget's tail (`TrainingData.variant_tail_s`).
    """
    return data.file_s or data.variant_tail_s


def first_trial_s(cfg: Any, epoch_s: float, file_s: float,
                  files: int = len(TRIAL_FORMS), price: RunPrice = GUESSED_PRICE) -> float:
    """What a search's first trial takes at the baseline's pace (0: unknown).

    A trial's fine-tuning ends once back within the budget and settled, cooled down, or at the
    end of its cosine schedule (`after_recovery_epochs`), or, in a search's first round, at its
    technique's share of the time (`compress.planner.Planner.run`: one search's first trial
    cannot take the other techniques' shortest runs; a trial not back by then is over the
    budget for this run); it trains its model alone (a distilled student's controls are
    trained once, for the setting chosen). Its `files` (`trial_forms`) are then converted and
    measured, and timed side by side with the baseline's int8 file: each of those costs about
    what a compressed variant's conversion and measurement does (`file_s`).
    """
    if epoch_s <= 0.0:
        return 0.0
    epochs = min(epoch_cap(cfg), 1 + after_recovery_epochs(cfg))
    return fine_tuning_s(epochs, epoch_s, price) + (files + 1) * file_s


def after_recovery_epochs(cfg: Any) -> int:
    """The epochs a fine-tuning runs once back within the budget (`recovery`).

    A cosine rate's cool-down (`cool_down_field`); a cosine rate without one runs its whole
    schedule (a distilled student: `techniques.distill.distill`); else the epochs it settles
    for.
    """
    from tfopt.models.config import SETTLE_EPOCHS

    if getattr(cfg, "learning_rate_schedule", None) == "cosine" and not cooling_epochs(cfg):
        return epoch_cap(cfg)
    return cooling_epochs(cfg) or SETTLE_EPOCHS


def shortest_at(cfg: Any, epoch_s: float, file_s: float = 0.0,
                trial_files: int = 0, price: RunPrice = GUESSED_PRICE) -> float:
    """`shortest_run_s` at `epoch_s`, a searched technique's (`trial_files`) its first trial's."""
    if trial_files:
        return first_trial_s(cfg, epoch_s, file_s, trial_files, price)
    if epoch_s <= 0.0:
        return 0.0
    return fine_tuning_s(min(SHORTEST_EPOCHS, epoch_cap(cfg)) * trainings(cfg), epoch_s, price)


def fine_tuning_s(epochs: int, epoch_s: float, price: RunPrice = GUESSED_PRICE) -> float:
    """A fine-tuning of `epochs` at the baseline's `epoch_s`, at `price`."""
    return price.startup_s + epochs * epoch_s * price.epoch_share


def cooling_epochs(cfg: Any) -> int:
    """The epochs a fine-tuning's cosine rate cools down over once back within the budget.

    0 for a technique without a cool-down (``cool_down_epochs``) or a constant rate.
    """
    if getattr(cfg, "learning_rate_schedule", None) != "cosine":
        return 0
    return int(getattr(cfg, "cool_down_epochs", 0) or 0)


def learn_cost(name: str, cfg: Any, data: TrainingData,
               made: ModelArtifact | None, wall_s: float, files: int = 0) -> None:
    """Keep what technique `name`'s run that `made` a model took (`tfopt.schedule.learned_costs`).

    Its epoch share is its median epoch after the first (``steady_epoch_seconds``) over the
    baseline's, its epochs priced at that; the first epoch's graph building then counts in its
    fixed part, with its process start, load and export, as it does in every run however short
    (priced by their average, a 1-epoch run read 5x the share of a 10-epoch one). A run with
    one epoch keeps only its fixed part, its epoch priced at the share learned before, if any;
    else, and for a distilled student with its controls (trained apart, each at its own pace),
    its trainings' own seconds (``fit_seconds``, ``controls_fit_seconds``) over its epochs
    give the share. Its `files` (a search trial's, the side-by-side timing's reference among them; a
    trial trains its model alone) are priced at `trial_file_s` each; the rest is its fixed
    part. The next run's `price_of` prices it with both. A run without its trainings' seconds
    keeps its epochs at the guess (`WRAPPED_EPOCH_SHARE`).
    """
    if data.costs is None or made is None:
        return
    epochs = int(made.params.get("epochs_run") or 0) * (1 if files else trainings(cfg))
    fit_s = made.metrics.get("fit_seconds")
    steady_s = made.metrics.get("steady_epoch_seconds")
    alone = "controls_fit_seconds" not in made.metrics
    learned = data.costs.epoch_share(name)
    if fit_s is None:
        trained, share = fine_tuning_s(epochs, data.epoch_s, RunPrice(startup_s=0.0)), None
    elif steady_s is not None and alone:
        trained = epochs * steady_s
        share = steady_s / data.epoch_s if data.epoch_s > 0.0 else None
    elif alone and learned is not None:
        trained, share = epochs * learned * data.epoch_s, None
    else:
        trained = fit_s + made.metrics.get("controls_fit_seconds", 0.0)
        share = trained / (epochs * data.epoch_s) if epochs and data.epoch_s > 0.0 else None
    record_cost(data.costs, name, wall_s, trained + files * trial_file_s(data), data.epoch_s,
                epoch_share=share)
