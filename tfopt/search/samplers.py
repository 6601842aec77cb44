"""How a study chooses its points: Optuna samplers, the bisection one of them.

A study (`tfopt.search.study.Search`) asks Optuna for each trial, and the sampler it was made
with proposes the trial's point, as any Optuna sampler does (`BaseSampler.sample_independent`,
`sample_relative`). A knob searched alone is bisected (`BisectionSampler`); knobs that compose
are drawn by Optuna's TPE (`JointSampler`). Beside Optuna's interface, both tell the study what
it needs before it asks: the next round's points as far as they are known (`round_points`: a
bisection knows all of them, TPE only its first point before any trial; a round cut by the time
budget is said with them), and whether a point is left that could change the choice
(`is_open`). Optuna's asks then take the known points in order (`start_round`).

This module imports Optuna: `tfopt.search.study` imports it when a study is opened.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna

from tfopt.search.knob import Joint, Knob, Point
from tfopt.search.trials import Trial

SAMPLER_STARTUP_TRIALS = 2
"""A joint study's trials before its TPE sampler models the objectives (the first point is
`Joint.first`; the next ones are drawn at random): its budget holds a handful of trials."""


class _KnownPoints:
    """A round's points known before it is asked, handed to Optuna's asks in order.

    Each asked trial takes the next known point (None: the sampler's own draw); a trial keeps
    the point it took for every field it suggests.
    """

    _queue: list[Point | None]
    _taken: dict[int, Point | None]

    def start_round(self, points: Sequence[Point | None] = ()) -> None:
        """The points the next asks take, in order."""
        self._queue, self._taken = list(points), {}

    def _known(self, trial: Any) -> Point | None:
        """The point `trial` took (None: the sampler draws it)."""
        if trial.number not in self._taken:
            self._taken[trial.number] = self._queue.pop(0) if self._queue else None
        return self._taken[trial.number]


class BisectionSampler(_KnownPoints, optuna.samplers.BaseSampler):
    """One knob's candidates bisected, assuming a stronger setting is faster and less accurate.

    The open candidates are those between the strongest setting known to keep the budget and
    the weakest known not to; a round tries up to as many as the study asks for, evenly apart
    (the middle, for one). A trial that failed (a crash, an error) says nothing of its
    setting's accuracy: it bounds neither side, and the settings beyond it stay open.

    Args:
        knob: The knob searched.
    """

    name = "bisection"

    def __init__(self, knob: Knob) -> None:
        self.knob = knob
        self.start_round()

    def open_indices(self, trials: Sequence[Trial]) -> list[int]:
        """The untried candidates' indices between the strongest kept and the weakest lost."""
        values = self.knob.values
        tried = {trial.params[self.knob.field]: trial for trial in trials}
        good = [i for i, v in enumerate(values) if v in tried and tried[v].status == "ok"]
        low = max(good, default=-1)
        bad = [i for i, v in enumerate(values) if v in tried and i > low
               and tried[v].status not in ("ok", "failed")]
        high = min(bad, default=len(values))
        return [i for i in range(low + 1, high) if values[i] not in tried]

    def is_open(self, trials: Sequence[Trial]) -> bool:
        """Whether a candidate is left that could still change the choice."""
        return bool(self.open_indices(trials))

    def round_points(self, trials: Sequence[Trial], at_once: int,
                     start_at_first: bool = False) -> list[Point | None]:
        """The next round's settings, `at_once` at most, all known.

        A first round has the knob's `Knob.first` among them when `start_at_first`.
        """
        first = (self.knob.values.index(self.knob.first)
                 if start_at_first and not trials and self.knob.first is not None else None)
        return [{self.knob.field: self.knob.values[index]}
                for index in _spread(self.open_indices(trials), at_once, first)]

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        """None: each field is proposed alone."""
        return {}

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        """None: each field is proposed alone."""
        return {}

    def sample_independent(self, study: Any, trial: Any, param_name: str,
                           param_distribution: Any) -> Any:
        """The round's next setting (`start_round`)."""
        point = self._known(trial)
        if point is None:
            raise RuntimeError(f"the {self.knob.field} bisection was asked beyond its round")
        return point[param_name]


class JointSampler(_KnownPoints, optuna.samplers.TPESampler):
    """Knobs that compose, drawn by Optuna's TPE from the grid of their candidates.

    Its first point is `Joint.first` (each knob's middle); then `SAMPLER_STARTUP_TRIALS` draws
    at random, then TPE's model of the two objectives (multivariate), up to `Joint.trials`.

    Args:
        knob: The knobs searched together.
        seed: The run's seed.
    """

    name = "tpe (optuna, two objectives)"

    def __init__(self, knob: Joint, seed: int = 0) -> None:
        import warnings

        # Multivariate TPE is "experimental" in Optuna's words: said at every study opened.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        super().__init__(seed=seed, multivariate=True, n_startup_trials=SAMPLER_STARTUP_TRIALS)
        self.knob = knob
        self.start_round()

    def is_open(self, trials: Sequence[Trial]) -> bool:
        """Whether trials are left: fewer than `Joint.trials`, and untried points."""
        grid = math.prod(len(knob.values) for knob in self.knob.knobs)
        return len(trials) < min(self.knob.trials, grid)

    def round_points(self, trials: Sequence[Trial], at_once: int,
                     start_at_first: bool = False) -> list[Point | None]:
        """Up to `at_once` points: the first one known before any trial, the others drawn."""
        left = min(self.knob.trials, at_once + len(trials)) - len(trials)
        known: list[Point | None] = [] if trials else [dict(self.knob.first)]
        return (known + [None] * left)[:max(left, 0)]

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        """The known point's fields in the space, else TPE's draw."""
        point = self._known(trial)
        if point is not None:
            return {name: point[name] for name in search_space}
        return super().sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, param_name: str,
                           param_distribution: Any) -> Any:
        """The known point's field, else TPE's draw."""
        point = self._known(trial)
        if point is not None:
            return point[param_name]
        return super().sample_independent(study, trial, param_name, param_distribution)


def sampler_for(knob: Knob | Joint, seed: int = 0) -> BisectionSampler | JointSampler:
    """The sampler of `knob`: a bisection for one knob, TPE for knobs that compose."""
    return JointSampler(knob, seed) if isinstance(knob, Joint) else BisectionSampler(knob)


def _spread(open_: list[int], count: int, first: int | None = None) -> list[int]:
    """`count` of the open candidates' indices, evenly apart (`first` among them, if given)."""
    if first is not None and first in open_:
        return sorted([*_spread([i for i in open_ if i != first], count - 1), first])
    count = min(count, len(open_))
    return sorted({open_[(k + 1) * (len(open_) + 1) // (count + 1) - 1] for k in range(count)})
