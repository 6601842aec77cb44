"""The runtime contract: each runtime is one module and one config section, in the registry."""

from __future__ import annotations

import pkgutil

import numpy as np
import pytest

import tfopt.runtimes
from flows.parameters import PipelineConfig
from tasks.build_variant import build_variant
from tfopt.artifacts import VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.cpu_features import bf16_unavailable_reason
from tfopt.measurement.inputs import prepare_inputs
from tfopt.measurement.worker import measure_variant
from tfopt.runtimes import (
    ConvertConfig,
    build_here,
    known_formats,
    plan_forms,
    registry,
    runtime_of,
    runtimes_config_class,
    settings_of,
)
from tfopt.runtimes.base import BuildSources, PlanRequest, Runtime
from tfopt.variants import plan_variant


def test_every_runtime_module_is_registered_and_claims_its_own_formats():
    modules = {info.name for info in pkgutil.iter_modules(tfopt.runtimes.__path__)
               if info.name != "base" and not info.name.startswith("_")}
    assert set(registry()) == modules
    claimed = [fmt for runtime in registry().values() for fmt in runtime.formats]
    assert len(claimed) == len(set(claimed)) == len(known_formats())
    for runtime in registry().values():
        assert isinstance(runtime, Runtime)
        assert all(runtime_of(fmt) is runtime for fmt in runtime.formats)
        if runtime.home == "convert" and runtime.section is not None:
            assert issubclass(ConvertConfig, runtime.section), "its keys stay under convert"


def test_a_baseline_is_planned_from_every_runtime_and_a_given_file_by_its_own():
    config = PipelineConfig()
    keras = plan_forms(PlanRequest(source="baseline", kind="keras"), config)
    assert {spec.format for spec in keras if spec.status == "ok"} == known_formats()
    names = [spec.name for spec in keras]
    assert len(names) == len(set(names)), "each variant once"
    given = plan_forms(PlanRequest(source="baseline", kind="tflite", precision="int8"), config)
    ok = [spec for spec in given if spec.status == "ok"]
    assert [(s.name, s.format) for s in ok] == [("baseline-tflite-int8", "tflite")]
    assert all("benchmarked as it is" in s.error for s in given if s.status == "skipped")
    # The bfloat16 graph (convert.bfloat16, on by default): skipped, with why, on a CPU without
    # bfloat16 instructions (measured: tests/tasks/test_quantization_and_export.py)
    (bf16,) = [spec for spec in keras if spec.name == "baseline-graph-bfloat16"]
    assert bf16.derived_from == "baseline-graph"
    reason = bf16_unavailable_reason()
    assert (bf16.status, bf16.error) == (("skipped", reason) if reason else ("ok", None))


FICTITIOUS_RUNTIME = '''
"""ONNX's reference evaluator: the walk-through of docs/runtimes.md, as a test writes it.

It runs the checked ONNX export with `onnx.reference.ReferenceEvaluator` (pure NumPy, slow):
a runtime of its own, planned, built, opened and measured through the contract.
"""

from pathlib import Path
from typing import Any

from pydantic import Field

from tfopt.artifacts import VariantSpec
from tfopt.runtimes.base import (
    BuildSources, PlanRequest, Runner, Runtime, RuntimeSection, TensorInfo, batch_one,
    required,
)
from tfopt.variants import built


class ReferenceSettings(RuntimeSection):
    """Whether to measure ONNX's reference evaluator."""

    enabled: bool = Field(True, description="Measure the ONNX export with ONNX's evaluator.")


class ReferenceRunner(Runner):
    def __init__(self, path: Path) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.load(str(path))
        self._evaluator = ReferenceEvaluator(model)

        def info(value: Any) -> TensorInfo:
            dims = value.type.tensor_type.shape.dim
            return TensorInfo(value.name, tuple(d.dim_value or None for d in dims), "float32")

        self.inputs = tuple(info(value) for value in model.graph.input)
        self.outputs = tuple(info(value) for value in model.graph.output)

    def _run(self, feeds):
        values = self._evaluator.run(None, dict(feeds))
        return dict(zip([o.name for o in self.outputs], values, strict=True))

    def _prepare(self, feeds):
        return batch_one(feeds)

    def invoke(self, prepared):
        return self._evaluator.run(list(self.fetched), prepared)


class OnnxReference(Runtime):
    name = "onnxref"
    formats = frozenset({"onnxref"})
    section = ReferenceSettings
    order = 90

    def plan(self, request: PlanRequest, settings: ReferenceSettings) -> list[VariantSpec]:
        if request.compressed or request.kind != "keras" or not settings.enabled:
            return []
        onnx = self.variant_name(request.source, "onnx", "fp32")
        return [self.variant(request.source, "onnxref", derived_from=onnx)]

    def builds_from(self, spec: VariantSpec) -> str | None:
        return spec.derived_from

    def build(self, spec: VariantSpec, sources: BuildSources, settings: Any) -> VariantSpec:
        return built(spec, required(sources, spec.derived_from).path)

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        return ReferenceRunner(spec.path)


RUNTIME = OnnxReference()
'''


@pytest.fixture()
def fictitious_runtime(tmp_path, monkeypatch):
    """The walk-through's runtime module in a folder the registry searches, for one test."""
    (tmp_path / "onnxref.py").write_text(FICTITIOUS_RUNTIME)
    monkeypatch.setattr(tfopt.runtimes, "__path__", [*tfopt.runtimes.__path__, str(tmp_path)])
    registry.cache_clear()
    yield registry()["onnxref"]
    registry.cache_clear()


def test_a_new_runtime_is_one_module_and_one_config_section(
        fictitious_runtime, tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path):
    runtimes = runtimes_config_class().model_validate({"onnxref": {"enabled": True}})
    config = PipelineConfig.model_construct(runtimes=runtimes)
    assert settings_of(fictitious_runtime, config).enabled, "runtimes.onnxref is its section"
    planned = plan_forms(PlanRequest(source="baseline", kind="keras"), config)
    (reference,) = [spec for spec in planned if spec.format == "onnxref"]
    assert (reference.name, reference.derived_from) == ("baseline-onnxref", "baseline-onnx")
    assert planned[-1] == reference, "its order places it last"

    sources = BuildSources(model=tiny_baseline, savedmodel=tiny_savedmodel,
                           dataset=tiny_dataset, out_dir=tmp_path)
    onnx = build_variant.fn(plan_variant("baseline", "onnx"), sources, ConvertConfig())
    # Built here, not in a child process: a child does not see this test's registry.
    made = build_here(reference, sources.model_copy(update={"built": {onnx.name: onnx}}),
                      settings_of(fictitious_runtime, config))
    assert made.path == onnx.path and made.status == "ok"
    inputs = prepare_inputs(None, tiny_dataset, tmp_path / "inputs", 8, "unit")
    protocol = BenchmarkConfig(warmup_runs=2, warmup_seconds=0.0, min_runs=6, min_seconds=0.05,
                               max_seconds=0.5, threads=1, isolate=False, p50_ci_width=1.0)
    measured = measure_variant(made, inputs, protocol)
    ours = measure_variant(onnx, inputs, protocol)
    assert measured.format == "onnxref" and measured.latency_ms.p50 > 0
    assert measured.accuracy == pytest.approx(ours.accuracy)
    assert measured.gflops_per_inference is None and measured.op_profile.method == "no profiler"
    images = np.load(inputs.images)
    np.testing.assert_allclose(fictitious_runtime.load_runner(made).predict(images),
                               runtime_of("onnx").load_runner(onnx).predict(images), atol=1e-4)
    assert VariantSpec.model_validate(made.model_dump()).format == "onnxref"


def test_trtexec_builds_one_shape_profile_per_named_input():
    from tfopt.runtimes.tensorrt import trtexec_command

    command = trtexec_command({"numbers": [6], "category": []}, 64)
    assert ("--minShapes=numbers:1x6,category:1 --optShapes=numbers:16x6,category:16 "
            "--maxShapes=numbers:64x6,category:64 --fp16") in command
    assert "--minShapes=images:1x32x32x3 " in trtexec_command({"images": [32, 32, 3]}, 8)


def test_the_tflite_converters_pages_of_diagnostics_become_its_last_error_in_one_line():
    from tfopt.runtimes._litert_files import converter_reason

    message = ("ConverterError: <unknown>:0: error: loc(callsite(fused[\"A:\", \"b(c)\"] at d)): "
               "'tf.TensorListReserve' op requires element_shape to be static\n"
               "<unknown>:0: note: loc(fused[\"x\"]): called from\n"
               "<unknown>:0: error: Lowering tensor list ops is failed. Please consider ...\n")
    assert converter_reason(message) == "Lowering tensor list ops is failed. Please consider ..."
    assert converter_reason("error: loc(a(b)): the op is bad") == "the op is bad"
    assert converter_reason("no diagnostics\nat all") == "no diagnostics"
