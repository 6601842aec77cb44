"""MLPerf LoadGen's Offline and Server scenarios, driven for real (mlcommons-loadgen)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import ValidationError

from tfopt.config import BenchmarkConfig
from tfopt.measurement.load_scenarios import offline_throughput, server_search, server_trial


def _service(seconds: float):
    """A client that takes `seconds` per query (a stand-in SUT of known capacity)."""
    return lambda _prepared: time.sleep(seconds)


def test_a_server_rate_beyond_capacity_misses_the_budget():
    prepared = list(range(16))
    slow = server_trial([_service(0.005)], prepared, target_qps=600, budget_ms=100, seconds=1)
    assert not slow.within(100), "one client of 5 ms cannot serve 600 queries/s: a queue grows"
    easy = server_trial([_service(0.005)], prepared, target_qps=40, budget_ms=100, seconds=1)
    assert easy.within(100) and easy.p99_ms >= 5, "never faster than the service time"


def test_the_search_finds_a_rate_within_the_budget_and_below_capacity():
    found = server_search([_service(0.004)], list(range(16)), budget_ms=60, first_qps=50,
                          seconds=0.5)
    assert found is not None and found.p99_ms <= 60
    assert found.completed_qps < 250, "one 4 ms client serves fewer than 250 queries/s"
    # The search stops within 10% of the edge; a short run's Poisson draw adds some slack.
    assert 50 <= found.target_qps < 300


def test_the_search_comes_down_from_a_start_far_beyond_capacity():
    # 16x capacity: halving 3 times (the old floor of first_qps / 8) would never get there.
    found = server_search([_service(0.004)], list(range(16)), budget_ms=60, first_qps=4_000,
                          seconds=0.2)
    assert found is not None, "a 4 ms client serves ~250 queries/s; the search must get there"
    assert found.target_qps < 300 and found.p99_ms <= 60


def test_offline_reports_the_best_batch_size():
    def predict(batch: np.ndarray) -> None:
        time.sleep(0.002 + 0.0001 * len(batch))  # a fixed cost per call: batches pay off

    rate, batch_size = offline_throughput(predict, np.zeros((64, 2), np.float32), [1, 32],
                                          expected_per_s=2000, seconds=0.3)
    assert batch_size == 32 and rate > 1000


def test_server_scenario_settings_are_checked_at_the_edge():
    with pytest.raises(ValidationError, match="latency_budget_ms"):
        BenchmarkConfig(scenarios=["single_stream", "server"])
    with pytest.raises(ValidationError, match="server"):
        BenchmarkConfig(objective="throughput_under_budget")
    assert BenchmarkConfig(scenarios=["server"], latency_budget_ms=5,
                           objective="throughput_under_budget").server_clients == 2
