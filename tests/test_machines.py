"""A worker's benchmark settings and the benchmark inputs another machine repeats."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from flows.parameters import BenchmarkOnlyConfig
from tfopt.artifacts import BenchmarkInputs
from tfopt.config import BenchmarkConfig, ConfigError, resolve_cpus
from tfopt.machines import machine_protocol, machine_settings
from tfopt.measurement.inputs import read_inputs_index, write_inputs_index


def test_a_workers_settings_apply_on_top_of_the_pipelines_protocol():
    settings = machine_settings({"benchmark.threads": 1, "benchmark.cpus": [0]})
    config = BenchmarkOnlyConfig.model_validate({"machine": settings})
    assert config.machine.model_dump(exclude_none=True) == {"threads": 1, "cpus": [0]}, \
        "a typed flow run parameter"
    pipeline = BenchmarkConfig(threads=2, min_runs=30, p50_ci_width=0.25)
    here = machine_protocol(pipeline, config.machine)
    assert (here.threads, here.cpus) == (1, [0])
    assert (here.min_runs, here.p50_ci_width) == (30, 0.25), "the rest is the pipeline's"
    assert machine_protocol(pipeline, None) == pipeline
    pinned_there = BenchmarkConfig(cpus=[0])
    assert machine_protocol(pinned_there, None).cpus is None, "another machine's CPUs do not apply"


def test_cpu_numbers_are_checked_where_they_are_used_not_where_they_are_written():
    elsewhere = BenchmarkConfig.model_validate({"cpus": [4096, -1]})
    assert elsewhere.cpus == [4096, -1], "a protocol from a larger machine still loads here"
    with pytest.raises(ConfigError, match=r"CPUs \[4096\] are not available on this machine"):
        resolve_cpus(elsewhere.cpus)
    assert resolve_cpus([-1]) == [max(os.sched_getaffinity(0))]
    with pytest.raises(ValueError, match="no_such are not benchmark settings"):
        BenchmarkOnlyConfig.model_validate({"machine": {"no_such": 1}})


@pytest.mark.parametrize(("pairs", "message"), [
    ({"train.epochs": 1}, "benchmark.<field> only"),
    ({"benchmark.no_such": 1}, "benchmark.<field> only"),
    ({"benchmark.threads": 0}, "threads"),
    ({"benchmark.cpus": [4096]}, "not available"),
])
def test_a_worker_refuses_settings_that_are_not_a_valid_benchmark_field(pairs, message):
    with pytest.raises(ConfigError, match=message):
        machine_settings(pairs)


def test_the_inputs_index_moves_with_its_folder(tmp_path):
    folder = tmp_path / "here" / "benchmark-inputs"
    (folder / "harness-floor").mkdir(parents=True)
    for name in ("test-images.npy", "test-labels.npy", "ref-reference-logits.npy"):
        np.save(folder / name, np.zeros(2))
    (folder / "harness-floor" / "floor.tflite").write_bytes(b"x")
    inputs = BenchmarkInputs(images=folder / "test-images.npy", labels=folder / "test-labels.npy",
                             reference_logits=folder / "ref-reference-logits.npy", examples=2,
                             batch_size=8,
                             floor_models={"tflite": folder / "harness-floor" / "floor.tflite"})
    index = write_inputs_index(inputs, BenchmarkConfig(threads=3))
    assert str(tmp_path) not in index.read_text(), "paths are relative to the folder"
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    read, protocol = read_inputs_index(moved)
    assert read.images == moved / "test-images.npy" and read.images.is_file()
    assert read.floor_models["tflite"].is_file() and read.reference_logits.is_file()
    assert (read.examples, read.batch_size, protocol.threads) == (2, 8, 3)
    assert json.loads((moved / index.name).read_text())["protocol"]["threads"] == 3


@pytest.mark.parametrize("run", ["abc", "runs:/x", "0" * 31])
def test_a_pipeline_run_must_be_an_mlflow_run_id(run):
    with pytest.raises(ValueError, match="pipeline_run"):
        BenchmarkOnlyConfig(pipeline_run=run)
