"""`benchmark.amx: auto`: whether the measuring processes run with AMX, decided by timing.

XNNPACK runs int8 on AMX tiles when the kernel grants a process AMX, and on small networks those
kernels can be slower than its AVX-512 ones (docs/limits.md). `auto` times one file, the
baseline's int8 TFLite file every speed-up is quoted against (or the one model a benchmark
measures), in fresh measuring processes with AMX allowed and denied, in alternating order, and
denies AMX to every later measuring process unless the median of the rounds' paired ratios says
the file runs at least `AMX_KEEP_GAIN` faster with it (`AMX_DENIED_FROM`). Elsewhere (no AMX on
this CPU, no file to time, measurements in the flow's own process) `auto` means allowed, and
says why.
"""

from __future__ import annotations

import logging
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.cpu_features import cpu_flags
from tfopt.measurement.runoff import side_by_side_in_worker

AMX_ROUNDS = 4
"""At most this many process pairs are timed (one with AMX allowed, one denied, their order
alternating; a few seconds each); from `AMX_MIN_ROUNDS` on, the timing stops once every round
so far falls on the same side of the threshold."""
AMX_MIN_ROUNDS = 2
AMX_KEEP_GAIN = 0.15
"""How much faster (as a fraction) the file must run with AMX for `auto` to keep it. Not the
other way round: the thinner files a run makes gained more from denying AMX than the baseline's
own file in every pair measured, and the demo baseline's own gain moved between 0.95x and 1.8x
between runs (docs/measurements.md): a baseline file indifferent to AMX, or a
little faster with it, still predicts a champion that is faster without it. Where AMX pays
(ResNet-50 at 224 px: 1.6x) it pays far more than this."""
AMX_DENIED_FROM = 1.0 / (1.0 + AMX_KEEP_GAIN)
"""The p50 ratio, AMX allowed over denied, from which `auto` denies AMX."""

_AUTO_ALLOWED = "AMX allowed (benchmark.amx: auto)"

ProtocolT = TypeVar("ProtocolT", bound=MeasurementProtocol)


class AmxDecision(BaseModel):
    """What the measuring processes run with, and how that was decided.

    Attributes:
        setting: ``allowed`` or ``denied`` (what every measuring process then does).
        decided_by: ``config`` (set as it is) or ``auto`` (decided here).
        timed: The file timed both ways (auto only).
        denied_speedup: The median over rounds of its p50 with AMX allowed over its p50 with AMX
            denied (above 1: faster without AMX).
        round_ratios: Each round's paired ratio.
        reason: One sentence for the log, the summary and the report.
    """

    model_config = ConfigDict(extra="forbid")

    setting: Literal["allowed", "denied"]
    decided_by: Literal["config", "auto"]
    timed: str | None = None
    denied_speedup: float | None = None
    round_ratios: list[float] = []
    reason: str


def decide_amx(protocol: MeasurementProtocol, reference: VariantSpec | None,
               inputs: BenchmarkInputs, logger: logging.Logger) -> AmxDecision:
    """`protocol.amx` as set, or for ``auto`` timed on `reference` (see the module docstring)."""
    if protocol.amx != "auto":
        return AmxDecision(setting=protocol.amx, decided_by="config",
                           reason=f"AMX {protocol.amx} (benchmark.amx: {protocol.amx})")
    unanswered = _why_not_timed(protocol, reference)
    if unanswered is not None:
        return AmxDecision(setting="allowed", decided_by="auto", reason=unanswered)
    assert reference is not None
    try:
        rounds = _two_way_rounds(protocol, reference, inputs)
    except (RuntimeError, OSError) as error:
        logger.warning("benchmark.amx: auto could not time %s: %s", reference.name, error)
        return AmxDecision(setting="allowed", decided_by="auto", timed=reference.name,
                           reason=f"{_AUTO_ALLOWED}: timing {reference.name} both ways failed")
    ratios, gain = rounds.round_ratios("allowed", "denied"), rounds.ratio("allowed", "denied")
    denied = gain >= AMX_DENIED_FROM
    decision = AmxDecision(
        setting="denied" if denied else "allowed", decided_by="auto", timed=reference.name,
        denied_speedup=gain, round_ratios=ratios,
        reason=(f"AMX {'denied' if denied else 'allowed'} (benchmark.amx: auto): "
                f"{reference.name} ran {gain:.2f}x as fast without it ({len(ratios)} paired "
                f"rounds, {min(ratios):.2f}-{max(ratios):.2f}x; denied from "
                f"{AMX_DENIED_FROM:.2f}x)"))
    logger.info(decision.reason)
    return decision


def with_decided_amx(protocol: ProtocolT, decision: AmxDecision) -> ProtocolT:
    """`protocol` with ``amx`` the decided setting (what its measuring processes read)."""
    return protocol.model_copy(update={"amx": decision.setting})


def _why_not_timed(protocol: MeasurementProtocol, reference: VariantSpec | None) -> str | None:
    if "amx_tile" not in cpu_flags():
        return f"{_AUTO_ALLOWED}: this CPU has no AMX"
    if not protocol.isolate:
        return f"{_AUTO_ALLOWED}: measurements run in the flow's process (benchmark.isolate: false)"
    if reference is None or reference.path is None:
        return f"{_AUTO_ALLOWED}: no int8 file to time both ways"
    return None


def _two_way_rounds(protocol: MeasurementProtocol, reference: VariantSpec,
                    inputs: BenchmarkInputs) -> Runoff:
    """The file's p50 with AMX ``allowed`` and ``denied``, one process pair a round.

    Read as the run-off is (`Runoff.ratio`: paired round by round, so a drift of the machine's
    speed between rounds reaches both settings alike).
    """
    p50s: dict[str, list[float]] = {"allowed": [], "denied": []}
    for round_ in range(AMX_ROUNDS):
        order = ("allowed", "denied") if round_ % 2 == 0 else ("denied", "allowed")
        for setting in order:
            p50s[setting].append(side_by_side_in_worker(
                [reference], inputs, protocol.model_copy(update={"amx": setting})
            ).p50(reference.name))
        rounds = Runoff(rounds=round_ + 1, round_p50_ms=p50s)
        sides = {ratio >= AMX_DENIED_FROM for ratio in rounds.round_ratios("allowed", "denied")}
        if rounds.rounds >= AMX_MIN_ROUNDS and len(sides) == 1:
            break
    return rounds
