"""A benchmark knows how busy the machine was: measured load, a retry under load, pinning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tasks.benchmark_variant import benchmark_variant
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tfopt.artifacts import VariantSpec
from tfopt.config import BenchmarkConfig, resolve_cpus
from tfopt.measurement.machine_load import (
    LoadProbe,
    background_cores,
    machine_busy_seconds,
    own_cpu_seconds,
)
from tfopt.provenance import environment


@contextmanager
def _a_busy_neighbour() -> Iterator[None]:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def test_the_load_probe_counts_other_processes_not_its_own():
    with _a_busy_neighbour():
        assert background_cores(1.0) >= 0.5
    probe = LoadProbe.start()
    while time.monotonic() < probe.wall + 0.5:
        pass
    wall = time.monotonic() - probe.wall
    machine_cores = (machine_busy_seconds() - probe.busy) / wall
    others, own_cores = probe.cores(), (own_cpu_seconds() - probe.own) / wall
    assert others is not None and own_cores > 0.1
    assert machine_cores - others == pytest.approx(own_cores, abs=0.15), "own work is not load"


def _graph_spec(tiny_baseline):
    return VariantSpec(name="baseline-graph", source="baseline", format="graph",
                       precision="fp32", path=tiny_baseline.path)


def test_a_variant_timed_under_load_is_measured_again_and_marked(tiny_baseline, tiny_dataset,
                                                                 tmp_path):
    inputs = prepare_benchmark_inputs.fn(None, tiny_dataset, tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=2,
                          isolate=False, max_background_cores=0.3)
    with _a_busy_neighbour():
        loaded = benchmark_variant.fn(_graph_spec(tiny_baseline), inputs, cfg)
    assert loaded.load_retried and loaded.under_load
    assert max(loaded.background_cores_before, loaded.background_cores) > 0.3


def test_benchmark_cpus_are_checked_and_pin_the_measuring_process(tiny_baseline, tiny_dataset,
                                                                  tmp_path):
    with pytest.raises(ValueError, match=r"CPUs \[4096\] are not available on this machine"):
        resolve_cpus(BenchmarkConfig(cpus=[0, 4096]).cpus)
    available = sorted(os.sched_getaffinity(0))
    assert resolve_cpus([-1]) == [available[-1]], "-1 is the last CPU"
    assert resolve_cpus([-1, available[-1]]) == [available[-1]]
    with pytest.raises(ValueError, match=r"CPUs \[-4096\] are not available on this machine"):
        resolve_cpus([-4096])
    with pytest.raises(ValueError, match="name a CPU twice"):
        BenchmarkConfig(cpus=[0, 0])
    inputs = prepare_benchmark_inputs.fn(None, tiny_dataset, tmp_path / "inputs")
    elsewhere = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=2,
                                cpus=[4096])
    with pytest.raises(RuntimeError, match=r"CPUs \[4096\] are not available on this machine"):
        benchmark_variant.fn(_graph_spec(tiny_baseline), inputs, elsewhere)
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=2, cpus=[0])
    result = benchmark_variant.fn(_graph_spec(tiny_baseline), inputs, cfg)
    assert result.status == "ok" and result.timed_runs >= 10
    with pytest.raises(ValueError, match=r"benchmark\.cpus needs benchmark\.isolate"):
        benchmark_variant.fn(_graph_spec(tiny_baseline), inputs,
                             cfg.model_copy(update={"isolate": False}))
    header = environment(2, None, [0])
    assert header["benchmark_cpus"] == "0" and "load_average_1m_5m" in header
