"""Steps shared by the flows: cached preprocessing and serialized benchmarks."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.states import State

from tasks.benchmark_variant import benchmark_variant
from tasks.write_tfrecords import is_intact, write_tfrecords
from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, VariantSpec
from tfopt.config import BenchmarkConfig, DataConfig
from tfopt.orchestration import benchmark_slot


def sharded_data(cfg: DataConfig, work_dir: Path) -> DatasetArtifact:
    """The data set's shards through Prefect's cache; written again if cached files are gone."""
    dataset = write_tfrecords(cfg, work_dir)
    if is_intact(dataset):
        return dataset
    get_run_logger().warning(
        "the cached shards of %s are gone from %s; writing them again", cfg.source_dir,
        dataset.root,
    )
    return write_tfrecords.with_options(refresh_cache=True)(cfg, work_dir)


def benchmark_serialized(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> State:
    """Benchmark one variant while holding the machine's benchmark slot; return its final state."""
    with benchmark_slot():
        return benchmark_variant(spec, inputs, cfg, return_state=True)
