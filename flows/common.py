"""Steps shared by the flows: cached preprocessing, conversions, serialized benchmarks."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.futures import PrefectFuture
from prefect.states import State

from tasks.benchmark_variant import benchmark_variant
from tasks.convert_tflite import convert_tflite
from tasks.write_tfrecords import is_intact, write_tfrecords
from tfopt.artifacts import (
    BenchmarkInputs,
    DatasetArtifact,
    ModelArtifact,
    Precision,
    VariantSpec,
)
from tfopt.config import BenchmarkConfig, ConvertConfig, DataConfig
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


def error_of(state: State) -> str:
    """The exception (type and message) a failed state holds."""
    error = state.result(raise_on_failure=False)
    return f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)


def failed_variant(spec: VariantSpec, error: str) -> VariantSpec:
    """`spec` marked failed with `error`, without a file."""
    return spec.model_copy(update={"status": "failed", "error": error, "path": None})


def built_or_failed(state: State, planned: VariantSpec) -> VariantSpec:
    """A conversion's variant, or the planned one marked failed with the conversion's error."""
    return state.result() if state.is_completed() else failed_variant(planned, error_of(state))


def final_state(future: PrefectFuture) -> State:
    """Wait for a submitted task and return its final state (failures are not raised)."""
    future.wait()
    return future.state


def tflite_conversions(
    source: ModelArtifact,
    savedmodel: ModelArtifact,
    precisions: list[Precision],
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    variants_dir: Path,
    *,
    submit: bool = False,
) -> list[VariantSpec]:
    """TFLite conversions of one SavedModel; a conversion that fails becomes a failed variant.

    Args:
        source: The model the variants are named after.
        savedmodel: Its SavedModel export (the converter's input).
        precisions: One variant per precision.
        dataset: Training examples calibrate int8.
        cfg: Converter settings.
        variants_dir: Where the .tflite files go.
        submit: Submit the conversions to the flow's task runner (they may run at once)
            instead of running them one after another here.
    """
    planned = [VariantSpec(name=f"{source.name}-tflite-{precision}", source=source.name,
                           format="tflite", precision=precision, path=None)
               for precision in precisions]
    if submit:
        futures = [convert_tflite.submit(savedmodel, precision, dataset, cfg, variants_dir)
                   for precision in precisions]
        states = [final_state(future) for future in futures]
    else:
        states = [convert_tflite(savedmodel, precision, dataset, cfg, variants_dir,
                                 return_state=True) for precision in precisions]
    return [built_or_failed(state, spec) for state, spec in zip(states, planned, strict=True)]
