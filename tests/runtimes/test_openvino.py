"""OpenVINO on the runtime contract, and LiteRT's second API (CompiledModel)."""

from __future__ import annotations

import numpy as np
import pytest

from flows.parameters import PipelineConfig
from tasks.benchmark_variant import benchmark_variant
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tests.steps import build, to_tflite
from tfopt.artifacts import VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.cpu_features import bf16_unavailable_reason
from tfopt.data.pipeline import load_split
from tfopt.eval.metrics import accuracy_budget
from tfopt.report.markdown import api_lines, runtime_lines
from tfopt.report.summary import variant_entry
from tfopt.runtimes import (
    ConvertConfig,
    compressed_forms,
    load_runner,
    plan_forms,
    plan_variant,
    registry,
)
from tfopt.runtimes import openvino as openvino_module
from tfopt.runtimes.base import PlanRequest, softmax
from tfopt.runtimes.litert import CompiledModelRunner, TFLiteRunner
from tfopt.runtimes.openvino import OpenVINOSettings
from tfopt.runtimes.tensorflow import SavedModelRunner

OPENVINO = registry()["openvino"]


@pytest.fixture(scope="module")
def test_split(tiny_dataset):
    return load_split(tiny_dataset, "test")


@pytest.fixture(scope="module")
def openvino_fp32(tiny_savedmodel, tiny_dataset, tmp_path_factory) -> VariantSpec:
    spec = plan_variant("baseline", "openvino", derived_from="baseline-savedmodel")
    return build(spec, tiny_savedmodel, tiny_dataset, OpenVINOSettings(),
                 tmp_path_factory.mktemp("openvino"))


def test_openvino_fp32_agrees_with_the_float_model(openvino_fp32, tiny_savedmodel, test_split):
    images, _ = test_split
    runner = load_runner(openvino_fp32)
    assert runner.facts() == {"inference_precision": "f32"}
    reference = SavedModelRunner(tiny_savedmodel.path).predict(images)
    scores = runner.predict(images)
    assert np.mean(np.argmax(scores, 1) == np.argmax(reference, 1)) >= 0.99
    assert np.max(np.abs(softmax(scores) - softmax(reference))) < 1e-4
    assert openvino_fp32.params["converter"] == "openvino.convert_model"
    # Batch 1 (the timed request, a static shape) answers as the dynamic batch does.
    single = runner.invoke(runner.prepare(images[:1])[0])
    np.testing.assert_allclose(np.asarray(single)[0], scores[0], atol=1e-5)


def test_openvino_int8_stays_within_the_accuracy_budget(openvino_fp32, tiny_savedmodel,
                                                        tiny_dataset, test_split, tmp_path):
    spec = plan_variant("baseline", "openvino", "int8", derived_from=openvino_fp32.name)
    int8 = build(spec, tiny_savedmodel, tiny_dataset, OpenVINOSettings(), tmp_path,
                 built={openvino_fp32.name: openvino_fp32}, budget_points=1.0)
    assert int8.status == "ok", int8.error
    assert int8.params["quantizer"].startswith("nncf.quantize")
    drop = int8.params["val_accuracy_float"] - int8.params["val_accuracy_int8"]
    assert drop <= 0.01 + 1e-9, int8.params
    images, labels = test_split
    float_accuracy = np.mean(np.argmax(load_runner(openvino_fp32).predict(images), 1) == labels)
    int8_accuracy = np.mean(np.argmax(load_runner(int8).predict(images), 1) == labels)
    assert int8_accuracy >= float_accuracy - 0.15  # 16 test images: a flip is 6 points
    kernels = {op.get_type_name() for op in load_runner(int8).model.get_ordered_ops()}
    assert "FakeQuantize" in kernels


def test_an_openvino_variant_is_benchmarked_with_its_profile_flops_and_floor(
        openvino_fp32, tiny_savedmodel, tiny_dataset, tmp_path):
    reference = VariantSpec(name="baseline-savedmodel", source="baseline", format="savedmodel",
                            precision="fp32", path=tiny_savedmodel.path)
    inputs = prepare_benchmark_inputs.fn(reference, tiny_dataset, tmp_path / "inputs")
    assert "openvino" in inputs.floor_models
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=3,
                          isolate=True, scenarios=["single_stream", "offline"],
                          scenario_seconds=0.3)
    result = benchmark_variant.fn(openvino_fp32, inputs, cfg)
    assert result.offline_examples_per_s > 0
    assert result.status == "ok", result.error
    assert result.top1_agreement >= 0.99
    # The tiny model's call costs about what the do-nothing floor's does: a floor is of that
    # order, not above. Under CI's load either may be timed in a slow moment (a floor several
    # times the model's p50 has been read there): bound it by the model's p99.
    assert 0 < result.harness_floor_ms < 3 * result.latency_ms.p99
    assert result.gflops_per_inference > 0
    assert result.op_profile.ops and result.op_profile.method.startswith("OpenVINO")
    assert result.runner_params["inference_precision"] == "f32"


def test_offline_batches_go_to_the_throughput_hints_streams(openvino_fp32, test_split):
    images, _ = test_split
    throughput = OPENVINO.offline_runner(openvino_fp32, threads=2)
    assert int(throughput.facts()["offline_streams"]) >= 1
    expected = load_runner(openvino_fp32).predict(images)
    np.testing.assert_allclose(throughput.predict(images), expected, atol=1e-5)


def test_a_cpu_openvino_refuses_gives_skipped_variants(monkeypatch):
    monkeypatch.setattr(openvino_module, "available_devices", lambda: ("GPU",))
    planned = OPENVINO.plan(PlanRequest(source="baseline", kind="keras"), OpenVINOSettings())
    assert [spec.precision for spec in planned] == ["fp32", "bfloat16", "int8"]
    assert all(spec.status == "skipped" for spec in planned)
    assert "does not support this CPU" in planned[0].error


def test_openvino_forms_are_planned_for_baselines_and_compressed_models():
    config = PipelineConfig.model_validate({"runtimes": {"openvino": {"compressed": ["int8"]}}})
    assert PipelineConfig.model_validate({"compress": {}}).runtimes.openvino.compressed == [], \
        "compressed forms are opt-in (the automatic plan asks for int8)"
    assert PipelineConfig().runtimes.openvino.compressed == ["int8"]
    baseline = [s for s in plan_forms(PlanRequest(source="baseline", kind="keras"), config)
                if s.format == "openvino"]
    assert [s.name for s in baseline] == ["baseline-openvino", "baseline-openvino-bfloat16",
                                          "baseline-openvino-int8"]
    assert baseline[0].derived_from == "baseline-savedmodel"
    assert baseline[2].derived_from == "baseline-openvino"
    assert (baseline[1].status == "skipped") == (bf16_unavailable_reason() is not None)
    asked = compressed_forms(config)
    assert asked["openvino"] == ("int8",), "one rule says every compressed model's forms"
    pruned = [s for s in plan_forms(PlanRequest(source="pruned-80", kind="keras",
                                                start="baseline", asked=asked),
                                    config) if s.format == "openvino"]
    assert [(s.name, s.derived_from) for s in pruned] == [
        ("pruned-80-openvino-int8", "baseline-openvino-int8")]


def test_litert_times_both_apis_and_says_if_the_file_ran_fully_accelerated(
        tiny_savedmodel, tiny_dataset, test_split, tmp_path):
    variant = to_tflite(tiny_savedmodel, "int8", tiny_dataset,
                        ConvertConfig(calibration_examples=20, int8_io=True), tmp_path)
    images, _ = test_split
    compiled = CompiledModelRunner(variant.path)
    np.testing.assert_allclose(compiled.predict(images), TFLiteRunner(variant.path).predict(images),
                               atol=1e-6)
    inputs = prepare_benchmark_inputs.fn(
        VariantSpec(name="baseline-savedmodel", source="baseline", format="savedmodel",
                    precision="fp32", path=tiny_savedmodel.path), tiny_dataset,
        tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=2)
    result = benchmark_variant.fn(variant, inputs, cfg)
    assert set(result.latency_ms_by_api) == {"interpreter", "compiled_model"}
    assert result.latency_ms_by_api["interpreter"].p50 == result.latency_ms.p50
    assert result.latency_ms_by_api["compiled_model"].p50 > 0
    assert result.runner_params["compiled_model.fully_accelerated"] in ("true", "false")
    entry = variant_entry(result, None, accuracy_budget(1.0))
    assert entry["latency_ms_by_api"]["compiled_model"]["p50"] > 0
    table = api_lines({"variants": [entry]})
    assert table and entry["name"] in table[-1]


def _entry(name: str, runtime: str, precision: str, p50: float, interval: tuple[float, float],
           ) -> dict:
    return {"name": name, "source": "baseline", "runtime": runtime, "precision": precision,
            "status": "ok", "accuracy": 0.9, "size_bytes": 2048, "runner": {},
            "latency_ms": {"p50": p50, "p50_ci95": list(interval)}}


def test_the_report_sets_runtimes_side_by_side_per_precision():
    summary = {"variants": [
        _entry("baseline-tflite-int8", "litert", "int8", 1.0, (0.95, 1.05)),
        _entry("baseline-openvino-int8", "openvino", "int8", 0.8, (0.78, 0.82)),
        _entry("baseline-onnx-int8", "onnxruntime", "int8", 0.81, (0.80, 0.83)),
        _entry("baseline-xla", "tensorflow", "fp32", 2.0, (1.9, 2.1)),
    ]}
    rows = [line for line in runtime_lines(summary) if line.startswith("| baseline |")]
    assert [row.split(" | ")[2] for row in rows] == ["★ openvino", "= onnxruntime", "litert"]


def test_openvino_and_nncf_send_no_telemetry():
    """Their telemetry sender forks from a thread: it hung a `tfopt run` at exit (CI, 900 s)."""
    import subprocess
    import sys

    probe = ("import tfopt.runtimes.openvino, openvino.tools.ovc.telemetry_utils as ovc, "
             "nncf.telemetry.wrapper as nncf; "
             "print(ovc.tm.__name__, type(nncf.telemetry).__name__)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, timeout=300).stdout.split()
    assert shown == ["openvino.tools.ovc.telemetry_stub", "MagicMock"], "NNCF's stub"
