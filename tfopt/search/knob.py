"""A technique's strength that ``auto`` searches: its field, its candidates, how they read."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
