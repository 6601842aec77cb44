"""The measurements' share of the time budget: what each costs, what fits, what was cut.

The run's one `Budget` while its variants are measured, and its ledger of cuts. What the
measurements made so far cost by format (`MeasurementCosts`) prices those left: each one's
protocol is sized to the time left (`protocol_for`), a form waits while measuring it now would
leave the compression less than its techniques need (`would_starve`), one that no longer fits
before the finish is cut (`fits`), and the compressed variants' measurements are priced by the
baseline's before the compression starts (`resize`). The flow asks; it does not price.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfopt.artifacts import Cut, LearnedCosts
from tfopt.config import MeasurementProtocol
from tfopt.runtimes import runtime_of
from tfopt.schedule.budget import PROFILES, Budget, Cuts, MeasurementCosts
from tfopt.schedule.prices import PlannedRun, full_runs_s, shortest_runs_s


class MeasurementLedger:
    """The measurements' time: the run's budget, their costs by format, and the cuts."""

    def __init__(self, budget: Budget, protocol: MeasurementProtocol,
                 costs: MeasurementCosts | None = None) -> None:
        self.budget, self.protocol = budget, protocol
        self.cuts = Cuts()
        self.costs = costs or MeasurementCosts(  # what the measurements so far cost, by format
            lambda variant_format: budget.planned_measurement_s(
                runtime_of(variant_format).name == "tensorflow"))

    def protocol_for(self, left: list[str]) -> MeasurementProtocol:
        """The next measurement's protocol, so that those of the `left` formats fit the time."""
        return self.budget.measurement_protocol(
            self.protocol, len(left), self.costs.expected(left, self.protocol.profile),
            self.cuts)

    def measured(self, variant_format: str, seconds: float, profile_s: float = 0.0) -> None:
        """One measurement of a `variant_format` variant cost `seconds` beside its timing."""
        self.costs.add(variant_format, seconds, profile_s)

    def file_s(self) -> float:
        """What a LiteRT file's conversion and measurement cost, as the baseline's priced them.

        A search trial's files are those (`tfopt.schedule.prices.first_trial_s`).
        """
        measured = self.costs.expected(["tflite"], profiled=False)
        return self.budget.build_s + (self.budget.measure_s if measured is None
                                      else measured + self.budget.timing_s)

    def techniques_shortest_s(self, runs: Sequence[PlannedRun], epoch_s: float, workers: int,
                              trial_files: int, learned: LearnedCosts | None) -> float:
        """The planned techniques' shortest runs together, per worker.

        A search's first trial's files are priced as the baseline's measurements priced a file
        (`file_s`).
        """
        return shortest_runs_s(runs, epoch_s, workers, self.file_s(), trial_files, learned)

    @staticmethod
    def techniques_full_s(runs: Sequence[PlannedRun], epoch_s: float,
                          learned: LearnedCosts | None) -> float:
        """Every planned technique's fine-tuning to its epoch cap, at the baseline's pace."""
        return full_runs_s(runs, epoch_s, learned)

    def would_starve(self, rest: list[str], formats: list[str], needed_s: float,
                     budget: Budget | None = None) -> bool:
        """Whether measuring the `rest` formats now leaves the compression less than `needed_s`.

        `formats` are the compressed variants', priced without their profiles: `resize`
        leaves them out when the window is short. `budget`: the run's as it would be planned
        for them (None: as it is).
        """
        budget = budget or self.budget
        before = self.costs.expected(rest)
        compressed = self.costs.expected(formats, profiled=False)
        if before is None or compressed is None:
            return False
        timing = budget.timing_s
        window = budget.window_after(before + len(rest) * timing,
                                     compressed + len(formats) * timing)
        return window is not None and window < needed_s

    def fits(self, variant_format: str) -> bool:
        """Whether a `variant_format` variant's expected measurement still fits the time left."""
        left = self.budget.left_for_measurements()
        expected = self.costs.expected([variant_format], self.protocol.profile)
        return left is None or expected is None or left >= expected + self.budget.timing_s

    def resize(self, formats: list[str], needed_s: float) -> bool:
        """Price the measurements of `formats` in the budget by those made so far.

        False when there is no budget, or nothing measured yet to price them by.

        When the compression's window would be shorter than the techniques' full runs
        (`needed_s`), those measurements leave out the operator profiles and other APIs
        (the baseline's forms measured before it have them), said as a cut: the fine-tunings
        are what the run is for.
        """
        expected = self.costs.expected(formats)
        if self.budget.minutes is None or expected is None:
            return False
        timing = len(formats) * self.budget.timing_s
        budget = self.budget.with_measured(expected + timing)
        window = self.budget.window_after(0.0, expected + timing) or 0.0
        if self.protocol.profile and window < needed_s:
            budget = self.budget.with_measured(
                (self.costs.expected(formats, profiled=False) or 0.0) + timing)
            self.protocol = self.protocol.model_copy(update={"profile": False})
            self.cuts.record(Cut(
                step=PROFILES, kind="shortened",
                reason=f"operator profiles and other APIs measured before the compression "
                       f"only: {window:.0f} s left the techniques less than their full runs "
                       f"({needed_s:.0f} s)"))
        self.budget = budget
        return True
