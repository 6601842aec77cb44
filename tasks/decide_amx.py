"""Prefect task: ``benchmark.amx: auto`` decided, before anything is measured.

See `tfopt.measurement.amx` for why and how.
"""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.logs import step_logger
from tfopt.measurement.amx import AmxDecision, decide_amx


@task(name="decide_amx", tags=["benchmark"])
def decide_amx_setting(protocol: MeasurementProtocol, reference: VariantSpec | None,
                       inputs: BenchmarkInputs) -> AmxDecision:
    """Whether every later measuring process runs with AMX (see `tfopt.measurement.amx`).

    Args:
        protocol: The benchmark protocol; its ``amx`` is kept unless it is ``auto``.
        reference: The file timed both ways (the baseline's int8 TFLite file), or None.
        inputs: The test inputs every variant is timed on.

    Returns:
        The setting and how it was decided (a timing that fails leaves AMX allowed).
    """
    return decide_amx(protocol, reference, inputs, step_logger())
