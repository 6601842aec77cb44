"""A technique's study: Optuna's, kept in the work folder, the bisection it runs, the choice."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfopt.artifacts import ModelArtifact, TrialRef
from tfopt.budget import Clock
from tfopt.search.knob import Knob
from tfopt.search.trials import TRIAL_FORMS, Trial

TIE_SHARE = 0.03
"""Trials whose times are this close are tied: the stronger setting wins."""
HOPELESS_POINTS = 10.0
"""A trial whose validation accuracy is this far below the target after its warm-up epochs is
stopped (pruned): more fine-tuning would not bring it back."""
WARMUP_EPOCHS = 2
"""Epochs every trial gets before the pruner may stop it."""


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
        if not Clock(deadline=deadline).can_start(self._round_seconds if tried else 0.0):
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
        return not Clock(deadline=deadline).can_start(
            knob.bisection_rounds * self.expected_round_s)

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
