"""A technique's study: Optuna's, kept in the work folder, the points it tries, the choice.

One study whatever is searched (`Search`): two objectives (a trial's file's validation
accuracy, its time beside the baseline's int8 file), Optuna keeping the trials, and a sampler
behind Optuna's interface proposing each point (`tfopt.search.samplers`: one knob bisected,
knobs that compose drawn by TPE). The plan (`compress.planner`) drives every study through
the same methods.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfopt.artifacts import Cut, ModelArtifact, TrialRef
from tfopt.schedule.budget import Clock
from tfopt.search.knob import Joint, Knob, Point, Space
from tfopt.search.trials import TRIAL_FORMS, Trial

TIE_SHARE = 0.03
"""Trials whose times are this close are tied: the stronger setting wins."""
HOPELESS_POINTS = 10.0
"""A trial whose validation accuracy is this far below the target after its warm-up epochs is
stopped (pruned): more fine-tuning would not bring it back."""
TREND_EPOCHS = 3
"""Epochs whose gain a trial this far below is judged by before its warm-up ends: one that
would not reach the target by its epoch cap even at that gain is stopped then
(`tfopt.models.training.HopelessRule`)."""
WARMUP_EPOCHS = 2
"""Epochs every trial gets before the pruner may stop it."""
WARMUP_SHARE = 0.25
"""The share of its epoch cap after which a trial this far below is stopped however it moves
(sooner only by `TREND_EPOCHS`' rule), where that is more than `WARMUP_EPOCHS`: a residual
network's model with 62.5% of its filters removed was below 0.80 after 3 epochs in one run and
back within the budget (0.98) by its 49th in another (docs/measurements.md)."""
DUPLICATE_ASKS = 20
"""Points a sampler may propose beyond a round's that were tried already before the search
ends (TPE repeats itself on a small grid)."""


def study_key(technique: str, knob: Space, baseline: ModelArtifact, settings: dict[str, Any],
              targets: tuple[float | None, float | None],
              forms: tuple[str, ...] = TRIAL_FORMS) -> str:
    """The study's name: the same baseline file, settings and targets resume the same study.

    The `forms` its trials time are part of it: a study whose trials timed other files is not
    resumed.
    """
    digest = hashlib.sha256(baseline.path.read_bytes() if baseline.path.is_file()
                            else str(baseline.path).encode()).hexdigest()[:12]
    candidates = [[k.field, k.values] for k in knob.knobs]
    parts = json.dumps([technique, candidates, digest, settings, *targets, forms, 3],
                       sort_keys=True, default=str)
    return f"{technique}-{hashlib.sha256(parts.encode()).hexdigest()[:16]}"


def point_key(point: Point) -> tuple[tuple[str, float], ...]:
    """A point as a dictionary key."""
    return tuple(sorted(point.items()))


class Search:
    """A technique's study: the trials made so far, which to try next, the choice.

    One study whatever is searched: Optuna keeps the trials in SQLite (a killed run resumes
    them), its two objectives are a trial's file's validation accuracy as the champion is
    judged (to maximize) and its time relative to `baseline-tflite-int8`'s, timed side by side
    (to minimize), and its sampler proposes each point (`tfopt.search.samplers`: a bisection
    for one knob, TPE for knobs that compose). A trial's fine-tuning stops itself once
    hopeless, by the rule the study keeps (`_with_hopeless_rule`): Optuna cannot prune a
    multi-objective study's trials. The chosen point is the fastest trial within the accuracy
    budget (`choose`).

    Args:
        knob: What is searched.
        folder: Where the study (``study.db``) and the trials' models are kept.
        key: The study's name (`study_key`).
        target: The validation accuracy a setting must keep (None: every setting does).
        file_target: The validation accuracy one of its files must keep (None: not checked).
        seed: The run's seed (a sampler's).
        metric: What its "accuracies" are scores of, on array data (the run's
            `tfopt.eval.metrics.Metric`: an error negated, `tfopt.search.trials.scored`); None:
            top-1 accuracy. The hopeless rule, in accuracy points, is kept for accuracy alone.
    """

    def __init__(self, knob: Space, folder: Path, key: str, target: float | None,
                 file_target: float | None = None, seed: int = 0, metric: Any = None) -> None:
        import optuna

        from tfopt.search.samplers import sampler_for

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        folder.mkdir(parents=True, exist_ok=True)
        self.knob, self.folder, self.key, self.target = knob, folder, key, target
        self.file_target, self.metric = file_target, metric
        self.storage = f"sqlite:///{folder / 'study.db'}"
        self.sampler = sampler_for(knob, seed)
        self.study = self._with_hopeless_rule(optuna.create_study(
            study_name=key, storage=self.storage, load_if_exists=True,
            directions=["maximize", "minimize"], sampler=self.sampler))
        self._running: dict[tuple[tuple[str, float], ...], Any] = {}
        self._round_started: float | None = None
        self._round_seconds = 0.0
        self._exhausted = False
        self.cut: Cut | None = None
        """What the time budget cut of it (`next_trials`), if anything."""
        self.cut_points: list[Point] = []
        """The settings the round it cut would have tried, as far as they are known."""
        self.expected_round_s: float | None = None
        """How long a round is expected to take before any has (the searches run before it)."""

    @property
    def hopeless_below(self) -> float:
        """The validation accuracy below which a fine-tuning past its warm-up is stopped."""
        return -1.0 if self.target is None else self.target - HOPELESS_POINTS / 100.0

    def _with_hopeless_rule(self, study: Any) -> Any:
        """`study` with the rule a trial's fine-tuning stops on, where that process reads it.

        The fine-tuning opens the study by name (`tfopt.models.training.ReportToTrial`) and
        reads the rule from its user attributes.
        """
        if self.metric is not None:  # its points are accuracy's
            return study
        study.set_user_attr("hopeless_below", self.hopeless_below)
        study.set_user_attr("warmup_epochs", WARMUP_EPOCHS)
        study.set_user_attr("warmup_share", WARMUP_SHARE)
        study.set_user_attr("target", self.target)
        study.set_user_attr("trend_epochs", TREND_EPOCHS)
        return study

    def trials(self) -> list[Trial]:
        """The finished trials, in the order they were made (a resumed study's included)."""
        return [Trial.model_validate_json(t.user_attrs["trial"]) for t in self.study.trials
                if "trial" in t.user_attrs]

    def next_trials(self, at_once: int = 1,
                    deadline: float | None = None) -> list[tuple[Point, TrialRef]]:
        """The points to try next, each with its opened Optuna trial (none: the search is over).

        Up to `at_once` of them. A round that would end after `deadline` (a `time.time()`
        value), as long as the slowest one took, is not started, nor a first one once it has
        passed (`cut` says so, `cut_points` what it would have tried).
        """
        tried = self.trials()
        if not self.is_open():
            return []
        points = self.sampler.round_points(tried, at_once, self.starts_at_first(deadline))
        if not Clock(deadline=deadline).can_start(self._round_seconds if tried else 0.0):
            search = f"the {self.knob.field} search"
            self.cut = Cut(step=search, kind="shortened" if tried else "not_started",
                           reason=(f"{search} stopped after {len(tried)} trials (time budget)"
                                   if tried else f"{search} was not started (time budget)"))
            self.cut_points = [point for point in points if point is not None]
            return []
        self.cut, self.cut_points = None, []  # a round that starts undoes an earlier cut
        self._round_started = time.monotonic()
        opened = self._ask(points)
        for point, optuna_trial in opened:
            self._running[point_key(point)] = optuna_trial
        return [(point, TrialRef(storage=self.storage, study=self.key,
                                 number=optuna_trial.number, trial_id=optuna_trial._trial_id))
                for point, optuna_trial in opened]

    def _ask(self, points: list[Point | None]) -> list[tuple[Point, Any]]:
        """A trial asked of the study for each of the round's points (None: the sampler's).

        A point the sampler proposes that was tried already is told again and another asked,
        `DUPLICATE_ASKS` times at most; a round that opens nothing ends the search.
        """
        self.sampler.start_round(points)
        opened: list[tuple[Point, Any]] = []
        asks = 0
        while len(opened) < len(points) and asks < len(points) + DUPLICATE_ASKS:
            asks += 1
            optuna_trial = self.study.ask()
            point = {knob.field: float(optuna_trial.suggest_categorical(
                knob.field, list(knob.values))) for knob in self.knob.knobs}
            if self._told_again(optuna_trial, point, opened):
                continue
            opened.append((point, optuna_trial))
        self._exhausted = not opened
        return opened

    def _told_again(self, optuna_trial: Any, point: Point,
                    opened: list[tuple[Point, Any]]) -> bool:
        """Whether `point` was tried or is being tried: its trial is then told and closed.

        A point tried before is told its figures again (the sampler learns nothing new, and
        asks elsewhere); one being tried in this round fails the duplicate ask.
        """
        import optuna

        key = point_key(point)
        earlier = next((t for t in self.study.trials if t.state.is_finished()
                        and "trial" in t.user_attrs and point_key(t.params) == key), None)
        if earlier is not None and earlier.values is not None:
            self.study.tell(optuna_trial, earlier.values)
            return True
        if earlier is not None or key in self._running or any(
                point_key(other) == key for other, _ in opened):
            self.study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
            return True
        return False

    def starts_at_first(self, deadline: float | None) -> bool:
        """Whether a knob's first round tries its `Knob.first` rather than the middle.

        Always for the strongest value; for another, when the time left before `deadline`
        holds fewer rounds than a bisection takes, each as long as `expected_round_s` (none
        known: the middle). A short window may hold one trial after the first, and the
        middle is then all it tries. Never for knobs that compose (their sampler's first
        point is `Joint.first`).
        """
        knob = self.knob
        if not isinstance(knob, Knob) or knob.first is None or knob.strongest_first:
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
        """Whether points are left that could still change the choice."""
        return not self._exhausted and self.sampler.is_open(self.trials())

    def paid_per_second(self) -> float:
        """The speed-up its best trial within the budget bought over 1x, per second of trials.

        Zero while no trial kept the budget; the searches deepen in this order.
        """
        trials = self.trials()
        best = max((t.speedup or 1.0 for t in trials if t.status == "ok"), default=1.0)
        return (best - 1.0) / max(sum(t.seconds for t in trials), 1.0)

    def deepening_key(self) -> tuple[float, float]:
        """Its place when the searches deepen, the first highest.

        What it paid per second (`paid_per_second`); among those that paid nothing yet, the
        fastest any of its trials was side by side, over the budget too: a knob none of whose
        trials came back fast enough to time (each stopped as hopeless) is deepened last, not
        first because its technique was planned first.
        """
        seen = max((t.speedup or 1.0 for t in self.trials()
                    if t.status in ("ok", "over_budget")), default=1.0)
        return self.paid_per_second(), seen

    def trial_folder(self, point: Point) -> Path:
        """Where the trial of one point keeps its model and files."""
        return self.folder / ("trial-" + "-".join(f"{point[field]:g}"
                                                  for field in self.knob.fields))

    def finish(self, trial: Trial) -> None:
        """Close a point's Optuna trial with what it measured."""
        optuna_trial = self._running.pop(point_key(trial.params))
        if not self._running and self._round_started is not None:
            # A round lasts until its last trial is told: a search resumed after others ran
            # (depth pruning's bisection) is not charged for their time.
            self._round_seconds = max(self._round_seconds,
                                      time.monotonic() - self._round_started)
        optuna_trial.set_user_attr("trial", trial.model_dump_json())
        self._tell(optuna_trial, trial)

    def _tell(self, optuna_trial: Any, trial: Trial) -> None:
        """Tell the study a trial's end: pruned, failed (or not timed), or its objectives."""
        import optuna

        values = None if trial.status in ("pruned", "failed") else self._objectives(trial)
        if trial.status == "pruned":
            self.study.tell(optuna_trial, state=optuna.trial.TrialState.PRUNED)
        elif values is None:
            self.study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(optuna_trial, values)

    @staticmethod
    def _objectives(trial: Trial) -> list[float] | None:
        """Its file's validation accuracy and its time over the baseline's int8 file's.

        Both timed side by side (None: not timed beside it).
        """
        if trial.speedup is None:
            return None
        accuracy = (trial.file_val_accuracy if trial.file_val_accuracy is not None
                    else trial.val_accuracy)
        return [accuracy or 0.0, 1.0 / trial.speedup]

    def front(self) -> list[Trial]:
        """The trials on the study's Pareto front (`study.best_trials`), over the budget too."""
        return [Trial.model_validate_json(t.user_attrs["trial"]) for t in self.study.best_trials
                if "trial" in t.user_attrs]

    def chosen(self) -> Trial | None:
        """The fastest trial within the budget; within `TIE_SHARE`, the stronger setting."""
        return choose(self.trials(), self.knob)


def open_study(knob: Space, folder: Path, key: str, target: float | None,
               file_target: float | None = None, seed: int = 0, metric: Any = None) -> Search:
    """The study of `knob`, with its sampler: a bisection for one knob, TPE for more."""
    return Search(knob, folder, key, target, file_target, seed, metric)


def choose(trials: Sequence[Trial], knob: Space) -> Trial | None:
    """The fastest trial within the budget; within `TIE_SHARE` of it, the strongest one.

    Fastest by the speed-up over the baseline's int8 file timed side by side when every trial
    within the budget has one, else by the p50s of their own turns, minutes apart.
    """
    kept = [t for t in trials if t.status == "ok" and t.p50_ms is not None]
    if not kept:
        return None
    by_speedup = all(t.speedup for t in kept)
    times = [1.0 / t.speedup if by_speedup and t.speedup else t.p50_ms or 0.0 for t in kept]
    fastest = min(times)
    tied = [t for t, seconds in zip(kept, times, strict=True)
            if seconds <= fastest * (1.0 + TIE_SHARE)]
    return max(tied, key=lambda t: knob.strength(t.params))


def trial_of(state: Any, search: Search, point: Point) -> Trial:
    """A trial task's outcome: its trial, or a failed one with the task's error."""
    if state.is_completed():
        return state.result()
    error = state.result(raise_on_failure=False)
    return Trial(params=point, status="failed",
                 error=f"{type(error).__name__}: {error}"[:500] if isinstance(
                     error, BaseException) else str(error)[:500])


def search_line(search: Search) -> str:
    """The trials in one line, strongest last, the choice, and the accuracies to keep.

    A trial's model is read on the split its fine-tuning chose on (``held-out``), its file on
    validation (``file val``).
    """
    knob, metric = search.knob, search.metric
    name = "" if metric is None else f"{metric.name} "

    def read(score: float) -> float:  # as the metric reads (a score turned back)
        return score if metric is None else metric.oriented(score)

    parts = []
    for trial in sorted(search.trials(), key=lambda t: knob.strength(t.params)):
        accuracy = (f" held-out {name}{read(trial.val_accuracy):.4f}"
                    if trial.val_accuracy is not None else "")
        if trial.file_val_accuracy is not None:
            accuracy += f" file val {name}{read(trial.file_val_accuracy):.4f}"
        timing = f" {trial.p50_ms:.4f} ms" if trial.p50_ms is not None else ""
        if trial.speedup is not None:
            timing += f" ({trial.speedup:.2f}x side by side)"
        if trial.file is not None and trial.p50_ms is not None:
            timing += f" {trial.file.rsplit('-', 1)[-1]}"
        parts.append(f"{knob.point_label(trial.params)} {trial.status}{accuracy}{timing}")
    chosen = search.chosen()
    keep = [f"{split} {name}{read(value):.4f}"
            for split, value in (("held-out", search.target), ("file val", search.file_target))
            if value is not None]
    return (f"{knob.field}: " + ", ".join(parts or ["no trial"])
            + f" -> {knob.point_label(chosen.params) if chosen else 'none within the budget'}"
            + (f" (to keep: {', '.join(keep)})" if keep else ""))


def search_summary(search: Search) -> dict[str, Any]:
    """A search as the summary holds it (``search.<technique>``): trials and the choice.

    ``chosen`` is the chosen value of a knob searched alone, the chosen point (each field's
    value) of a joint search; ``front`` a joint study's Pareto front (its points).
    """
    chosen = search.chosen()
    point = None if chosen is None else chosen.params
    return {"knob": search.knob.field,
            "sampler": search.sampler.name,
            "target_val_accuracy": search.target,
            "target_file_val_accuracy": search.file_target,
            "target_test_accuracy": None,  # a contract key kept: nothing is chosen on test
            "cut": None if search.cut is None else search.cut.reason,
            "trials": [trial.summary() for trial in search.trials()],
            "front": ([dict(t.params) for t in search.front()]
                      if isinstance(search.knob, Joint) else None),
            "chosen": (point if isinstance(search.knob, Joint) or point is None
                       else point[search.knob.field])}
