"""Steps shared by the flows: cached preprocessing, conversions, serialized benchmarks."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.futures import PrefectFuture
from prefect.states import State

from tasks.benchmark_variant import benchmark_variant
from tasks.convert_tflite import convert_tflite
from tasks.write_tfrecords import is_intact, write_tfrecords
from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, ModelArtifact, VariantSpec
from tfopt.config import BenchmarkConfig, ConvertConfig, DataConfig, ScaleConfig
from tfopt.orchestration import benchmark_slot
from tfopt.variants import failed


def sharded_data(
    cfg: DataConfig, work_dir: Path, scale: ScaleConfig | None = None
) -> DatasetArtifact:
    """The data set's shards through Prefect's cache; written again if cached files are gone."""
    dataset = write_tfrecords(cfg, work_dir, scale)
    if is_intact(dataset):
        return dataset
    get_run_logger().warning(
        "the cached shards of %s are gone from %s; writing them again", cfg.source_dir,
        dataset.root,
    )
    return write_tfrecords.with_options(refresh_cache=True)(cfg, work_dir, scale)


def benchmark_serialized(
    spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
) -> State:
    """Benchmark one variant while holding the machine's benchmark slot; return its final state."""
    with benchmark_slot(spec.name):
        return benchmark_variant(spec, inputs, cfg, return_state=True)


def error_of(state: State) -> str:
    """The exception (type and message) a failed state holds."""
    error = state.result(raise_on_failure=False)
    return f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)


def built_or_failed(state: State, planned: VariantSpec) -> VariantSpec:
    """A conversion's variant, or the planned one marked failed with the conversion's error."""
    return state.result() if state.is_completed() else failed(planned, error_of(state))


def final_state(future: PrefectFuture) -> State:
    """Wait for a submitted task and return its final state (failures are not raised)."""
    future.wait()
    return future.state


def tflite_conversions(
    savedmodel: ModelArtifact,
    planned: list[VariantSpec],
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    variants_dir: Path,
    *,
    submit: bool = False,
) -> list[VariantSpec]:
    """TFLite conversions of one SavedModel; a conversion that fails becomes a failed variant.

    Args:
        savedmodel: The converter's input.
        planned: The TFLite variants to build (one per precision).
        dataset: Training examples calibrate int8.
        cfg: Converter settings.
        variants_dir: Where the .tflite files go.
        submit: Submit the conversions to the flow's task runner (they may run at once)
            instead of running them one after another here.
    """
    if submit:
        futures = [convert_tflite.submit(savedmodel, spec, dataset, cfg, variants_dir)
                   for spec in planned]
        states = [final_state(future) for future in futures]
    else:
        states = [convert_tflite(savedmodel, spec, dataset, cfg, variants_dir,
                                 return_state=True) for spec in planned]
    return [built_or_failed(state, spec) for state, spec in zip(states, planned, strict=True)]
