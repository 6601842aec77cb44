"""The run's measurements, one variant at a time: the baseline's forms, the compressed ones.

The baseline's forms are measured before the compression, breadth-first over the runtimes
(`tfopt.variants.breadth_first`, the speedup reference `baseline-tflite-int8` first): what
they cost by format (`MeasurementCosts`) prices the compressed variants' measurements
(`MeasurementLedger.resize`), so the searches and fine-tunings get the time a guess would have
kept. On a slow machine the measurements could take the compression's whole time: then each
compressed model is built and measured as its int8 and fp32 TFLite files alone
(``compress.forms: tflite``), or its int8 file alone when even those would not fit
(``tflite_int8``). Past each runtime's first form and the peers (each runtime's one-call int8
and XLA, measured in every run), a baseline form whose
measurement would leave the techniques less than their full runs waits until after the
compressed variants, measured then while the budget lasts (`Measurements.later`): the
fine-tunings are what the run is for, and the first round already put the baseline on every
runtime and priced the compressed variants' measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from compress import (
    Planned,
    compressed_formats,
    compression_workers,
    plan,
    priced_runs,
    trial_forms,
)
from flows.common import benchmark_one
from flows.parameters import PipelineConfig
from tfopt.artifacts import (
    BenchmarkInputs,
    Cut,
    LearnedCosts,
    ModelArtifact,
    VariantResult,
    VariantSpec,
)
from tfopt.logs import step_logger
from tfopt.measurement.champion import is_peer
from tfopt.measurement.floor import floor_key
from tfopt.models.baseline import epoch_seconds
from tfopt.native import release_workers
from tfopt.orchestration import StepProgress
from tfopt.runtimes import NARROWED_FORMS, runtime_of, with_float_stem, with_forms
from tfopt.schedule.budget import CUT_BY_BUDGET, Budget, Cuts
from tfopt.schedule.measurements import MeasurementLedger
from tfopt.search import baseline_int8
from tfopt.variants import breadth_first, quicker_than_reference, skipped


class Measurements:
    """The run's measurements, one variant at a time, and what the budget cut of them.

    Their time is the schedule's (`tfopt.schedule.measurements.MeasurementLedger`: the run's one
    `budget` from the baseline's measurements on, their costs, the cuts): this class asks it
    and measures.

    The harness's floor of each runner is timed with the first variant that goes through it
    and handed on to the others (`BenchmarkInputs.floor_ms`). Within a time budget each
    measurement's protocol is sized to what is left. A progress artifact counts every planned
    variant. `config` is the pipeline's, with the compressed models narrowed to their int8
    TFLite files when the baseline's turn found the time short (the compression takes it).
    """

    def __init__(self, config: PipelineConfig, budget: Budget) -> None:
        self.config = config
        self.ledger = MeasurementLedger(budget, config.benchmark)
        self.waiting: list[VariantSpec] = []
        """The baseline's forms that wait until after the compressed variants (`later`)."""
        self._floors: dict[str, float] = {}
        self._done, self._total = 0, budget.baseline_variants + budget.compressed_variants
        self._progress = StepProgress("benchmark-variants", "variants benchmarked")

    @property
    def budget(self) -> Budget:
        """The run's budget, as the measurements have resized it so far."""
        return self.ledger.budget

    @budget.setter
    def budget(self, budget: Budget) -> None:
        self.ledger.budget = budget

    @property
    def cuts(self) -> Cuts:
        """What the budget cut of the measurements."""
        return self.ledger.cuts

    def measure(self, variants: list[VariantSpec], inputs: BenchmarkInputs,
                waits: Callable[[list[VariantSpec]], bool] | None = None,
                ) -> list[VariantResult]:
        """Benchmark `variants` on `inputs`, one at a time, in their order.

        `waits`, given the variants not measured yet, says whether they wait (the measuring
        stops there; the ones measured are returned).
        """
        release_workers()  # the trainings' memory back before the measurements
        results: list[VariantResult] = []
        for index, spec in enumerate(variants):
            if waits is not None and waits(variants[index:]):
                break
            protocol = self.ledger.protocol_for(
                [s.format for s in variants[index:] if s.status == "ok"])
            started = time.monotonic()
            result = benchmark_one(spec, inputs.model_copy(update={"floor_ms": {
                **inputs.floor_ms, **self._floors}}), protocol)
            if spec.status == "ok":
                timed = result.timing_seconds or protocol.min_seconds
                self.ledger.measured(spec.format, time.monotonic() - started - timed,
                                     result.profile_seconds)
            if result.harness_floor_ms is not None:
                self._floors.setdefault(floor_key(result.format, protocol.threads),
                                        result.harness_floor_ms)
            results.append(result)
            self._done += 1
            self._progress.update(self._done, max(self._total, self._done))
        return results

    def baseline_first(self, baseline: ModelArtifact, variants: list[VariantSpec],
                       inputs: BenchmarkInputs, learned: LearnedCosts | None = None,
                       ) -> list[VariantResult]:
        """The baseline's forms measured before the compression; `budget` resized by them.

        Breadth-first over the runtimes, the speedup reference first. Each runtime's first form
        is always measured (the baseline on every runtime, and the prices of the others), and
        so is a form its build already timed faster than the reference
        (`quicker_than_reference`: the likeliest champion among the rest). If
        the compressed variants' measurements would then leave the techniques less than their
        shortest runs, the compressed models are narrowed to their TFLite files (`_narrowed`:
        `config` then says ``compress.forms: tflite`` or ``tflite_int8``; the cuts say why).
        From then on, the baseline's forms that would leave the techniques less than their full
        runs wait for `later`: the first whose measurement would, and those after it (the log
        says which).
        `learned`: the techniques' fixed parts as this machine's earlier runs took them.
        ``compress.float_stem`` left to the run is decided first (`with_float_stem`): the
        compressed models' forms, and so their price, depend on it.
        """
        left_to_run = self.config.compress.float_stem is None
        self.config = with_float_stem(self.config, variants)
        if left_to_run and self.config.compress.float_stem:
            step_logger().info(
                "the baseline's int8 file was faster with its first convolution in float: the "
                "int8 file of each thinner or shallower model is built that way too "
                "(compress.float_stem)")
        plans = plan(self.config, baseline)
        epoch_s = epoch_seconds(baseline)
        reference = baseline_int8(variants, baseline.name)
        ordered = breadth_first(variants, lambda spec: runtime_of(spec.format).name,
                                reference.name if reference else None)
        first, rest = first_round(ordered, baseline.name)
        results = self.measure(first, inputs)
        shortest_s = self.shortest_runs_s(plans, epoch_s, learned)
        if self.would_starve([], compressed_formats(plans), shortest_s):
            plans = self._narrowed(baseline, plans, shortest_s)
        formats = compressed_formats(plans)
        full_s = self.ledger.techniques_full_s(priced_runs(plans), epoch_s, learned)
        measured = self.measure(rest, inputs,
                                lambda left: self.would_starve(left[:1], formats, full_s))
        results += measured
        self.waiting = rest[len(measured):]
        if any(spec.status == "ok" for spec in self.waiting):
            step_logger().info(
                "measured now, the baseline's %s would leave the compression less than its "
                "techniques' full runs (%.0f s): measured after the compressed variants, "
                "while the time budget lasts",
                ", ".join(s.name for s in self.waiting if s.status == "ok"), full_s)
        if self.ledger.resize(formats, full_s):
            step_logger().info("resized by the baseline's measurements: %s",
                               self.budget.plan_line())
        return results

    def shortest_runs_s(self, plans: list[Planned], epoch_s: float,
                        learned: LearnedCosts | None) -> float:
        """The techniques' shortest runs together, per worker, as the ledger prices them."""
        return self.ledger.techniques_shortest_s(priced_runs(plans), epoch_s,
                                                 compression_workers(self.config),
                                                 len(trial_forms(self.config)), learned)

    def file_s(self) -> float:
        """What a search trial's file costs to convert and measure (`MeasurementLedger.file_s`)."""
        return self.ledger.file_s()

    def _narrowed(self, baseline: ModelArtifact, plans: list[Planned],
                  shortest_s: float) -> list[Planned]:
        """The compressed models planned as their TFLite files alone, said as a cut.

        Their int8 and fp32 files (`NARROWED_FORMS`: int8 is not the faster everywhere), or
        their int8 files alone when measuring even those would leave the techniques less than
        `shortest_s`.
        """
        before = len(compressed_formats(plans))
        narrowest = list(NARROWED_FORMS)[-1]
        for forms, precisions in NARROWED_FORMS.items():
            narrowed = with_forms(self.config, forms)
            narrow_plans = plan(narrowed, baseline)
            formats = compressed_formats(narrow_plans)
            budget = self.budget.with_compressed(len(formats))
            if len(formats) >= before or (forms != narrowest and self.would_starve(
                    [], formats, shortest_s, budget)):
                continue
            self.config, self.budget = narrowed, budget
            self._total = self.budget.baseline_variants + len(formats)
            files = f"{' and '.join(precisions)} TFLite file{'s' if len(precisions) > 1 else ''}"
            line = (f"each compressed model built and measured as its {files} only "
                    f"(compress.forms: {forms}): its {before} forms would have left the "
                    f"techniques less than their shortest runs ({shortest_s:.0f} s)")
            step_logger().info(line)
            self.cuts.record(Cut(step="compressed forms", kind="narrowed", reason=line))
            return narrow_plans
        return plans

    def would_starve(self, rest: list[VariantSpec], formats: list[str], needed_s: float,
                     budget: Budget | None = None) -> bool:
        """Whether measuring `rest` (maybe none) now leaves the compression less than `needed_s`.

        `formats` are the compressed variants'; `budget`: the run's as it would be planned for
        them (None: as it is). `MeasurementLedger.would_starve` prices it.
        """
        return self.ledger.would_starve([spec.format for spec in rest if spec.status == "ok"],
                                        formats, needed_s, budget)

    def finish_for(self, measured: list[VariantResult], built: list[VariantSpec]) -> None:
        """Price the finish for the variants it will package (`Budget.with_packaged`).

        Those `measured` ok, those `built` ok and the forms waiting: a technique that built
        nothing, or a form that failed, is not packaged, and priced as planned the finish
        kept the time the waiting forms could have been measured in.
        """
        packaged = (sum(result.status == "ok" for result in measured)
                    + sum(spec.status == "ok" for spec in [*built, *self.waiting]))
        self.budget = self.budget.with_packaged(packaged)

    def later(self, inputs: BenchmarkInputs) -> list[VariantResult]:
        """The baseline's forms that waited for the compression, measured while the time lasts.

        Each in turn, if its expected measurement still fits before the finish; one that does
        not is cut (its row skipped with the reason), and the cuts say which.
        """
        waiting, self.waiting = self.waiting, []
        results: list[VariantResult] = []
        cut: list[str] = []
        for spec in waiting:
            if spec.status == "ok" and not self.ledger.fits(spec.format):
                spec = skipped(spec, f"{CUT_BY_BUDGET}: not measured, its time went to the "
                                     "compression")
                cut.append(spec.name)
            results += self.measure([spec], inputs)
        if cut:
            self.cuts.record(Cut(
                step="the baseline's later forms", kind="not_measured",
                reason=f"{', '.join(cut)} not measured: their time went to the compression"))
        return results


def in_plan_order(variants: list[VariantSpec], results: list[VariantResult]
                  ) -> list[VariantResult]:
    """`results` in the order their `variants` were planned (the report's rows)."""
    rank = {spec.name: index for index, spec in enumerate(variants)}
    return sorted(results, key=lambda result: rank.get(result.name, len(rank)))


def first_round(ordered: list[VariantSpec], source: str = "baseline",
                ) -> tuple[list[VariantSpec], list[VariantSpec]]:
    """`ordered`'s forms measured before the compression whatever the budget, and the rest.

    Each runtime's first (`ordered` is breadth-first over the runtimes), then the peers
    (`is_peer`: each runtime's one-call int8 and XLA, what a user would pick instead of
    tfopt, so every champion is quoted against them), then any other whose build already
    timed it faster than the int8 reference (`quicker_than_reference`).
    """
    runtimes = len({runtime_of(spec.format).name for spec in ordered})
    first = ordered[:runtimes] + [spec for spec in ordered[runtimes:]
                                  if is_peer(spec, source) or quicker_than_reference(spec)]
    return first, [spec for spec in ordered if spec not in first]
