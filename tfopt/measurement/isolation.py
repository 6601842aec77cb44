"""Measuring a variant in a fresh process, retried when the machine was busy, thread sweeps.

Each variant is measured in a fresh process by default (``python -m tfopt.measurement.worker``),
so variants do not disturb each other's memory or thread pools, XLA auto-clustering can be
switched on by environment flags for that variant alone, and a crashing backend fails only its
own variant.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult, VariantSpec
from tfopt.config import MeasurementProtocol
from tfopt.fileio import atomic_write_json, process_temp_dir
from tfopt.logs import step_logger
from tfopt.measurement.worker import measure_variant
from tfopt.orchestration import TransientError
from tfopt.runtimes import runtime_of


def worker_env(spec: VariantSpec) -> dict[str, str]:
    """Environment of the measuring process, with what the variant's runtime sets at its start.

    E.g. XLA auto-clustering's flags, for that variant only (`Runtime.worker_env`).
    """
    return runtime_of(spec.format).worker_env(spec, dict(os.environ))


class TimeLimitError(RuntimeError):
    """A measuring process ran past `benchmark.time_limit_seconds` and was stopped."""


def run_worker(module: str, request: dict, env: dict[str, str],
               time_limit_s: float = 3600.0) -> str:
    """Run ``python -m MODULE REQUEST RESPONSE`` in a fresh process; return the response text.

    Raises:
        TransientError: The process was killed by a signal (the OOM killer, a shutdown).
        TimeLimitError: It ran past `time_limit_s` and was stopped.
        RuntimeError: The process failed; the message holds its last error line.
    """
    with process_temp_dir("bench") as tmp:
        request_path, response = Path(tmp) / "request.json", Path(tmp) / "result.json"
        atomic_write_json(request_path, request)
        try:
            completed = subprocess.run(
                [sys.executable, "-m", module, str(request_path), str(response)],
                env=env, capture_output=True, text=True, timeout=time_limit_s,
            )
        except subprocess.TimeoutExpired as error:
            raise TimeLimitError(
                f"stopped after {time_limit_s:g} s, its time limit "
                "(benchmark.time_limit_seconds)") from error
        if completed.returncode < 0:
            raise TransientError(f"benchmark process killed by signal {-completed.returncode}")
        if completed.returncode != 0 or not response.exists():
            tail = completed.stderr.strip().splitlines()[-1:] or [f"exit {completed.returncode}"]
            raise RuntimeError(f"benchmark process failed: {tail[0][:500]}")
        return response.read_text()


def measure_in_subprocess(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: MeasurementProtocol
) -> VariantResult:
    """Measure one variant with `tfopt.measurement.worker` in a fresh process (see `run_worker`)."""
    request = {"spec": spec.model_dump(mode="json"), "inputs": inputs.model_dump(mode="json"),
               "cfg": cfg.as_protocol().model_dump(mode="json")}
    return VariantResult.model_validate_json(
        run_worker("tfopt.measurement.worker", request, worker_env(spec),
                   cfg.time_limit_seconds))


def _measure(variant: VariantSpec, inputs: BenchmarkInputs,
             cfg: MeasurementProtocol) -> VariantResult:
    if cfg.isolate:
        return measure_in_subprocess(variant, inputs, cfg)
    needs_own_process = runtime_of(variant.format).own_process_reason(variant)
    if needs_own_process:
        raise ValueError(needs_own_process)
    if cfg.cpus:
        raise ValueError("benchmark.cpus needs benchmark.isolate=true (it pins that process)")
    return measure_variant(variant, inputs, cfg)


def with_thread_sweep(variant: VariantSpec, inputs: BenchmarkInputs, cfg: MeasurementProtocol,
                      result: VariantResult) -> VariantResult:
    """`result` with the variant's batch-1 p50 at 1..`cfg.threads` threads.

    Each other thread count is a measurement of its own (a fresh process when isolated:
    TensorFlow sizes its pools once per process), with the same protocol (single stream only).
    """
    p50s = {cfg.threads: result.latency_ms.p50}
    for threads in range(1, cfg.threads):
        other = _measure(variant, inputs, cfg.model_copy(
            update={"threads": threads, "scenarios": ["single_stream"]}))
        p50s[threads] = other.latency_ms.p50
    step_logger().info("%s: p50 by threads %s", variant.name,
                       ", ".join(f"{t}: {p50s[t]:.3f} ms" for t in sorted(p50s)))
    return result.model_copy(update={"p50_ms_by_threads": dict(sorted(p50s.items()))})


def _load_words(result: VariantResult) -> str:
    return " / ".join("?" if cores is None else f"{cores:.2f}"
                      for cores in (result.background_cores_before, result.background_cores))


Timed = TypeVar("Timed", VariantResult, Runoff)


def once_more_under_load(timing: Callable[[], Timed], what: str, load_words: Callable[[Timed], str],
                         limit: float, logger: logging.Logger) -> Timed:
    """`timing()`, run once more when it was under load; still under load: kept and marked.

    Args:
        timing: Times `what` afresh and says whether other work loaded the machine meanwhile.
        what: Its name in the log.
        load_words: The cores other work kept busy, as the log says them.
        limit: ``benchmark.max_background_cores``.
        logger: Where the two warnings go.
    """
    timed = timing()
    if not timed.under_load:
        return timed
    logger.warning("%s was timed while other processes kept %s cores busy (limit %.2f, "
                   "benchmark.max_background_cores): measuring it once more", what,
                   load_words(timed), limit)
    timed = timing().model_copy(update={"load_retried": True})
    if timed.under_load:
        logger.warning("%s: still under load (%s cores); kept and marked under_load", what,
                       load_words(timed))
    return timed


def measure(variant: VariantSpec, inputs: BenchmarkInputs, cfg: MeasurementProtocol,
            logger: logging.Logger) -> VariantResult:
    """Measure one variant (see `tasks.benchmark_variant.benchmark_variant` for the protocol).

    Raises:
        TransientError: The measuring process was killed.
        RuntimeError: The measuring process failed.
        ValueError: A variant or setting that needs its own process while `cfg.isolate` is off.
    """
    result = once_more_under_load(lambda: _measure(variant, inputs, cfg), variant.name,
                                  _load_words, cfg.max_background_cores, logger)
    if cfg.thread_sweep:
        result = with_thread_sweep(variant, inputs, cfg, result)
    logger.info(
        "%s: %s val %s test %s, p50 %.3f ms, first inference %.1f ms, peak RSS %.0f MB, "
        "%d bytes", variant.name, result.metric, _figure(result.val_accuracy),
        _figure(result.accuracy),
        result.latency_ms.p50, result.first_inference_ms, result.peak_rss_mb, result.size_bytes,
    )
    return result


def _figure(accuracy: float | None) -> str:
    return "-" if accuracy is None else f"{accuracy:.4f}"
