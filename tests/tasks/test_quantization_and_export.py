from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.benchmark_variant import benchmark_variant
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tests.steps import build, sources_for, to_onnx, to_tflite
from tfopt.artifacts import VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.cpu_features import bf16_unavailable_reason
from tfopt.eval.metrics import accuracy_budget
from tfopt.fileio import sha256_file
from tfopt.measurement import load_scenarios
from tfopt.measurement.floor import floor_key
from tfopt.runtimes import ConvertConfig, plan_variant, registry
from tfopt.runtimes.base import softmax
from tfopt.runtimes.litert import TFLiteRunner, tflite_precision
from tfopt.runtimes.onnxruntime import OnnxRunner
from tfopt.runtimes.tensorflow import GraphRunner, SavedModelRunner
from tfopt.runtimes.tensorrt import tftrt_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

# Largest |Δ probability| against the float SavedModel, and least top-1 agreement, per precision.
# (largest probability difference, smallest top-1 agreement) on the 16 test images. Where the
# tiny baseline is unsure (two classes within a few points), a flip is allowed even at 16x8.
TOLERANCE = {"fp32": (1e-4, 1.0), "float16": (2e-2, 0.9), "dynamic": (0.1, 0.9),
             "int8": (0.15, 0.85), "int16x8": (0.05, 0.9)}


@pytest.fixture(scope="module")
def reference_probs(tiny_savedmodel, test_images):
    return softmax(SavedModelRunner(tiny_savedmodel.path).predict(test_images))


@pytest.mark.parametrize("precision", ["fp32", "float16", "dynamic", "int8", "int16x8"])
def test_ptq_variant_converts_loads_and_agrees_with_float(
    precision, tiny_savedmodel, tiny_dataset, test_images, reference_probs, tmp_path
):
    before = sha256_file(tiny_savedmodel.path / "saved_model.pb")
    cfg = ConvertConfig(calibration_examples=20)
    variant = to_tflite(tiny_savedmodel, precision, tiny_dataset, cfg, tmp_path)
    assert variant.name == f"baseline-tflite-{precision}" and variant.precision == precision
    assert sha256_file(tiny_savedmodel.path / "saved_model.pb") == before
    probs = softmax(TFLiteRunner(variant.path).predict(test_images))
    max_diff, min_agreement = TOLERANCE[precision]
    assert np.max(np.abs(probs - reference_probs)) <= max_diff
    agreement = np.mean(np.argmax(probs, 1) == np.argmax(reference_probs, 1))
    assert agreement >= min_agreement


def test_int8_model_holds_int8_tensors_and_int8_io(tiny_savedmodel, tiny_dataset, tmp_path,
                                                   test_images, reference_probs):
    cfg = ConvertConfig(calibration_examples=20, int8_io=True)
    variant = to_tflite(tiny_savedmodel, "int8", tiny_dataset, cfg, tmp_path)
    runner = TFLiteRunner(variant.path)
    assert runner.input_dtype == np.int8
    details = runner.interpreter.get_tensor_details()
    conv_weights = [d for d in details if "conv" in d["name"].lower() and len(d["shape"]) == 4
                    and d["shape"][0] > 3 and d["dtype"] != np.float32]
    assert conv_weights and all(d["dtype"] == np.int8 for d in conv_weights)
    assert not [d for d in details if d["dtype"] == np.float32 and len(d["shape"]) == 4
                and "images" not in d["name"]]
    probs = softmax(runner.predict(test_images))
    assert np.mean(np.argmax(probs, 1) == np.argmax(reference_probs, 1)) >= 0.85


def test_int16x8_holds_int16_activations_and_int8_weights(tiny_savedmodel, tiny_dataset,
                                                          tmp_path):
    cfg = ConvertConfig(calibration_examples=20)
    variant = to_tflite(tiny_savedmodel, "int16x8", tiny_dataset, cfg, tmp_path)
    runner = TFLiteRunner(variant.path)
    assert runner.input_dtype == np.float32
    details = runner.interpreter.get_tensor_details()
    kernels = [d for d in details if len(d["shape"]) == 4 and d["shape"][0] > 3
               and "conv" in d["name"].lower() and d["dtype"] != np.float32]
    assert kernels and all(d["dtype"] == np.int8 for d in kernels)
    activations = [d for d in details if len(d["shape"]) == 4 and d["shape"][0] == 1]
    assert any(d["dtype"] == np.int16 for d in activations)
    assert not any(d["dtype"] == np.int8 for d in activations)
    assert tflite_precision(runner) == "int16x8"


def test_int8_is_much_smaller_than_fp32(tiny_savedmodel, tiny_dataset, tmp_path):
    cfg = ConvertConfig(calibration_examples=10)
    fp32 = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, cfg, tmp_path)
    int8 = to_tflite(tiny_savedmodel, "int8", tiny_dataset, cfg, tmp_path)
    assert int8.path.stat().st_size < 0.6 * fp32.path.stat().st_size


def test_onnx_export_agrees_with_the_savedmodel(tiny_savedmodel, tiny_dataset, tmp_path,
                                                test_images, reference_probs):
    variant = to_onnx(tiny_savedmodel, tiny_dataset, ConvertConfig(), tmp_path)
    assert variant.name == "baseline-onnx" and variant.params["check_max_abs_diff"] <= 1e-4
    probs = softmax(OnnxRunner(variant.path).predict(test_images))
    np.testing.assert_allclose(probs, reference_probs, atol=1e-4)
    single = softmax(OnnxRunner(variant.path).predict(test_images[:1]))
    np.testing.assert_allclose(single, reference_probs[:1], atol=1e-4)


@pytest.mark.parametrize("precision", ["dynamic", "int8"])
def test_onnx_runtime_quantization_agrees_with_float_and_is_smaller(
    precision, tiny_savedmodel, tiny_dataset, tmp_path, test_images, reference_probs
):
    import onnx

    from tfopt.runtimes.onnxruntime import onnx_flops

    cfg = ConvertConfig(calibration_examples=20)
    source = to_onnx(tiny_savedmodel, tiny_dataset, cfg, tmp_path)
    before = sha256_file(source.path)
    planned = plan_variant("baseline", "onnx", precision, derived_from=source.name)
    variant = build(planned, tiny_savedmodel, tiny_dataset, cfg, tmp_path,
                    built={source.name: source})
    assert variant.name == f"baseline-onnx-{precision}" and variant.path.exists()
    assert sha256_file(source.path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    graph = onnx.load(str(variant.path)).graph
    ops = {node.op_type for node in graph.node}
    assert ({"QuantizeLinear", "DequantizeLinear"} <= ops if precision == "int8"
            else "ConvInteger" in ops or "MatMulInteger" in ops), ops
    largest = max(graph.initializer, key=lambda t: np.prod(t.dims))
    assert largest.data_type == onnx.TensorProto.INT8, "weights stored as int8"
    assert variant.path.stat().st_size < source.path.stat().st_size
    assert onnx_flops(variant.path) == pytest.approx(onnx_flops(source.path))
    probs = softmax(OnnxRunner(variant.path).predict(test_images))
    assert np.max(np.abs(probs - reference_probs)) <= 0.15
    assert np.mean(np.argmax(probs, 1) == np.argmax(reference_probs, 1)) >= 0.85


def test_onnx_mismatch_beyond_tolerance_fails(tiny_savedmodel, tiny_dataset, tmp_path):
    from tfopt.runtimes.onnxruntime import OnnxMismatchError

    with pytest.raises(OnnxMismatchError):
        to_onnx(tiny_savedmodel, tiny_dataset, ConvertConfig(onnx_atol=1e-12), tmp_path)


def test_xla_output_equals_graph_output(tiny_baseline, test_images):
    graph = GraphRunner(tiny_baseline.path).predict(test_images)
    xla_runner = GraphRunner(tiny_baseline.path, jit_compile=True)
    np.testing.assert_allclose(xla_runner.predict(test_images), graph, atol=1e-4)
    assert "HloModule" in xla_runner.hlo_text(test_images[:1])


def test_tensorrt_bundle_holds_what_it_promises(tiny_savedmodel, tiny_dataset, tmp_path):
    onnx = to_onnx(tiny_savedmodel, tiny_dataset, ConvertConfig(), tmp_path)
    sources = sources_for(tiny_savedmodel, tiny_dataset, tmp_path, built={onnx.name: onnx})
    bundle = registry()["tensorrt"].export(sources, ConvertConfig(tensorrt_max_batch=32),
                                         tmp_path / "export")
    assert (bundle / "model.onnx").read_bytes() == onnx.path.read_bytes()
    assert (bundle / "saved_model" / "saved_model.pb").exists()
    script = (bundle / "trtexec.sh").read_text()
    for flag in ("--onnx=model.onnx", "--minShapes=images:1x16x16x3",
                 "--optShapes=images:8x16x16x3", "--maxShapes=images:32x16x16x3"):
        assert flag in script
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["input"]["shape"] == [-1, 16, 16, 3] and meta["opset"] >= 17
    reloaded = SavedModelRunner(bundle / "saved_model")
    assert reloaded.predict(np.zeros((2, 16, 16, 3), np.float32)).shape == (2, 3)


def test_tftrt_is_reported_unavailable_on_this_build():
    reason = tftrt_unavailable_reason()
    assert reason is not None and "TensorRT" in reason


def test_isolated_benchmark_measures_agreement_and_memory(tiny_savedmodel, tiny_dataset,
                                                          tmp_path):
    variant = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, ConvertConfig(), tmp_path)
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=5,
                          isolate=True)
    result = benchmark_variant.fn(variant, inputs, cfg)
    assert result.status == "ok" and result.timed_runs >= 10
    # The harness floor (a first-pixel model through the same runner) is far below the model.
    assert 0 < result.harness_floor_ms < result.latency_ms.p50
    assert result.top1_agreement == 1.0 and result.max_abs_diff < 1e-4
    assert result.first_inference_ms > 0
    # A TFLite variant's process never loads TensorFlow, so its peak memory is small.
    assert 10 < result.peak_rss_mb < 400
    # A floor the run measured already for this runner and thread count is handed on, not
    # timed again; another thread count is a measurement of its own.
    known = inputs.with_floor(floor_key("tflite", cfg.threads), 123.0)
    assert benchmark_variant.fn(variant, known, cfg).harness_floor_ms == 123.0
    assert known.with_floor(floor_key("tflite", cfg.threads), 1.0) is known
    assert floor_key("tflite", cfg.threads + 1) not in known.floor_ms


def test_a_thread_sweep_times_the_variant_at_each_thread_count(tiny_savedmodel, tiny_dataset,
                                                             tmp_path):
    variant = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, ConvertConfig(), tmp_path)
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=1, threads=2,
                          thread_sweep=True, isolate=False)
    result = benchmark_variant.fn(variant, inputs, cfg)
    assert sorted(result.p50_ms_by_threads) == [1, 2]
    assert result.p50_ms_by_threads[2] == result.latency_ms.p50
    assert result.p50_ms_by_threads[1] > 0


def test_load_scenarios_measure_offline_and_server_rates(tiny_savedmodel, tiny_dataset, tmp_path,
                                                        monkeypatch):
    variant = to_tflite(tiny_savedmodel, "int8", tiny_dataset, ConvertConfig(), tmp_path)
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=1, threads=2,
                          scenarios=["single_stream", "offline", "server"],
                          latency_budget_ms=50, scenario_seconds=0.3)
    result = benchmark_variant.fn(variant, inputs, cfg)
    assert result.offline_examples_per_s > 0 and result.offline_batch_size >= 1
    assert result.server_qps_within_budget > 0 and result.server_p99_ms <= 50
    plain = benchmark_variant.fn(variant, inputs, cfg.model_copy(
        update={"scenarios": ["single_stream"]}))
    assert plain.offline_examples_per_s is None and plain.server_qps_within_budget is None

    def no_search(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("searched for a rate at which no single query meets the budget")

    monkeypatch.setattr(load_scenarios, "server_search", no_search)
    hopeless = benchmark_variant.fn(variant, inputs, cfg.model_copy(update={
        "isolate": False, "scenarios": ["single_stream", "server"], "latency_budget_ms": 1e-6}))
    assert hopeless.server_qps_within_budget == 0.0 and hopeless.server_p99_ms is None
    assert hopeless.server_reason.startswith("single-stream p99 over budget")


def test_a_server_trial_is_sized_by_its_rate_and_a_slow_client_stops_the_search():
    import time

    assert load_scenarios._settings("Server", 2.0, 0.1).min_query_count == 32
    assert load_scenarios._settings("Server", 2.0, 1000.0).min_query_count == 64
    assert load_scenarios._settings("Server", 2.0, 20.0).min_query_count == 40
    started = time.perf_counter()
    alone = load_scenarios.alone_p99_ms(lambda _: time.sleep(0.02), [None], seconds=0.1)
    assert alone >= 20.0
    assert time.perf_counter() - started < 0.5, "stops after 8 calls once the seconds are up"


def test_autocluster_needs_an_isolated_process(tiny_baseline, tiny_savedmodel, tiny_dataset,
                                               tmp_path):
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset, tmp_path)
    spec = VariantSpec(name="baseline-xla-autocluster", source="baseline", format="xla",
                       precision="fp32", path=tiny_baseline.path,
                       params={"xla_mode": "autocluster"})
    with pytest.raises(ValueError, match="isolate"):
        benchmark_variant.fn(spec, inputs, BenchmarkConfig(isolate=False))


def _reference(savedmodel):
    from tfopt.artifacts import VariantSpec

    return VariantSpec(name="baseline-savedmodel", source="baseline", format="savedmodel",
                       precision="fp32", path=savedmodel.path)


@pytest.mark.parametrize("threads", [2])  # 1 is every other test's setting
def test_tensorflow_variants_run_on_the_configured_threads(threads, tiny_baseline,
                                                          tiny_savedmodel, tiny_dataset,
                                                          tmp_path):
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset, tmp_path)
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=5, min_seconds=0, max_seconds=2,
                          threads=threads, isolate=True)
    graph = plan_variant("baseline", "graph", path=tiny_baseline.path)
    result = benchmark_variant.fn(graph, inputs, cfg)
    assert (result.tf_intra_op_threads, result.tf_inter_op_threads) == (threads, threads)
    tflite = benchmark_variant.fn(to_tflite(tiny_savedmodel, "fp32", tiny_dataset,
                                            ConvertConfig(), tmp_path), inputs, cfg)
    assert tflite.tf_intra_op_threads is None, "a TFLite process never loads TensorFlow"


def test_a_graph_or_xla_benchmark_process_imports_neither_prefect_nor_tfmot(
    tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path
):
    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset, tmp_path)
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=5, min_seconds=0, max_seconds=2)
    for spec in (plan_variant("baseline", "graph", path=tiny_baseline.path),
                 plan_variant("baseline", "xla", path=tiny_baseline.path,
                              params={"xla_mode": "jit_compile"})):
        loaded, response = _worker_modules(
            {"spec": spec.model_dump(mode="json"), "inputs": inputs.model_dump(mode="json"),
             "cfg": cfg.model_dump(mode="json")}, tmp_path / spec.name)
        assert "'tensorflow'" in loaded and response
        assert "'prefect'" not in loaded and "'tensorflow_model_optimization'" not in loaded


def _worker_modules(request: dict, stem: Path) -> tuple[str, str]:
    """Run the benchmark worker on `request`; the top-level modules it loaded, its response."""
    request_path, response = stem.with_suffix(".json"), stem.with_suffix(".out")
    request_path.write_text(json.dumps(request))
    script = ("import sys, tfopt.measurement.worker as w; w.main(sys.argv[1], sys.argv[2]); "
              "print(sorted({m.split('.')[0] for m in sys.modules}))")
    completed = subprocess.run([sys.executable, "-c", script, str(request_path), str(response)],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout.strip().splitlines()[-1], response.read_text()


def test_a_runoff_times_the_contenders_side_by_side_in_a_light_process(
    tiny_savedmodel, tiny_dataset, tmp_path
):
    from tasks.runoff import run_off
    from tfopt.measurement.champion import choose_champion
    from tfopt.measurement.runoff import RUNOFF_ROUNDS, runoff_contenders

    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    # The tiny model's int8 form can lose more than a point; this test is about the run-off.
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=12, min_seconds=0.3, max_seconds=2,
                          runoff_margin=10.0, isolate=True, accuracy_budget_points=100.0)
    results = [benchmark_variant.fn(to_tflite(tiny_savedmodel, precision, tiny_dataset,
                                              ConvertConfig(), tmp_path), inputs, cfg)
               for precision in ("fp32", "int8")]
    assert [r.name for r in runoff_contenders(results, cfg)] == sorted(
        (r.name for r in results), key=lambda n: next(r.latency_ms.p50 for r in results
                                                      if r.name == n))
    runoff = run_off.fn(results, inputs, cfg)
    assert runoff is not None and runoff.rounds == RUNOFF_ROUNDS == 12
    assert set(runoff.round_p50_ms) == {r.name for r in results}
    assert all(len(p50s) == 12 and min(p50s) > 0 for p50s in runoff.round_p50_ms.values())
    # benchmark.runoff_threads: fastest (the default) at threads 2: each timed at 1 and 2
    assert sorted(runoff.threads) == sorted(r.name for r in results), runoff.threads
    assert set(runoff.threads.values()) <= {1, 2}, "each contender's own thread count"
    assert all(set(tried) == {1, 2} for tried in runoff.thread_pick_p50_ms.values())
    choice = choose_champion(results, accuracy_budget(100.0), "p50", runoff)
    assert "run-off" in choice.reason and choice.name in runoff.round_p50_ms
    loaded, response = _worker_modules({
        "specs": [VariantSpec(name=r.name, source=r.source, format=r.format,
                              precision=r.precision, path=r.path).model_dump(mode="json")
                  for r in results],
        "inputs": inputs.model_dump(mode="json"), "cfg": cfg.model_dump(mode="json")},
        tmp_path / "runoff")
    assert "'tensorflow'" not in loaded and "'prefect'" not in loaded
    assert "round_p50_ms" in response
    assert runoff_contenders(results, cfg.model_copy(update={"runoff_margin": None})) == []
    assert runoff_contenders(results, cfg.model_copy(update={"objective": "size"})) == []


def test_a_search_trials_files_are_timed_side_by_side_with_the_baselines_int8_file(
    tiny_savedmodel, tiny_dataset, tmp_path
):
    from tfopt.search import TimedFile, with_speedups

    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=12, min_seconds=0.3, max_seconds=2)
    reference = to_tflite(tiny_savedmodel, "int8", tiny_dataset, ConvertConfig(), tmp_path)
    same_file = reference.model_copy(update={"name": "channels-50-tflite-int8"})
    fp32 = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, ConvertConfig(), tmp_path)
    timed = [TimedFile(name=same_file.name, p50_ms=0.05), TimedFile(name=fp32.name, p50_ms=0.05)]
    paired = with_speedups(timed, [same_file, fp32], reference, inputs, cfg)
    assert 0.5 < paired[0].speedup < 2.0, "one file against itself, in one process"
    assert paired[1].speedup > 0, "the fp32 file in the same process"
    missing = reference.model_copy(update={"path": tmp_path / "gone.tflite"})
    assert with_speedups(timed, [same_file], missing, inputs, cfg) == timed, (
        "a reference that cannot be timed leaves the files as they were")


def test_a_trial_file_that_cannot_be_timed_is_left_out_and_the_other_counts(
    tiny_savedmodel, tiny_dataset, tmp_path, live_services
):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tfopt.search import Trial, time_files

    inputs = prepare_benchmark_inputs.fn(_reference(tiny_savedmodel), tiny_dataset,
                                         tmp_path / "inputs")
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=12, min_seconds=0.3, max_seconds=2)
    fp32 = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, ConvertConfig(), tmp_path)
    gone = fp32.model_copy(update={"name": "channels-50-tflite-int8", "precision": "int8",
                                   "path": tmp_path / "gone.tflite"})
    trial = Trial(params={"fraction": 0.5}, status="ok", files=(gone, fp32))
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        timed = time_files(trial, inputs, cfg)
        nothing = time_files(trial.model_copy(update={"files": (gone,)}), inputs, cfg)
    assert timed.status == "ok" and timed.file == fp32.name and timed.p50_ms > 0, timed
    assert "not timed: channels-50-tflite-int8" in timed.error
    assert [figures.name for figures in timed.timed] == [fp32.name]
    assert nothing.status == "failed" and "channels-50-tflite-int8" in nothing.error


_LOGITS_OF = """
import sys
import numpy as np
from pathlib import Path
from tfopt.runtimes import load_runner
from tfopt.runtimes import plan_variant
runner = load_runner(plan_variant("baseline", "graph", sys.argv[1], path=Path(sys.argv[2])))
np.save(sys.argv[4], runner.predict(np.load(sys.argv[3])))
"""


@pytest.mark.skipif(bf16_unavailable_reason() is not None,
                    reason=str(bf16_unavailable_reason()))
def test_bfloat16_graph_variant_is_rewritten_and_measured_in_its_own_process(
    tiny_baseline, tiny_dataset, tmp_path
):
    inputs = prepare_benchmark_inputs.fn(None, tiny_dataset, tmp_path / "inputs")
    logits = {}
    for precision in ("fp32", "bfloat16"):
        out = tmp_path / f"{precision}.npy"
        subprocess.run([sys.executable, "-c", _LOGITS_OF, precision, str(tiny_baseline.path),
                        str(inputs.images), str(out)], check=True, cwd=ROOT, capture_output=True)
        logits[precision] = np.load(out)
    difference = np.max(np.abs(logits["fp32"] - logits["bfloat16"]))
    assert 0 < difference < 0.5, "bf16 rounding shows: the graph was rewritten"
    assert np.mean(logits["fp32"].argmax(1) == logits["bfloat16"].argmax(1)) >= 0.9
    spec = plan_variant("baseline", "graph", "bfloat16", derived_from="baseline-graph",
                        path=tiny_baseline.path)
    assert spec.name == "baseline-graph-bfloat16"
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=10, min_seconds=0, max_seconds=2)
    result = benchmark_variant.fn(spec, inputs, cfg)
    assert result.status == "ok" and result.precision == "bfloat16" and result.accuracy > 0.5
    with pytest.raises(ValueError, match=r"needs benchmark\.isolate"):
        benchmark_variant.fn(spec, inputs, cfg.model_copy(update={"isolate": False}))
