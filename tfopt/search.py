"""The strongest compression within the accuracy budget, found by measuring trials on this machine.

A technique declares the knob ``auto`` searches (`Knob`: its config field and its candidate
values, weakest first). A study (Optuna, kept in SQLite in the work folder: a killed run that is
started again resumes it) bisects the candidates: a trial makes the technique's model at one
value, fine-tunes it until it is back within the accuracy budget or hopeless (Optuna's
`ThresholdPruner` reads its validation curve), converts it to int8 and fp32 TFLite, and times
both files holding the machine's benchmark slot (int8 is not faster everywhere: `TRIAL_FORMS`).
A setting is within the budget when its fine-tuned model is on the validation split and one of
its files is too, by the champion's rule (a converted file can lose what its model kept); the
test split is only reported, never chosen on. Assuming that a stronger setting is faster and less
accurate, a setting that stays within the budget moves the lower end up, one that does not the
upper end down; with several workers each round tries as many settings at once. A trial's
figures are those of its fastest file within the budget, by its speed-up over the baseline's
int8 file timed side by side with it; the chosen setting is the fastest trial (within 3%, the
stronger one).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tfopt.artifacts import BenchmarkInputs, ModelArtifact, TrialRef, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.variants import plan_variant

TrialStatus = Literal["ok", "over_budget", "pruned", "failed", "not_applicable"]
TIE_SHARE = 0.03
"""Trials whose times are this close are tied: the stronger setting wins."""
HOPELESS_POINTS = 10.0
"""A trial whose validation accuracy is this far below the target after its warm-up epochs is
stopped (pruned): more fine-tuning would not bring it back."""
WARMUP_EPOCHS = 2
"""Epochs every trial gets before the pruner may stop it."""
TRIAL_FORMS = ("int8", "fp32")
"""The TFLite precisions a trial converts its model to and times. int8 is usually the faster,
not on every CPU and network (a thinned network's fp32 file has run faster than its int8 one:
docs/measurements.md), so a trial counts as its fastest file within the budget."""


@dataclass(frozen=True)
class Knob:
    """A technique's strength that ``auto`` searches.

    Attributes:
        field: Its config field (``fraction``).
        values: The candidate values, weakest first.
        unit: How a value reads in a name or a line (``%`` for shares).
        first: Where the measured runs most often found the answer (None: nowhere in
            particular): a first round tries it when the value is the strongest (nothing
            stronger to find), or when the time left holds fewer rounds than a bisection
            needs (`Search.starts_at_first`); from there the search bisects below it if it is
            over the budget, above it if not.
    """

    field: str
    values: tuple[float, ...]
    unit: str = ""
    first: float | None = None

    def __post_init__(self) -> None:
        if self.first is not None and self.first not in self.values:
            raise ValueError(f"{self.field}: the first value {self.first} is not a candidate")

    @property
    def strongest_first(self) -> bool:
        """Whether the first round tries the strongest value (kept: nothing stronger to try)."""
        return self.first is not None and self.first == self.values[-1]

    @property
    def bisection_rounds(self) -> int:
        """The rounds of one trial a bisection from the middle takes to its answer."""
        return math.ceil(math.log2(len(self.values) + 1))

    def label(self, value: float) -> str:
        """A value as people read it (``62%``, ``6``)."""
        if self.unit == "%":
            return f"{round(value * 100)}%"
        return f"{value:g}"


class TimedFile(BaseModel):
    """One of a trial's files as timed: its p50, its accuracies, its speed-up if measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    p50_ms: float
    val_accuracy: float | None = None
    """On the validation split: what the budget is judged on."""
    test_accuracy: float | None = None
    """On the test split: reported, never chosen on."""
    speedup: float | None = None
    """The baseline's int8 p50 over this file's, the two timed side by side in one process."""


class Trial(BaseModel):
    """One setting tried: its fine-tuned model, its validation accuracy, its files' timings.

    Its `p50_ms`, `test_accuracy` and `speedup` are those of `file`, its fastest file within the
    budget (none within: its most accurate).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str
    value: float
    status: TrialStatus
    val_accuracy: float | None = None
    p50_ms: float | None = None
    file_val_accuracy: float | None = None
    """Its file's accuracy on the validation split, measured when timed (judged on)."""
    test_accuracy: float | None = None
    """Its file's accuracy on the test split, measured when timed (reported only)."""
    speedup: float | None = None
    """The baseline's int8 p50 over its file's, the two timed side by side in one process
    (None: no reference, or not within the budget)."""
    file: str | None = None
    """The file these figures are of (``channels-62-tflite-fp32``)."""
    epochs_run: int = 0
    seconds: float = 0.0
    model: ModelArtifact | None = None
    files: tuple[VariantSpec, ...] = ()
    """Its TFLite files, one per `TRIAL_FORMS` precision."""
    timed: tuple[TimedFile, ...] = ()
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """The trial as the summary lists it (``search.<technique>.trials``)."""
        return {"params": {self.field: self.value}, "val_accuracy": self.val_accuracy,
                "file_val_accuracy": self.file_val_accuracy,
                "test_accuracy": self.test_accuracy, "p50_ms": self.p50_ms,
                "speedup": self.speedup, "file": self.file, "status": self.status,
                "epochs_run": self.epochs_run, "seconds": round(self.seconds, 1),
                "files": [timed.model_dump() for timed in self.timed], "error": self.error}


def study_key(technique: str, knob: Knob, baseline: ModelArtifact, settings: dict[str, Any],
              targets: tuple[float | None, float | None]) -> str:
    """The study's name: the same baseline file, settings and targets resume the same study.

    `TRIAL_FORMS` is part of it: a study whose trials timed other files is not resumed.
    """
    digest = hashlib.sha256(baseline.path.read_bytes() if baseline.path.is_file()
                            else str(baseline.path).encode()).hexdigest()[:12]
    parts = json.dumps([technique, knob.field, knob.values, digest, settings, *targets,
                        TRIAL_FORMS],
                       sort_keys=True, default=str)
    return f"{technique}-{hashlib.sha256(parts.encode()).hexdigest()[:16]}"


class Search:
    """A technique's study: the trials made so far, which to try next, and the choice.

    Args:
        knob: The knob searched.
        folder: Where the study (``study.db``) and the trials' models are kept.
        key: The study's name (`study_key`).
        target: The validation accuracy a setting must keep (None: every setting does).
        file_target: The validation accuracy one of its files must keep (None: not checked).
    """

    def __init__(self, knob: Knob, folder: Path, key: str, target: float | None,
                 file_target: float | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        folder.mkdir(parents=True, exist_ok=True)
        self.knob, self.folder, self.key, self.target = knob, folder, key, target
        self.file_target = file_target
        self.storage = f"sqlite:///{folder / 'study.db'}"
        lower = -1.0 if target is None else target - HOPELESS_POINTS / 100.0
        self.study = optuna.create_study(
            study_name=key, storage=self.storage, load_if_exists=True, direction="minimize",
            pruner=optuna.pruners.ThresholdPruner(lower=lower, n_warmup_steps=WARMUP_EPOCHS))
        self._running: dict[float, Any] = {}
        self._round_started: float | None = None
        self._round_seconds = 0.0
        self.cut: str | None = None
        self.expected_round_s: float | None = None
        """How long a round is expected to take before any has (the searches run before it)."""

    def trials(self) -> list[Trial]:
        """The finished trials, in the order they were made (a resumed study's included)."""
        return [Trial.model_validate_json(t.user_attrs["trial"]) for t in self.study.trials
                if "trial" in t.user_attrs]

    def next_values(self, at_once: int = 1, deadline: float | None = None) -> list[float]:
        """The settings to try next (none: the search is over), up to `at_once` of them.

        The candidates between the strongest setting known to keep the budget and the weakest
        known not to are split evenly (a first round: with the knob's `Knob.first` among them
        when `starts_at_first`). A round that would end after `deadline` (a `time.time()`
        value), as long as the slowest one took, is not started, nor a first one once it has
        passed (`cut` says so).
        """
        tried = len(self.trials())
        open_ = self._open()
        if not open_:
            return []
        if deadline is not None and time.time() + (self._round_seconds if tried else 0.0) > (
                deadline):
            self.cut = (f"the {self.knob.field} search stopped after {tried} trials (time "
                        "budget)" if tried else
                        f"the {self.knob.field} search was not started (time budget)")
            return []
        self._round_started = time.monotonic()
        first = (self.knob.values.index(self.knob.first)
                 if not tried and self.starts_at_first(deadline) else None)
        return [self.knob.values[i] for i in _spread(open_, at_once, first)]

    def starts_at_first(self, deadline: float | None) -> bool:
        """Whether the first round tries the knob's `Knob.first` rather than the middle.

        Always for the strongest value; for another, when the time left before `deadline`
        holds fewer rounds than a bisection takes, each as long as `expected_round_s` (none
        known: the middle). A short window may hold one trial after the first, and the
        middle is then all it tries.
        """
        knob = self.knob
        if knob.first is None or knob.strongest_first:
            return knob.strongest_first
        if deadline is None or not self.expected_round_s:
            return False
        return deadline - time.time() < knob.bisection_rounds * self.expected_round_s

    @property
    def round_seconds(self) -> float | None:
        """Its longest round, once a trial was fine-tuned to its end (None: none was)."""
        trained = any(trial.status in ("ok", "over_budget") for trial in self.trials())
        return self._round_seconds if trained and self._round_seconds else None

    def is_open(self) -> bool:
        """Whether settings are left that could still change the choice."""
        return bool(self._open())

    def _open(self) -> list[int]:
        """The untried candidates' indices between the strongest kept and the weakest lost."""
        values = self.knob.values
        tried = {trial.value: trial for trial in self.trials()}
        good = [i for i, v in enumerate(values) if v in tried and tried[v].status == "ok"]
        low = max(good, default=-1)
        bad = [i for i, v in enumerate(values) if v in tried and i > low
               and tried[v].status != "ok"]
        high = min(bad, default=len(values))
        return [i for i in range(low + 1, high) if values[i] not in tried]

    def trial_folder(self, value: float) -> Path:
        """Where the trial of one setting keeps its model and files."""
        return self.folder / f"trial-{value:g}"

    def start(self, value: float) -> TrialRef:
        """Open the Optuna trial of one setting; its fine-tuning reports to it."""
        self.study.enqueue_trial({self.knob.field: value})
        optuna_trial = self.study.ask()
        optuna_trial.suggest_categorical(self.knob.field, list(self.knob.values))
        self._running[value] = optuna_trial
        return TrialRef(storage=self.storage, study=self.key, number=optuna_trial.number,
                        trial_id=optuna_trial._trial_id)

    def finish(self, trial: Trial) -> None:
        """Close a setting's Optuna trial with what it measured."""
        import optuna

        optuna_trial = self._running.pop(trial.value)
        if not self._running and self._round_started is not None:
            # A round lasts until its last trial is told: a search resumed after others ran
            # (depth pruning's bisection) is not charged for their time.
            self._round_seconds = max(self._round_seconds,
                                      time.monotonic() - self._round_started)
        optuna_trial.set_user_attr("trial", trial.model_dump_json())
        if trial.status == "pruned":
            self.study.tell(optuna_trial, state=optuna.trial.TrialState.PRUNED)
        elif trial.status == "failed" or trial.p50_ms is None:
            self.study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(optuna_trial, 1.0 / trial.speedup if trial.speedup
                            else trial.p50_ms)

    def chosen(self) -> Trial | None:
        """The fastest trial within the budget; within `TIE_SHARE`, the stronger setting."""
        return choose(self.trials(), self.knob)


def _spread(open_: list[int], count: int, first: int | None = None) -> list[int]:
    """`count` of the open candidates' indices, evenly apart (`first` among them, if given)."""
    if first is not None and first in open_:
        return sorted([*_spread([i for i in open_ if i != first], count - 1), first])
    count = min(count, len(open_))
    return sorted({open_[(k + 1) * (len(open_) + 1) // (count + 1) - 1] for k in range(count)})


def choose(trials: Sequence[Trial], knob: Knob) -> Trial | None:
    """The fastest trial within the budget; within `TIE_SHARE` of it, the strongest one.

    Fastest by the speed-up over the baseline's int8 file timed side by side when every trial
    within the budget has one, else by the p50s of their own turns, minutes apart.
    """
    kept = [t for t in trials if t.status == "ok" and t.p50_ms is not None]
    if not kept:
        return None
    if all(t.speedup for t in kept):
        times = {t.value: 1.0 / t.speedup for t in kept}
    else:
        times = {t.value: t.p50_ms for t in kept}
    fastest = min(times.values())
    tied = [t for t in kept if times[t.value] <= fastest * (1.0 + TIE_SHARE)]
    return max(tied, key=lambda t: knob.values.index(t.value))


def within_budget(val_accuracy: float | None, target: float | None) -> bool:
    """Whether a trial's validation accuracy keeps the budget (no target: it does)."""
    return target is None or (val_accuracy is not None and val_accuracy >= target)


def trial_status(pruned: bool, val_accuracy: float | None,
                 target: float | None) -> TrialStatus:
    """A fine-tuned trial's verdict before timing: pruned, over the budget, or ok."""
    if pruned:
        return "pruned"
    return "ok" if within_budget(val_accuracy, target) else "over_budget"


def trial_protocol(protocol: MeasurementProtocol) -> MeasurementProtocol:
    """The benchmark protocol, shortened for a trial's quick p50 (the run's full one follows)."""
    return protocol.as_protocol().model_copy(update={
        "min_seconds": min(protocol.min_seconds, 0.5),
        "max_seconds": min(protocol.max_seconds, 2.0),
        "thread_sweep": False, "scenarios": ["single_stream"]})


def time_files(trial: Trial, inputs: BenchmarkInputs, protocol: MeasurementProtocol,
               file_target: float | None = None, reference: VariantSpec | None = None) -> Trial:
    """A trial with its files' p50s and accuracies, timed holding the benchmark slot.

    Training may overlap another trial's; timing may not (`tfopt.orchestration.benchmark_slot`).
    A file that cannot be timed is left out with the reason (none left: the trial failed). A
    file is within the budget when its accuracy on the validation split keeps `file_target`,
    however its model's read; given the baseline's int8 file (`reference`), the trial's files
    within the budget are then timed side by side with it in one process
    (`tfopt.measurement.runoff`) for their speed-ups: a measuring process now and then runs
    slow its whole life, which would make a stronger setting look slower than a weaker one. The
    trial's figures are then its fastest file's (`with_timed_files`).
    """
    from tfopt.logs import step_logger

    if trial.status == "pruned" or not trial.files:
        return trial
    built = [spec for spec in trial.files if spec.status == "ok" and spec.path is not None]
    errors = [f"{spec.name}: {spec.error}" for spec in trial.files if spec not in built]
    timed: list[TimedFile] = []
    if built:
        try:
            timed, untimed = _timed_in_slot(trial, built, inputs, trial_protocol(protocol),
                                            file_target, reference)
            errors += untimed
        except (RuntimeError, OSError, ValueError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    if not timed:
        return trial.model_copy(update={"status": "failed", "error": "; ".join(errors)[:500]})
    result = with_timed_files(trial, timed, file_target)
    if errors:
        step_logger().warning("%s=%g: not timed: %s", trial.field, trial.value, "; ".join(errors))
        result = result.model_copy(update={"error": "; ".join(
            [*filter(None, [result.error]), *(f"not timed: {e}" for e in errors)])[:500]})
    return result


def _timed_in_slot(trial: Trial, built: list[VariantSpec], inputs: BenchmarkInputs,
                   protocol: MeasurementProtocol, file_target: float | None,
                   reference: VariantSpec | None) -> tuple[list[TimedFile], list[str]]:
    """`built` timed holding the benchmark slot, those within the budget beside `reference`.

    Returns:
        The files timed, and why the others could not be.
    """
    from tfopt.orchestration import benchmark_slot

    timed: list[TimedFile] = []
    kept: list[VariantSpec] = []
    errors: list[str] = []
    with benchmark_slot(built[0].name):
        for spec in built:
            figures = _timed_file(spec, inputs, protocol)
            if isinstance(figures, str):
                errors.append(figures)
                continue
            timed.append(figures)
            if keeps(figures, file_target):
                kept.append(spec)
        if trial.status == "ok" and kept and reference is not None:
            timed = with_speedups(timed, kept, reference, inputs, protocol)
    return timed, errors


def _timed_file(spec: VariantSpec, inputs: BenchmarkInputs,
                protocol: MeasurementProtocol) -> TimedFile | str:
    """One file's p50 and accuracies, or why it could not be timed."""
    from tfopt.logs import step_logger
    from tfopt.measurement.isolation import measure

    try:
        measured = measure(spec, inputs, protocol, step_logger())
    except (RuntimeError, OSError, ValueError) as error:
        return f"{spec.name}: {type(error).__name__}: {error}"
    return TimedFile(name=spec.name, p50_ms=measured.latency_ms.p50,
                     val_accuracy=measured.val_accuracy, test_accuracy=measured.accuracy)


def keeps(timed: TimedFile, file_target: float | None) -> bool:
    """Whether a timed file's validation accuracy keeps `file_target` (unmeasured: it does)."""
    return file_target is None or timed.val_accuracy is None or (
        timed.val_accuracy >= file_target)


def with_speedups(timed: list[TimedFile], specs: list[VariantSpec], reference: VariantSpec,
                  inputs: BenchmarkInputs, protocol: MeasurementProtocol) -> list[TimedFile]:
    """`timed` with the speed-ups of `specs` over `reference`, all timed in one process.

    A failure to time them leaves them without one (the search then compares p50s).
    """
    from tfopt.logs import step_logger
    from tfopt.measurement.runoff import side_by_side_in_worker

    try:
        runoff = side_by_side_in_worker([*specs, reference], inputs, protocol)
    except (RuntimeError, OSError, ValueError) as error:
        step_logger().warning("%s could not be timed side by side with %s: %s",
                              ", ".join(spec.name for spec in specs), reference.name, error)
        return timed
    speedups = {spec.name: round(runoff.ratio(reference.name, spec.name), 4)
                for spec in specs}
    step_logger().info("%s, side by side", "; ".join(
        f"{name}: {speedup:.2f}x {reference.name}'s speed" for name, speedup in speedups.items()))
    return [figures.model_copy(update={"speedup": speedups.get(figures.name)})
            for figures in timed]


def with_timed_files(trial: Trial, timed: Sequence[TimedFile],
                     file_target: float | None) -> Trial:
    """`trial` with its files' figures; its own, those of its fastest file within the budget.

    Fastest by the speed-up over the baseline's int8 file when every file within the budget has
    one, else by p50. With no file within the budget, a trial its model's validation had kept
    is over the budget, and its figures are its most accurate file's.
    """
    kept = [figures for figures in timed if keeps(figures, file_target)]
    if kept and all(figures.speedup for figures in kept):
        best = max(kept, key=lambda figures: figures.speedup or 0.0)
    elif kept:
        best = min(kept, key=lambda figures: figures.p50_ms)
    else:
        best = max(timed, key=lambda figures: figures.val_accuracy or 0.0)
    update: dict[str, Any] = {"timed": tuple(timed), "file": best.name, "p50_ms": best.p50_ms,
                              "file_val_accuracy": best.val_accuracy,
                              "test_accuracy": best.test_accuracy, "speedup": best.speedup}
    if not kept and trial.status == "ok":
        accuracies = ", ".join(f"{figures.name} {figures.val_accuracy:.4f}" for figures in timed)
        update |= {"status": "over_budget",
                   "error": f"its files' validation accuracy ({accuracies}) is below "
                            f"{file_target:.4f} (the baseline's less the budget)"}
    return trial.model_copy(update=update)


def baseline_int8(variants: Sequence[VariantSpec], baseline: str) -> VariantSpec | None:
    """The baseline's int8 TFLite file among its built `variants` (None: not built)."""
    name = plan_variant(baseline, "tflite", "int8").name
    return next((v for v in variants if v.name == name and v.status == "ok"
                 and v.path is not None), None)


def trial_of(state: Any, search: Search, value: float) -> Trial:
    """A trial task's outcome: its trial, or a failed one with the task's error."""
    if state.is_completed():
        return state.result()
    error = state.result(raise_on_failure=False)
    return Trial(field=search.knob.field, value=value, status="failed",
                 error=f"{type(error).__name__}: {error}"[:500] if isinstance(
                     error, BaseException) else str(error)[:500])


def search_line(search: Search) -> str:
    """The trials in one line, strongest last, and the choice."""
    knob = search.knob
    parts = []
    for trial in sorted(search.trials(), key=lambda t: knob.values.index(t.value)):
        accuracy = f" val {trial.val_accuracy:.4f}" if trial.val_accuracy is not None else ""
        if trial.file_val_accuracy is not None:
            accuracy += f" file {trial.file_val_accuracy:.4f}"
        timing = f" {trial.p50_ms:.4f} ms" if trial.p50_ms is not None else ""
        if trial.speedup is not None:
            timing += f" ({trial.speedup:.2f}x side by side)"
        if trial.file is not None and trial.p50_ms is not None:
            timing += f" {trial.file.rsplit('-', 1)[-1]}"
        parts.append(f"{knob.label(trial.value)} {trial.status}{accuracy}{timing}")
    chosen = search.chosen()
    return (f"{knob.field}: " + ", ".join(parts or ["no trial"])
            + f" -> {knob.label(chosen.value) if chosen else 'none within the budget'}")


def search_summary(search: Search) -> dict[str, Any]:
    """A search as the summary holds it (``search.<technique>``): trials and the choice."""
    chosen = search.chosen()
    return {"knob": search.knob.field,
            "target_val_accuracy": search.target,
            "target_file_val_accuracy": search.file_target,
            "target_test_accuracy": None,  # a contract key kept: nothing is chosen on test
            "cut": search.cut,
            "trials": [trial.summary() for trial in search.trials()],
            "chosen": None if chosen is None else chosen.value}
