"""One trial of a search: its model's files timed beside the baseline's int8 file, its status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tfopt.artifacts import BenchmarkInputs, ModelArtifact, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.variants import plan_variant

TrialStatus = Literal["ok", "over_budget", "pruned", "failed", "not_applicable", "cut"]
"""A trial's outcome; ``cut``: the time budget left no round for it (a nested run says so, the
search's trials do not list it)."""
TRIAL_FORMS = ("int8", "fp32")
"""The TFLite precisions a trial converts its model to and times. int8 is usually the faster,
not on every CPU and network (a thinned network's fp32 file has run faster than its int8 one:
docs/measurements.md), so a trial counts as its fastest file within the budget."""


class TimedFile(BaseModel):
    """One of a trial's files as timed: its p50, its accuracies, its speed-up if measured.

    On array data its "accuracies" are scores of the run's metric, higher is better (`scored`).
    """

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

    params: dict[str, float]
    """The setting tried: each searched field's value (`tfopt.search.knob.Point`)."""
    status: TrialStatus
    val_accuracy: float | None = None
    p50_ms: float | None = None
    file_val_accuracy: float | None = None
    """Its file's accuracy on the validation split, measured when timed (judged on)."""
    test_accuracy: float | None = None
    """Its file's accuracy on the test split, measured when timed (reported only)."""
    speedup: float | None = None
    """The baseline's int8 p50 over its file's, the two timed side by side in one process
    (None: no reference, or its files could not be timed beside it)."""
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
        return {"params": dict(self.params), "val_accuracy": self.val_accuracy,
                "file_val_accuracy": self.file_val_accuracy,
                "test_accuracy": self.test_accuracy, "p50_ms": self.p50_ms,
                "speedup": self.speedup, "file": self.file, "status": self.status,
                "epochs_run": self.epochs_run, "seconds": round(self.seconds, 1),
                "files": [timed.model_dump() for timed in self.timed], "error": self.error}


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
    are then timed side by side with it in one process (`tfopt.measurement.runoff`) for their
    speed-ups, those over the budget too (the searches' front and a joint study's sampler
    compare every trial on one scale): a measuring process now and then runs slow its whole
    life, which would make a stronger setting look slower than a weaker one. The trial's
    figures are then its fastest file's within the budget (`with_timed_files`).
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
                                            reference)
            errors += untimed
        except (RuntimeError, OSError, ValueError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    if not timed:
        return trial.model_copy(update={"status": "failed", "error": "; ".join(errors)[:500]})
    result = with_timed_files(trial, timed, file_target)
    if errors:
        step_logger().warning("%s: not timed: %s", trial.params, "; ".join(errors))
        result = result.model_copy(update={"error": "; ".join(
            [*filter(None, [result.error]), *(f"not timed: {e}" for e in errors)])[:500]})
    return result


def _timed_in_slot(trial: Trial, built: list[VariantSpec], inputs: BenchmarkInputs,
                   protocol: MeasurementProtocol,
                   reference: VariantSpec | None) -> tuple[list[TimedFile], list[str]]:
    """`built` timed holding the benchmark slot, then side by side with `reference`.

    Returns:
        The files timed, and why the others could not be.
    """
    from tfopt.orchestration import benchmark_slot

    timed: list[TimedFile] = []
    timed_specs: list[VariantSpec] = []
    errors: list[str] = []
    with benchmark_slot(built[0].name):
        for spec in built:
            figures = _timed_file(spec, inputs, protocol)
            if isinstance(figures, str):
                errors.append(figures)
                continue
            timed.append(figures)
            timed_specs.append(spec)
        if trial.status in ("ok", "over_budget") and timed_specs and reference is not None:
            timed = with_speedups(timed, timed_specs, reference, inputs, protocol)
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
                     val_accuracy=scored(measured.val_accuracy, inputs),
                     test_accuracy=scored(measured.accuracy, inputs))


def scored(figure: float | None, inputs: BenchmarkInputs) -> float | None:
    """A file's figure as the search compares it, higher is better (an error negated).

    As a training on array data scores its held-out figure (`HELD_OUT_SCORE`).
    """
    return None if figure is None else inputs.metric().oriented(figure)


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
