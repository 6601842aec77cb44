"""A run within ``budget.minutes``: each phase's deadline, the benchmark sized to fit, the cuts.

The plan reserves the end of the budget for the planned variants' conversions and measurements
(`BUILD_S` and `MEASURE_S` each, from the demo: docs/measurements.md) and the finish (`FINISH_S`,
more for a larger model, or as this machine's earlier runs took it: `FinishWatch`), and gives the
rest to the work before them: the data and the baseline's training end by `BASELINE_SHARE` of it,
the searches and fine-tunings at its end. The baseline's variants are measured before the
compression starts, and what they cost sizes the compressed ones' (`Budget.with_measured`): the
searches and fine-tunings get the time a guess would keep.
Trainings stop at their phase's deadline (`tfopt.models.training.StopWhenDone`), a search starts
no round it cannot finish, and the benchmark protocol is shortened to what the time left allows
for the variants built.
Every cut is recorded, and the run says at its start what it plans and at its end what was cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tfopt.artifacts import Cut
from tfopt.config import MeasurementProtocol, Section

BASELINE_SHARE = 0.45
"""The share of the time before the compressed variants' conversions that the data, the
baseline's training and its own variants' conversions get."""
BUILD_S = 1.5
"""Per planned variant, its conversion."""
MEASURE_S = 3.2
"""Per variant, what a measurement costs besides its timing: its process, load, floor, profile."""
MEASURE_S_PER_INPUT_MB = 0.11
"""Beside `MEASURE_S`, per MB of the test inputs every variant is fed: its accuracy pass runs
them all, whatever the network (docs/measurements.md, "Time budget costs")."""
TENSORFLOW_MEASURE_S_PER_MB = 1.2
"""Beside that, per MB of the baseline's SavedModel, for each TensorFlow variant (graph,
SavedModel, XLA): its process loads and traces the model (the same runs: 11 s a variant for
MobileNetV3Small's 3.3 MB, 28-33 s for MobileNetV2's 11.9 MB and EfficientNetB0's 20.9 MB)."""
FINISH_S = 20.0
"""After the measurements: the run-off, the MLflow models and child runs, the report (the demo's:
docs/measurements.md), until learned on this machine for the model (`Budget.finish_fixed_s`)."""
FINISH_S_PER_MB = 0.2
"""Beside `FINISH_S`, per variant and per MB of the baseline's SavedModel: packaging each
variant as an MLflow model copies and loads it (the same runs: 52-88 s for MobileNetV2's 23
variants, 67 s for EfficientNetB0's 25, 33-40 s for MobileNetV3Small's 22-27)."""
MIN_TIMING_S = 0.3
CUT_BY_BUDGET = "cut by the time budget"
"""How a step the time budget left no time for is skipped (a technique's reason starts so)."""
LEAST_WORK_SHARE = 0.3
"""The share of the budget the work before the conversions keeps, however many variants."""


class Stop(StrEnum):
    """What ended a training, as its params and the summary carry it (``stopped_by``)."""

    NOT_TRAINED = ""
    """Taken as it is (``train.epochs: 0``)."""
    PLATEAU = "plateau"
    RECOVERED = "recovered"
    """Back within the accuracy budget (a fine-tuning)."""
    CAP = "cap"
    """Its epoch cap (or a fixed number of epochs)."""
    BUDGET = "budget"
    """The time budget, before it was done."""
    BUDGET_COOLING = "budget_cooling"
    """The time budget, while its rate cooled down once done."""
    PRUNED = "pruned"
    """The search's pruner: hopeless for the search."""

    @property
    def by_budget(self) -> bool:
        """The time budget ended it."""
        return self in (Stop.BUDGET, Stop.BUDGET_COOLING)

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Stop | None:
        """What `params` (a model's, a training's summary) say ended it; None: not said."""
        value = params.get("stopped_by")
        return cls(value) if value is not None and value in cls._value2member_map_ else None


class Cuts:
    """The run's ledger of cuts: each told `record` where it happens, the first per step kept."""

    def __init__(self, cuts: Iterable[Cut] = ()) -> None:
        self._by_step: dict[str, Cut] = {}
        for cut in cuts:
            self.record(cut)

    def record(self, cut: Cut) -> None:
        """Keep `cut`, unless its step was cut already."""
        self._by_step.setdefault(cut.step, cut)

    def __iter__(self) -> Iterator[Cut]:
        return iter(self._by_step.values())

    def __len__(self) -> int:
        return len(self._by_step)

    def lines(self) -> list[str]:
        """What the run says it cut, in the order it was cut."""
        return [cut.reason for cut in self]


class Clock(BaseModel):
    """A step's end within the run's time budget, read where the step starts.

    The budget's decisions in one place, made by the step that may be cut: how long is `left`,
    whether a step expected to take so long `can_start`, the reason one that cannot is `cut`
    with, and the `share` of the time left a step gets beside those queued after it. Tasks
    receive its deadline in their `TrainingData` (a run without a budget: None, no limit).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    deadline: float | None = None
    """When the step must have ended (a `time.time()` value)."""

    def left(self) -> float | None:
        """The seconds left before the deadline (negative: past it; None: no budget)."""
        return None if self.deadline is None else self.deadline - time.time()

    def can_start(self, expected_s: float) -> bool:
        """Whether a step expected to take `expected_s` seconds still fits."""
        left = self.left()
        return left is None or left >= expected_s

    def cut(self, step: str, expected_s: float) -> str:
        """Why `step`, whose shortest run takes `expected_s`, is not started (`CUT_BY_BUDGET`)."""
        left = self.left() or 0.0
        if left < 0:
            return f"{CUT_BY_BUDGET}: the time was used before {step} could start"
        return (f"{CUT_BY_BUDGET}: {left:.1f} s were left for {step}, less than its shortest run "
                f"({expected_s:.1f} s)")

    def share(self, own_s: float, queued_s: float, weight: float) -> Clock:
        """The clock of a step that gets `own_s`, then `weight` of what `queued_s` leaves.

        `queued_s` is what the steps queued before the deadline (this one included) need at
        least: each gets that first, and the rest is shared (coverage before depth).
        """
        left = self.left()
        if left is None:
            return self
        left = max(0.0, left)
        now = time.time()
        return Clock(deadline=now + min(left, own_s + max(0.0, left - queued_s) * weight))


class BudgetConfig(Section):
    """How long a whole run may take."""

    minutes: float | None = Field(
        None, gt=0.0, le=100_000.0,
        description=(
            "The run's time budget in minutes (null: none): the baseline's training, the "
            "searches and fine-tunings and the benchmarks are sized to fit it, and what it cut "
            "is said at the end."
        ),
    )


class ModelSizes(BaseModel):
    """What sizes a run's measurements and finish: the baseline and the test inputs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_bytes: int = 0
    """The baseline's SavedModel (its own file when it has none)."""
    input_bytes: int = 0
    """The test inputs every variant is fed (0: generated from the model's signature)."""
    tensorflow_variants: int = 0
    """The planned variants measured in TensorFlow itself (graph, SavedModel, XLA)."""


class Budget(BaseModel):
    """A run's budget as planned at its start, and resized by what was measured since."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    minutes: float | None
    baseline_variants: int = 0
    compressed_variants: int = 0
    least_compressed_variants: int | None = None
    """The compressed variants if each model keeps its int8 TFLite file alone: what the run
    narrows to when the time runs short (`flows.measurements`), so the baseline's training,
    which every verdict rests on, is not cut for forms that would be (None: as planned)."""
    build_s: float = BUILD_S
    measure_s: float = MEASURE_S + MIN_TIMING_S
    timing_s: float = MIN_TIMING_S
    """The timing (``min_seconds``) `measure_s` holds."""
    tensorflow_variants: int = 0
    tensorflow_measure_s: float = 0.0
    """What each of the `tensorflow_variants` costs beside `measure_s`."""
    finish_s: float = FINISH_S
    learned_finish_s: float | None = None
    """The finish beside packaging as this machine's earlier runs of this model took it
    (`tfopt.schedule.learned_costs`; None: not learned, `FINISH_S`): a larger model's run-off
    and MLflow models take longer than the demo's, and runs priced at the guess ended past
    their budget."""
    package_s: float = 0.0
    """The part of `finish_s` per variant it packages (`with_builds`), beside `finish_fixed_s`."""
    measured_tail_s: float | None = None
    """Once the baseline's variants are measured: the compressed ones' conversions and
    measurements and the finish, as those measurements price them (`with_measured`)."""
    started: float = Field(default_factory=time.time)

    @classmethod
    def planned(cls, minutes: float | None, counts: tuple[int, int],
                protocol: MeasurementProtocol, least_compressed: int | None = None,
                learned_finish_s: float | None = None) -> Budget:
        """The budget of a run planning `counts` (baseline, compressed) variants.

        Each measurement is expected to take `MEASURE_S` beside its timing (at least
        ``min_seconds``) and its load scenarios (a few LoadGen runs each).
        `least_compressed`: the compressed variants the run may narrow to
        (`least_compressed_variants`). `learned_finish_s`: the finish beside its packaging as
        this machine's earlier runs took it (None: `FINISH_S`).
        """
        timing = max(MIN_TIMING_S, min(protocol.min_seconds, protocol.max_seconds))
        scenarios = 4.0 * protocol.scenario_seconds * (len(protocol.scenarios) - 1)
        planned = cls(minutes=minutes, baseline_variants=counts[0],
                      compressed_variants=counts[1], least_compressed_variants=least_compressed,
                      measure_s=MEASURE_S + timing + scenarios, timing_s=timing,
                      learned_finish_s=learned_finish_s)
        return planned.model_copy(update={"finish_s": planned.finish_fixed_s})

    @property
    def finish_fixed_s(self) -> float:
        """The part of `finish_s` beside packaging: learned, else `FINISH_S`."""
        return FINISH_S if self.learned_finish_s is None else self.learned_finish_s

    def planned_measurement_s(self, tensorflow: bool) -> float:
        """What one measurement is planned to cost beside its timing (TensorFlow's or a file's)."""
        return (self.measure_s - self.timing_s
                + (self.tensorflow_measure_s if tensorflow else 0.0))

    def with_builds(self, seconds: float, count: int, sizes: ModelSizes) -> Budget:
        """The budget with the conversion time measured on the baseline's variants.

        The measurements and the finish are sized by the baseline and the test inputs
        (`sizes`): every variant is fed all of them, loaded in its measuring process and
        packaged at the end.
        """
        variants = self.baseline_variants + self.compressed_variants
        model_mb, inputs_mb = sizes.model_bytes / 1e6, sizes.input_bytes / 1e6
        package_s = FINISH_S_PER_MB * model_mb
        update: dict[str, float] = {
            "finish_s": self.finish_fixed_s + package_s * variants, "package_s": package_s,
            "measure_s": self.measure_s + MEASURE_S_PER_INPUT_MB * inputs_mb,
            "tensorflow_variants": sizes.tensorflow_variants,
            "tensorflow_measure_s": TENSORFLOW_MEASURE_S_PER_MB * model_mb}
        if count > 0:
            update["build_s"] = seconds / count
        return self.model_copy(update=update)

    def with_measured(self, compressed_measurements_s: float) -> Budget:
        """The budget once the baseline's variants are measured, before the compression.

        `compressed_measurements_s` is what the compressed variants' measurements will cost, all
        together, priced by the baseline's (`MeasurementCosts.expected` and their timing): the
        compression then ends when their conversions, those and the finish still fit.
        """
        return self.model_copy(update={"measured_tail_s": (
            self.compressed_variants * self.build_s + compressed_measurements_s
            + self.finish_s)})

    def with_compressed(self, count: int) -> Budget:
        """The budget with `count` compressed variants planned instead, its finish with them."""
        return self.model_copy(update={"compressed_variants": count}).with_packaged(
            self.baseline_variants + count)

    def with_packaged(self, count: int) -> Budget:
        """The budget with its finish priced for packaging `count` variants.

        The finish's part beyond `finish_fixed_s` packages each variant measured (`package_s`);
        one that failed or was skipped is not packaged.
        """
        return self.model_copy(update={"finish_s": self.finish_fixed_s + self.package_s * count})

    def window_after(self, before_s: float, compressed_measurements_s: float) -> float | None:
        """The compression's time if the work before it takes `before_s` more from now.

        The compressed variants' measurements are priced at `compressed_measurements_s`, as in
        `with_measured` (None: no budget; negative: the compression has no time at all).
        """
        deadline = self.with_measured(compressed_measurements_s).compression_deadline
        return None if deadline is None else deadline - time.time() - before_s

    def left_for_measurements(self) -> float | None:
        """The seconds the measurements still have before the finish (None: no budget)."""
        end = self.deadline(1.0)
        return None if end is None else end - time.time() - self.finish_s

    @property
    def compressed_variant_s(self) -> float:
        """What the time after the compression keeps for one compressed variant.

        Its conversion and its measurement, as the baseline's measurements priced them
        (`with_measured`; before those, as planned).
        """
        if self.compressed_variants <= 0:
            return 0.0
        if self.measured_tail_s is None:
            return self.build_s + self.measure_s
        return max(0.0, self.measured_tail_s - self.finish_s) / self.compressed_variants

    def deadline(self, share: float) -> float | None:
        """When the phase ending at `share` of the budget must end (None: no budget)."""
        return None if self.minutes is None else self.started + share * self.minutes * 60.0

    @property
    def _seconds(self) -> float:
        return (self.minutes or 0.0) * 60.0

    @property
    def _tail(self) -> float:
        """What the conversions and measurements need after the compression."""
        return self._tail_with(self.compressed_variants)

    def _tail_with(self, compressed: int) -> float:
        """`_tail` with `compressed` compressed variants (as measured, once it is)."""
        if self.measured_tail_s is not None:
            return self.measured_tail_s
        variants = self.baseline_variants + compressed
        return (compressed * self.build_s + variants * self.measure_s
                + self.tensorflow_variants * self.tensorflow_measure_s + self.finish_s)

    @property
    def measuring_deadline(self) -> float | None:
        """When the batch-size sweep and the layout measurement must end.

        A sixth of the baseline's share: they size the training, which is what the run needs.
        """
        end = self.baseline_deadline
        return None if end is None else self.started + (end - self.started) / 6.0

    @property
    def baseline_deadline(self) -> float | None:
        """When the baseline's training must end.

        Its share of the work before the conversions, with the compressed models priced as
        the int8 files alone they are narrowed to when time runs short
        (`least_compressed_variants`): the forms cut first do not cut the baseline's training.
        """
        if self.minutes is None:
            return None
        least = self.compressed_variants if self.least_compressed_variants is None else min(
            self.compressed_variants, self.least_compressed_variants)
        work = self._seconds - self._tail_with(least) - self.baseline_variants * self.build_s
        return self.started + BASELINE_SHARE * max(LEAST_WORK_SHARE * self._seconds, work)

    @property
    def compression_deadline(self) -> float | None:
        """When the searches and fine-tunings must end."""
        if self.minutes is None:
            return None
        return self.started + max(LEAST_WORK_SHARE * self._seconds, self._seconds - self._tail)

    @property
    def further_training_deadline(self) -> float | None:
        """When a baseline its children beat must end its further training.

        A tenth of the budget after the compression's deadline, taken from the benchmarks' time.
        """
        end = self.compression_deadline
        return None if end is None else end + 0.1 * self._seconds

    def plan_line(self) -> str:
        """What the run plans, said at its start."""
        if self.minutes is None:
            return "no time budget (budget.minutes): every step runs as configured"
        if self.measured_tail_s is not None:
            return (f"time budget {self.minutes:g} min, priced by the baseline's measurements: "
                    f"searches and fine-tunings by "
                    f"{_clock(self.compression_deadline - self.started)}, the "
                    f"{self.compressed_variants} compressed variants' conversions and "
                    f"benchmarks by {_clock(self._seconds)}")
        return (f"time budget {self.minutes:g} min for {self.baseline_variants} baseline and "
                f"{self.compressed_variants} compressed variants: data and the baseline's "
                f"training by {_clock(self.baseline_deadline - self.started)}, searches and "
                f"fine-tunings by {_clock(self.compression_deadline - self.started)}, "
                f"conversions and benchmarks by {_clock(self._seconds)}" + self._finish_words())

    def _finish_words(self) -> str:
        if self.learned_finish_s is None:
            return ""
        return (f"; the finish (run-off, MLflow models, report) kept {self.finish_fixed_s:.0f} s "
                "beside packaging, as this machine's earlier runs took it")

    def measurement_protocol(self, protocol: MeasurementProtocol, remaining: int,
                             overheads_s: float | None, cuts: Cuts) -> MeasurementProtocol:
        """The protocol for the next measurement, so the `remaining` ones fit the time left.

        `overheads_s` is what the `remaining` measurements are expected to cost beside their
        timing, all together (`MeasurementCosts.expected`; None: `MEASURE_S` each). Short of
        time, the timing is shortened to what is left per variant (at least `MIN_TIMING_S`),
        then the profiles and other APIs are left out; each is recorded in `cuts` (the first
        time).
        """
        end = self.deadline(1.0)
        if end is None or remaining <= 0:
            return protocol
        overheads = MEASURE_S * remaining if overheads_s is None else overheads_s
        per_variant = (end - time.time() - self.finish_s - overheads) / remaining
        if per_variant >= protocol.max_seconds:
            return protocol
        timing = max(MIN_TIMING_S, per_variant)
        update: dict[str, Any] = {"max_seconds": timing,
                                  "min_seconds": min(protocol.min_seconds, timing),
                                  "warmup_seconds": min(protocol.warmup_seconds, timing / 2.0),
                                  "thread_sweep": False}
        cuts.record(Cut(step="benchmark timing", kind="shortened",
                        reason=f"benchmark timing cut to {timing:.1f} s a variant "
                               f"(max_seconds {protocol.max_seconds:g}) with {remaining} "
                               "variants left"))
        if per_variant < MIN_TIMING_S and protocol.profile:
            update["profile"] = False
            cuts.record(Cut(step=PROFILES, kind="shortened",
                            reason="operator profiles and other APIs left out with "
                                   f"{remaining} variants left"))
        return protocol.model_copy(update=update)

    def summary(self, cuts: Cuts) -> dict[str, Any]:
        """The budget as the summary holds it: planned, used, what was cut (and how: each step)."""
        used = (time.time() - self.started) / 60.0
        return {"minutes": self.minutes, "used_minutes": round(used, 2),
                "within": self.minutes is None or used <= self.minutes,
                "plan": self.plan_line(), "cuts": cuts.lines(),
                "cut_steps": [{"step": cut.step, "kind": cut.kind} for cut in cuts],
                "learned_finish_s": None if self.learned_finish_s is None
                else round(self.learned_finish_s, 1)}


class FinishWatch:
    """How long a run's finish took: from its last measurement to its end, for the next run.

    The checks since the last run are left out (`excluding`): they take what the budget leaves
    them, so counted in they would teach the next run to keep ever more time for themselves.
    """

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._excluded = 0.0

    @contextmanager
    def excluding(self) -> Iterator[None]:
        """Leave the time spent in this block out of the finish."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._excluded += time.monotonic() - started

    def seconds(self) -> float:
        """The finish's own seconds so far."""
        return time.monotonic() - self._started - self._excluded


class MeasurementCosts:
    """What the measurements so far cost beside their timing, by format.

    A TensorFlow variant's measuring process costs several times a LiteRT file's: sized by the
    mean of the first ones (the baseline's TensorFlow variants), the files after them would
    have their timing cut short and the run end minutes early. A format not measured yet is
    sized by the dearest one measured, or, given the `planned` cost of each format
    (`Budget.planned_measurement_s`), by its own planned cost times the most any measured
    format cost over its plan.
    """

    def __init__(self, planned: Callable[[str], float] | None = None) -> None:
        self._seconds: dict[str, list[float]] = {}
        self._profiles: dict[str, list[float]] = {}
        self._planned = planned

    def add(self, variant_format: str, seconds: float, profile_s: float = 0.0) -> None:
        """Record one measurement of a `variant_format` variant: its cost beside its timing.

        `profile_s` is the part of `seconds` its operator profile and other APIs took.
        """
        self._seconds.setdefault(variant_format, []).append(max(0.0, seconds - profile_s))
        self._profiles.setdefault(variant_format, []).append(max(0.0, profile_s))

    def expected(self, formats: Sequence[str], profiled: bool = True) -> float | None:
        """What measurements of `formats` will cost beside their timing, all together.

        Each by its own format's mean so far, a format not measured yet as the class says
        (None: nothing measured yet); with their profiles, or without (`profiled`).
        """
        if not self._seconds:
            return None
        parts = [self._seconds, self._profiles] if profiled else [self._seconds]
        means = {name: sum(sum(part[name]) for part in parts) / len(self._seconds[name])
                 for name in self._seconds}
        return sum(means[name] if name in means else self._unseen(name, means)
                   for name in formats)

    def _unseen(self, variant_format: str, means: dict[str, float]) -> float:
        if self._planned is None:
            return max(means.values())
        over_plan = max(mean / max(1e-9, self._planned(name)) for name, mean in means.items())
        return self._planned(variant_format) * over_plan


PROFILES = "operator profiles"
"""The step the measurements' profiles and other APIs are cut as."""


TRAINING_TIME_USED = "the time planned for this training was used"
"""How a training's stop reason says its deadline ended it."""


def _training_cut(who: str, params: dict[str, Any]) -> Cut | None:
    """What the budget cut in one training (`params` with what stopped it), if anything."""
    stopped_by = Stop.of(params)
    if stopped_by is None or not stopped_by.by_budget:
        return None
    epochs = params.get("epochs_run")
    line = f"{who} stopped after {epochs} epoch{'' if epochs == 1 else 's'} (time budget)"
    if stopped_by is Stop.BUDGET_COOLING:
        line += ", before its rate had cooled down to zero"
    return Cut(step=who, kind="stopped", reason=line)


def budget_cuts(training: dict[str, Any], techniques: dict[str, Any]) -> list[Cut]:
    """What the time budget cut in the trainings (from what stopped each: `Stop`)."""
    trainings = [("the baseline's training", training),
                 *((f"{name}'s fine-tuning", technique["params"])
                   for name, technique in techniques.items())]
    return [cut for who, params in trainings if (cut := _training_cut(who, params))]


def _clock(seconds: float) -> str:
    minutes, rest = divmod(max(0, round(seconds)), 60)
    return f"+{minutes}m{rest:02d}s"


def confirmation_cuts(since: dict[str, Any] | None) -> list[Cut]:
    """The slowdowns since the last run the budget left no time to time side by side."""
    cut = [move["variant"] for move in (since or {}).get("moves", [])
           if (move.get("side_by_side") or {}).get("cut")]
    if not cut:
        return []
    return [Cut(step="confirmations", kind="not_confirmed",
                reason=f"{len(cut)} slowdowns since the last run not timed side by side "
                       f"(the stricter rule judged them): {', '.join(cut)}")]
