"""Steps shared by the flows: cached preprocessing, building planned variants, benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.states import State

from tasks.benchmark_variant import benchmark_variant
from tasks.build_variant import build_variant
from tasks.write_tfrecords import write_tfrecords
from tfopt.artifacts import (
    BenchmarkInputs,
    DatasetArtifact,
    ModelArtifact,
    TrainingData,
    VariantResult,
    VariantSpec,
)
from tfopt.config import BenchmarkConfig, DataConfig, ScaleConfig
from tfopt.data.shards import is_intact
from tfopt.orchestration import benchmark_slot, error_of, final_state
from tfopt.runtimes import runtime_of, settings_of
from tfopt.runtimes.base import BuildSources
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


def benchmark_one(spec: VariantSpec, inputs: BenchmarkInputs, cfg: BenchmarkConfig
                  ) -> VariantResult:
    """A built variant's measurements; one not built (or whose benchmark failed) keeps why."""
    if spec.status == "ok":
        state = benchmark_serialized(spec, inputs, cfg)
        if state.is_completed():
            return state.result()
        spec = failed(spec, error_of(state))
    return VariantResult(name=spec.name, source=spec.source, format=spec.format,
                         precision=spec.precision, status=spec.status, error=spec.error,
                         derived_from=spec.derived_from)


def built_or_failed(state: State, planned: VariantSpec) -> VariantSpec:
    """A build's variant, or the planned one marked failed with the build's error."""
    return state.result() if state.is_completed() else failed(planned, error_of(state))


def build_sources(model: ModelArtifact, savedmodel: ModelArtifact | None, data: TrainingData,
                  config: Any, out_dir: Path) -> BuildSources:
    """What the runtimes convert a model's variants from, with the run's shared settings."""
    return BuildSources(model=model, savedmodel=savedmodel, dataset=data.dataset,
                        out_dir=out_dir,
                        calibration_examples=config.convert.calibration_examples,
                        accuracy_budget_points=config.benchmark.accuracy_budget_points,
                        judged_by=config.eval,
                        threads=config.benchmark.threads)


def build_forms(planned: list[VariantSpec], sources: BuildSources, config: Any, *,
                submit: bool = False) -> list[VariantSpec]:
    """Build one model's planned variants with their runtimes; a failure becomes that variant's.

    Variants that convert the model itself are built first (submitted to the flow's task runner
    at once when `submit`, else one after another here), then those that convert another
    variant (a quantized ONNX file from the float one), which then gets the built one.

    Args:
        planned: The variants, in plan order (skipped ones are kept as they are).
        sources: The model, its SavedModel, the data set and the output folder.
        config: The pipeline configuration (each runtime's settings).
        submit: Submit the independent builds to the task runner (they may run at once).

    Returns:
        The variants in plan order, built, skipped or failed.
    """
    done: dict[str, VariantSpec] = {s.name: s for s in planned if s.status != "ok"}
    todo = [s for s in planned if s.status == "ok"]
    first = [s for s in todo if runtime_of(s.format).builds_from(s) is None]
    if submit:
        futures = {s.name: build_variant.submit(s, sources, _settings(s, config)) for s in first}
        done.update({s.name: built_or_failed(final_state(futures[s.name]), s) for s in first})
    else:
        for spec in first:
            done[spec.name] = _build(spec, sources, config)
    for spec in todo:
        if spec.name not in done:
            with_built = sources.model_copy(update={"built": {**sources.built, **done}})
            done[spec.name] = _build(spec, with_built, config)
    return [done[spec.name] for spec in planned]


def _build(spec: VariantSpec, sources: BuildSources, config: Any) -> VariantSpec:
    state = build_variant(spec, sources, _settings(spec, config), return_state=True)
    return built_or_failed(state, spec)


def _settings(spec: VariantSpec, config: Any) -> Any:
    return settings_of(runtime_of(spec.format), config)
