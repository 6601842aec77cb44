"""Prefect task: benchmark one variant (accuracy, agreement, latency, memory, size)."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import BenchmarkInputs, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.logs import step_logger
from tfopt.measurement.isolation import measure
from tfopt.orchestration import retry_if_transient


@task(
    name="benchmark_variant",
    tags=["benchmark"],
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=retry_if_transient,
)
def benchmark_variant(
    variant: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> VariantResult:
    """Measure one variant with the same protocol and the same test inputs as every other.

    Protocol: load (timed), first inference (timed separately: tracing, XLA compilation),
    accuracy and agreement with the float reference over the whole test split, then batch-1
    latency over test examples in order: `warmup_runs` untimed, then `min_runs` timed runs
    within `max_seconds`. The cores other processes keep busy are measured just before and
    during the timing; a variant timed under load (`benchmark.max_background_cores`) is
    measured once more and keeps `under_load` if the machine is still busy.

    Args:
        variant: The model file or folder, its format and precision.
        inputs: The decoded test split and the float model's logits on it.
        cfg: Warm-up, run count, time budget, thread count, process isolation.

    Returns:
        The measurements.

    Raises:
        TransientError: The measuring process was killed (retried once).
        RuntimeError: The measuring process failed.
        ValueError: A variant or setting that needs its own process while `cfg.isolate` is off.
    """
    return measure(variant, inputs, cfg, step_logger())
