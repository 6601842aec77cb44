from __future__ import annotations

import numpy as np
import pytest

from tasks.benchmark_worker import latency_stats, time_runs
from tasks.pick_champion import choose_champion
from tfopt.artifacts import LatencyStats, VariantResult


def test_latency_stats_on_known_samples():
    stats = latency_stats(np.arange(1, 101, dtype=float))
    assert stats.p50 == pytest.approx(50.5)
    assert stats.p90 == pytest.approx(90.1)
    assert stats.p99 == pytest.approx(99.01)
    assert stats.mean == pytest.approx(50.5)
    assert stats.std == pytest.approx(np.std(np.arange(1, 101)))


def test_warmup_runs_are_excluded_from_the_timed_samples():
    calls = []
    samples = time_runs(calls.append, warmup_runs=7, min_runs=20, max_seconds=60)
    assert len(calls) == 27 and len(samples) == 20
    assert calls[:7] == list(range(7)), "warm-up runs come first"


def test_time_budget_stops_a_slow_variant_early():
    import time

    samples = time_runs(lambda _: time.sleep(0.02), warmup_runs=1, min_runs=1000,
                        max_seconds=0.1)
    assert 1 <= len(samples) < 20


def _result(name, accuracy, p50, status="ok", source=None):
    return VariantResult(
        name=name, source=source or name.split("-")[0], format="tflite", precision="fp32",
        status=status, accuracy=accuracy,
        latency_ms=LatencyStats(p50=p50, p90=p50, p99=p50, mean=p50, std=0.0)
        if status == "ok" else None,
    )


def test_champion_is_the_fastest_within_the_accuracy_budget():
    results = [
        _result("baseline-graph", 0.950, 2.0),
        _result("baseline-tflite-fp32", 0.950, 0.5),
        _result("pruned-tflite-int8", 0.930, 0.1),
        _result("qat-tflite-int8", 0.945, 0.3),
        _result("broken-tflite-int8", 0.0, 0.0, status="failed"),
    ]
    choice = choose_champion(results, budget_points=1.0)
    assert choice.name == "qat-tflite-int8"
    assert choice.baseline_accuracy == 0.95


def test_no_variant_within_budget_is_a_clear_result_not_a_crash():
    results = [_result("baseline-graph", 0.95, 2.0), _result("tiny-tflite-int8", 0.5, 0.1)]
    results[0] = results[0].model_copy(update={"status": "failed", "latency_ms": None})
    choice = choose_champion(results, budget_points=1.0)
    assert choice.name is None and "baseline" in choice.reason
    only_bad = [_result("baseline-graph", 0.95, 2.0), _result("x-tflite-int8", 0.5, 0.1)]
    assert choose_champion(only_bad, budget_points=0.0).name == "baseline-graph"
    assert choose_champion([], budget_points=1.0).reason == "no variant finished"
