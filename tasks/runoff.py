"""The run-off: the contenders for champion timed again side by side, in one process.

Each variant is timed on its own turn, minutes apart from the others. On a shared machine the
speed moves between turns (a neighbour's load, the host's frequency, another VM on the sibling
hyperthread): measured here, the same LiteRT file read 0.17 ms on one turn and 0.23 ms on the
next, and two int8 files of the same network 0.057 and 0.078 ms on their turns but 0.076 and
0.073 ms side by side. Each turn's interval is narrow, so such a drift picks the champion. The
run-off takes the LiteRT and ONNX Runtime variants within `benchmark.runoff_margin` of the
fastest eligible one (at most `MAX_CONTENDERS`), loads them all in one fresh process, warms
them all in an untimed round and times them in 6 rounds that alternate between them (the
order rotates each round), so a drift reaches all of them alike. A contender's run-off p50 is
the median of its round p50s and its interval their range, the same distribution-free 96.9%
interval as a turn's windows.

TensorFlow-format variants stay out: a process cannot hold both XLA auto-clustering's flags and
the others, and on CPU they are rarely near the fastest.
"""

from __future__ import annotations

from prefect import task

from tasks.benchmark_worker import measure_runoff
from tasks.pick_champion import baseline_accuracy, within_budget
from tfopt.artifacts import BenchmarkInputs, Runoff, VariantResult, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.logs import step_logger

RUNOFF_FORMATS = frozenset({"tflite", "onnx"})
MAX_CONTENDERS = 4


def runoff_contenders(results: list[VariantResult], cfg: BenchmarkConfig) -> list[VariantResult]:
    """The LiteRT and ONNX Runtime variants near the fastest eligible one, fastest first.

    Near: a p50 within the margin of the upper end of the fastest's p50 interval, so an
    unsettled fastest (a wide interval) draws its likely rivals into the run-off. None (an
    empty list) unless the objective is p50, a margin is set and at least two variants qualify.
    """
    reference = baseline_accuracy(results)
    if cfg.objective != "p50" or cfg.runoff_margin is None or reference is None:
        return []
    eligible = sorted(
        (r for r in results if r.format in RUNOFF_FORMATS and r.path is not None
         and within_budget(r, reference, cfg.accuracy_budget_points)),
        key=lambda r: r.latency_ms.p50)
    if not eligible:
        return []
    fastest = eligible[0].latency_ms
    upper = fastest.p50_ci95[1] if fastest.p50_ci95 else fastest.p50
    limit = max(fastest.p50, upper) * (1.0 + cfg.runoff_margin)
    near = [r for r in eligible if r.latency_ms.p50 <= limit][:MAX_CONTENDERS]
    return near if len(near) >= 2 else []


def _spec_of(result: VariantResult) -> VariantSpec:
    return VariantSpec(name=result.name, source=result.source, format=result.format,
                       precision=result.precision, path=result.path,
                       derived_from=result.derived_from)


@task(name="run_off", tags=["benchmark"])
def run_off(results: list[VariantResult], inputs: BenchmarkInputs,
            cfg: BenchmarkConfig) -> Runoff | None:
    """Time the contenders for champion again side by side (see the module's note).

    A run-off that cannot run (a process that fails) is logged and skipped: the champion is
    then chosen on the variants' own turns, as without one.

    Args:
        results: Every benchmarked variant.
        inputs: The test inputs every variant was timed on.
        cfg: The protocol, `objective`, `accuracy_budget_points` and `runoff_margin`.

    Returns:
        The contenders' round p50s, or None when there was no run-off.
    """
    from tasks.benchmark_variant import run_worker, worker_env

    contenders = runoff_contenders(results, cfg)
    if not contenders:
        return None
    specs = [_spec_of(result) for result in contenders]
    logger = step_logger()
    try:
        if cfg.isolate:
            request = {"specs": [spec.model_dump(mode="json") for spec in specs],
                       "inputs": inputs.model_dump(mode="json"),
                       "cfg": cfg.model_dump(mode="json")}
            runoff = Runoff.model_validate_json(
                run_worker("tasks.benchmark_worker", request, worker_env(specs[0])))
        else:
            runoff = measure_runoff(specs, inputs, cfg)
    except (RuntimeError, OSError) as error:
        logger.warning("run-off of %s skipped: %s", ", ".join(s.name for s in specs), error)
        return None
    logger.info("run-off, %d alternating rounds: %s", runoff.rounds, "; ".join(
        f"{name} p50 {runoff.p50(name):.4f} ms ({low:.4f}-{high:.4f}), on its turn "
        f"{result.latency_ms.p50:.4f}"
        for result in contenders
        for name, (low, high) in [(result.name, runoff.interval(result.name))]))
    return runoff
