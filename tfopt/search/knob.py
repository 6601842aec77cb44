"""What ``auto`` searches: a technique's strength (`Knob`), or strengths that compose (`Joint`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

Point = dict[str, float]
"""One setting of a search: each searched field's value (``{"fraction": 0.5}``)."""


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
    def fields(self) -> tuple[str, ...]:
        """The config fields it sets (one)."""
        return (self.field,)

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """Itself, as a `Joint` lists its knobs."""
        return (self,)

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

    def strength(self, point: Point) -> tuple[int, ...]:
        """How strong a setting is (its candidate's index): ties go to the stronger."""
        return (self.values.index(point[self.field]),)

    def point_label(self, point: Point) -> str:
        """A setting as people read it."""
        return self.label(point[self.field])


@dataclass(frozen=True)
class Joint:
    """Strengths that compose on one model, searched together by an Optuna sampler.

    Channel pruning's share of filters and depth pruning's share of residual blocks both
    shorten one network's time, and each changes what the other costs in accuracy: one knob
    searched after the other fixes the first before the second is known. A joint study tries
    points of the grid their candidates make, as a two-objective study (validation accuracy,
    time), and chooses on its Pareto front (`tfopt.search.Search`).

    Attributes:
        knobs: The knobs, each with its field and candidates.
        trials: The most trials a search makes (the grid is larger than a budget holds).
    """

    knobs: tuple[Knob, ...]
    trials: int = 8

    @property
    def field(self) -> str:
        """The fields as one name (``fraction+share``)."""
        return "+".join(self.fields)

    @property
    def fields(self) -> tuple[str, ...]:
        """The config fields it sets, one per knob."""
        return tuple(knob.field for knob in self.knobs)

    @property
    def first(self) -> Point:
        """The first point tried: each knob's middle candidate.

        The sampler's random draws follow; a knob's own `Knob.first` is where it was found
        searched alone, not together.
        """
        return {knob.field: knob.values[(len(knob.values) - 1) // 2] for knob in self.knobs}

    @property
    def strongest_first(self) -> bool:
        """Never: its sampler, not an order, decides which point comes next."""
        return False

    def strength(self, point: Point) -> tuple[int, ...]:
        """How strong a point is: its candidates' indices summed, then knob by knob."""
        indices = tuple(knob.values.index(point[knob.field]) for knob in self.knobs)
        return (sum(indices), *indices)

    def point_label(self, point: Point) -> str:
        """A point as people read it (``fraction 50% share 25%``)."""
        return " ".join(f"{knob.field} {knob.label(point[knob.field])}" for knob in self.knobs)


Space = Knob | Joint
"""What a technique's ``auto`` searches."""
