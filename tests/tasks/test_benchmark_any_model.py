"""Any model is benchmarked without a data folder: named inputs of any shape, dtype and layout,
generated from its signature (open dimensions given) or read from the user's .npz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfopt.artifacts import BenchmarkInputs, VariantSpec
from tfopt.config import BenchmarkConfig
from tfopt.measurement.feeds import FeedsError, generated_feeds, request_shapes, save_feeds
from tfopt.measurement.inputs import feeds_inputs
from tfopt.measurement.worker import measure_variant
from tfopt.models.references import UnusableModelError, probe_signature
from tfopt.runtimes.base import TensorInfo

QUICK = BenchmarkConfig(warmup_runs=3, warmup_seconds=0.02, min_runs=12, min_seconds=0.1,
                        max_seconds=0.5, scenarios=["single_stream", "offline"],
                        scenario_seconds=0.2)


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory) -> Path:
    """A SavedModel of two named inputs (float features, integer ids) and two outputs."""
    return _two_input_savedmodel(tmp_path_factory.mktemp("any") / "two-inputs")


def _two_input_savedmodel(path: Path, scale: float = 1.0) -> Path:
    """The two-input SavedModel, its weights times `scale` (so are its outputs)."""
    import tensorflow as tf

    weights = tf.Variable(scale * tf.random.stateless_normal([8, 4], seed=[1, 2]))
    table = tf.Variable(scale * tf.random.stateless_normal([16, 4], seed=[3, 4]))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, "features"),
                                  tf.TensorSpec([None, 3], tf.int32, "ids")])
    def serve(features, ids):
        mixed = features @ weights + tf.reduce_sum(tf.gather(table, ids), axis=1)
        return {"score": tf.reduce_sum(mixed, axis=1), "embedding": mixed}

    module = tf.Module()
    module.weights, module.table, module.serve = weights, table, serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return path


def detector_onnx(path: Path, height: int | str = 32, width: int | str = 32) -> Path:
    """A YOLO-like ONNX model: NCHW images in, one [1, 84, cells] tensor out (no classes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    kernel = np.random.default_rng(0).normal(size=(84, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["images", "kernel"], ["features"], pads=[1, 1, 1, 1],
                          strides=[2, 2]),
         helper.make_node("Reshape", ["features", "cells"], ["output0"])],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 84, None])],
        [numpy_helper.from_array(kernel, "kernel"),
         numpy_helper.from_array(np.array([1, 84, -1], np.int64), "cells")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _spec(path: Path, fmt: str) -> VariantSpec:
    return VariantSpec(name="theirs", source="theirs", format=fmt, precision="fp32", path=path)


def test_a_detector_with_an_nchw_input_is_measured_on_generated_inputs(tmp_path):
    model = detector_onnx(tmp_path / "detector.onnx")
    spec = _spec(model, "onnx")
    inputs = feeds_inputs(spec, "auto", {}, 6, 4, tmp_path / "no-data", tmp_path / "inputs")
    assert inputs is not None and inputs.images is None, "not a classifier: no data needed"
    result = measure_variant(spec, inputs, QUICK)
    assert result.status == "ok" and result.accuracy is None and result.top1_agreement is None
    assert result.latency_ms.p50 > 0 and result.timed_runs >= 12
    assert result.batch_size == 1, "the model's batch is fixed at 1"
    assert result.offline_examples_per_s > 0 and result.offline_batch_size == 1
    assert result.gflops_per_inference > 0 and result.op_profile.ops
    with np.load(inputs.feeds) as written:
        assert written["images"].shape == (6, 3, 32, 32), "the inputs measured, kept"


def test_open_dimensions_are_asked_for_by_name(tmp_path):
    model = detector_onnx(tmp_path / "dynamic.onnx", "height", "width")
    spec = _spec(model, "onnx")
    with pytest.raises(UnusableModelError,
                       match=r"input images \[1, 3, -1, -1\] leaves dimension 2 open: give its "
                             r"shape with --shape images=1x3xNxN"):
        feeds_inputs(spec, "random", {}, 4, 4, tmp_path, tmp_path / "inputs")
    inputs = feeds_inputs(spec, "random", {"images": [1, 3, 64, 48]}, 4, 4, tmp_path,
                          tmp_path / "inputs")
    result = measure_variant(spec, inputs, QUICK)
    assert result.status == "ok" and result.latency_ms.p50 > 0


def test_a_savedmodel_of_two_inputs_is_measured_on_generated_and_given_inputs(two_inputs,
                                                                            tmp_path):
    spec = _spec(two_inputs, "savedmodel")
    model_inputs, outputs = probe_signature("savedmodel", two_inputs)
    assert [(i.name, i.dtype) for i in model_inputs] == [("features", "float32"),
                                                         ("ids", "int32")]
    assert {o.name for o in outputs} == {"score", "embedding"}
    generated = feeds_inputs(spec, "auto", {}, 8, 4, tmp_path, tmp_path / "gen")
    result = measure_variant(spec, generated, QUICK)
    assert result.status == "ok" and result.batch_size == 4, "a dynamic batch is batched"
    assert result.batch_throughput_per_s > 0
    given = save_feeds(tmp_path / "mine.npz", generated_feeds(model_inputs, {}, 5, seed=7))
    from_file = feeds_inputs(spec, given.as_posix(), {}, 0, 4, tmp_path, tmp_path / "file")
    assert from_file.examples == 5 and from_file.generate is None
    assert measure_variant(spec, from_file, QUICK).latency_ms.p50 > 0
    wrong = save_feeds(tmp_path / "wrong.npz", {"features": np.zeros((2, 8), np.float32)})
    with pytest.raises(UnusableModelError, match=r"holds \['features'\], the model takes "
                                                 r"features float32 \[-1, 8\], ids int32"):
        feeds_inputs(spec, wrong.as_posix(), {}, 0, 4, tmp_path, tmp_path / "wrong")


def test_a_model_of_two_inputs_is_scored_by_its_metric_against_the_files_y(two_inputs,
                                                                          tmp_path):
    import tensorflow as tf

    from tfopt.config import EvalConfig
    from tfopt.eval.metrics import MetricError

    spec = _spec(two_inputs, "savedmodel")
    model_inputs, _ = probe_signature("savedmodel", two_inputs)
    feeds = generated_feeds(model_inputs, {}, 6, seed=3)
    serve = tf.saved_model.load(str(two_inputs)).signatures["serving_default"]
    score = serve(**{name: tf.constant(values) for name, values in feeds.items()})["score"]
    given = save_feeds(tmp_path / "scored.npz", {**feeds, "y": score.numpy() + 0.5})
    judged = EvalConfig(metric="mae", output="score")
    inputs = feeds_inputs(spec, given.as_posix(), {}, 0, 4, tmp_path, tmp_path / "in", judged)
    result = measure_variant(spec, inputs, QUICK)
    assert result.metric == "mae" and result.accuracy == pytest.approx(0.5, abs=1e-4)
    # The other output does not fit the targets: the variant fails with the metric's line.
    other = inputs.model_copy(update={"judged_by": EvalConfig(metric="mae", output="embedding")})
    with pytest.raises(MetricError, match=r"^mae: targets of shape \[6\] do not fit outputs "
                                          r"of shape \[6, 4\]$"):
        measure_variant(spec, other, QUICK)


def test_a_converted_model_is_judged_against_its_reference_without_labels(two_inputs,
                                                                          tmp_path):
    from tfopt.config import EvalConfig
    from tfopt.measurement.inputs import reference_outputs

    drifted = _two_input_savedmodel(tmp_path / "drifted", scale=1.01)
    spec = _spec(drifted, "savedmodel")
    judged = EvalConfig(metric="relative_error", output="score")
    inputs = feeds_inputs(spec, "random", {}, 8, 4, tmp_path, tmp_path / "in", judged,
                          referenced=True)
    # A validation split too (a pipeline's on array data): judged against the reference there.
    model_inputs, _ = probe_signature("savedmodel", two_inputs)
    validation = save_feeds(tmp_path / "val.npz", generated_feeds(model_inputs, {}, 5, seed=4))
    inputs = reference_outputs(_spec(two_inputs, "savedmodel"),
                               inputs.model_copy(update={"selection_feeds": validation}),
                               tmp_path / "in")
    assert inputs.generate is None and inputs.feeds.is_file(), "both see the same inputs"
    assert inputs.selection_reference_outputs.is_file()
    result = measure_variant(spec, inputs, QUICK)
    assert result.metric == "relative_error" and result.accuracy == pytest.approx(0.01, rel=1e-3)
    assert result.val_accuracy == pytest.approx(0.01, rel=1e-3)
    fidelity = inputs.model_copy(update={"judged_by": EvalConfig(metric="fidelity",
                                                                 output="embedding")})
    snr = measure_variant(spec, fidelity, QUICK)
    assert snr.metric == "snr_db" and snr.accuracy == pytest.approx(40.0, abs=0.01)
    with pytest.raises(UnusableModelError, match="compares a model with a reference model"):
        feeds_inputs(spec, "random", {}, 8, 4, tmp_path, tmp_path / "alone",
                     EvalConfig(metric="fidelity"))


@pytest.mark.parametrize(("given", "message"), [
    ({"pixels": [1, 3]}, "the model has no input 'pixels'"),
    ({"images": [1, 3, 32]}, "input images has 4 dimensions"),
    ({"images": [1, 1, 32, 32]}, "dimension 1 is 3 in the model"),
    ({"images": [2, 3, 32, 32]}, "requests are batch 1"),
])
def test_bad_input_shapes_are_refused_naming_the_input(given, message):
    inputs = [TensorInfo("images", (None, 3, None, None), "float32")]
    with pytest.raises(FeedsError, match=message):
        request_shapes(inputs, given)


def test_a_classifier_is_still_measured_on_its_data(tiny_savedmodel, tmp_path):
    spec = _spec(tiny_savedmodel.path, "savedmodel")
    assert feeds_inputs(spec, "auto", {}, 4, 4, tmp_path, tmp_path / "inputs") is None
    assert isinstance(feeds_inputs(spec, "random", {}, 4, 4, tmp_path, tmp_path / "in"),
                      BenchmarkInputs)


def test_a_benchmark_past_its_time_limit_is_stopped_with_that_reason(tmp_path):
    from tfopt.measurement.isolation import TimeLimitError, measure_in_subprocess

    model = detector_onnx(tmp_path / "detector.onnx")
    spec = _spec(model, "onnx")
    inputs = feeds_inputs(spec, "random", {}, 4, 4, tmp_path, tmp_path / "inputs")
    slow = QUICK.model_copy(update={"time_limit_seconds": 0.5, "min_seconds": 30.0,
                                    "max_seconds": 60.0})
    with pytest.raises(TimeLimitError, match=r"stopped after 0.5 s, its time limit "
                                             r"\(benchmark.time_limit_seconds\)"):
        measure_in_subprocess(spec, inputs, slow)


def _tiny_tflite(path: Path) -> Path:
    """A TFLite file of one convolution over 16x16 RGB images."""
    import tensorflow as tf

    kernel = tf.constant(np.random.default_rng(0).normal(size=(3, 3, 3, 8)), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([1, 16, 16, 3], tf.float32, "images")])
    def serve(images):
        return {"logits": tf.reduce_mean(tf.nn.conv2d(images, kernel, 1, "SAME"), [1, 2])}

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [serve.get_concrete_function()], tf.Module())
    path.write_bytes(converter.convert())
    return path


def test_a_measuring_process_with_amx_denied_runs_without_it_and_says_so(tmp_path):
    """``benchmark.amx: denied``: the worker refuses AMX before loading; the result says so."""
    from tfopt.cpu_features import cpu_flags
    from tfopt.measurement.isolation import measure_in_subprocess

    spec = VariantSpec(name="conv-tflite-fp32", source="conv", format="tflite", precision="fp32",
                       path=_tiny_tflite(tmp_path / "conv.tflite"))
    inputs = feeds_inputs(spec, "random", {}, 4, 4, tmp_path, tmp_path / "inputs")
    held = {}
    for setting in ("allowed", "denied"):
        try:
            result = measure_in_subprocess(spec, inputs, QUICK.model_copy(
                update={"amx": setting, "profile": False}))
        except RuntimeError as error:
            if "prctl(PR_SET_" not in str(error):
                raise
            pytest.skip(f"this kernel or sandbox refuses seccomp filters: {error}")
        held[setting] = result.runner_params.get("amx_permitted")
    if "amx_tile" in cpu_flags():
        assert held == {"allowed": "true", "denied": "false"}
    else:
        assert held == {"allowed": None, "denied": None}


def test_amx_auto_is_kept_as_set_and_allowed_where_it_cannot_be_timed(tmp_path):
    """A set ``benchmark.amx`` is not timed; ``auto`` without isolation or a file is allowed."""
    import logging

    from tfopt.cpu_features import cpu_flags
    from tfopt.measurement.amx import decide_amx

    spec = VariantSpec(name="conv-tflite-fp32", source="conv", format="tflite", precision="fp32",
                       path=tmp_path / "never-read.tflite")
    inputs = BenchmarkInputs(images=None, labels=None, reference_logits=None, examples=1)
    log = logging.getLogger("test")
    for setting in ("allowed", "denied"):
        decision = decide_amx(QUICK.model_copy(update={"amx": setting}), spec, inputs, log)
        assert (decision.setting, decision.decided_by, decision.timed) == (setting, "config", None)
    in_process = decide_amx(QUICK.model_copy(update={"amx": "auto", "isolate": False}), spec,
                            inputs, log)
    nothing = decide_amx(QUICK.model_copy(update={"amx": "auto"}), None, inputs, log)
    for decision in (in_process, nothing):
        assert (decision.setting, decision.decided_by, decision.timed) == (
            "allowed", "auto", None), decision
    if "amx_tile" in cpu_flags():
        assert "isolate: false" in in_process.reason and "no int8 file" in nothing.reason
    else:
        assert in_process.reason == nothing.reason == (
            "AMX allowed (benchmark.amx: auto): this CPU has no AMX")


def test_amx_auto_times_the_file_both_ways_and_keeps_amx_only_on_a_gain(tmp_path):
    """On an AMX CPU ``auto`` times the file in alternating processes; elsewhere it says why not."""
    import logging
    import statistics

    from tfopt.cpu_features import cpu_flags
    from tfopt.measurement.amx import AMX_DENIED_FROM, AMX_MIN_ROUNDS, AMX_ROUNDS, decide_amx

    spec = VariantSpec(name="conv-tflite-fp32", source="conv", format="tflite", precision="fp32",
                       path=_tiny_tflite(tmp_path / "conv.tflite"))
    inputs = feeds_inputs(spec, "random", {}, 4, 4, tmp_path, tmp_path / "inputs")
    decision = decide_amx(QUICK.model_copy(update={"amx": "auto", "profile": False}), spec,
                          inputs, logging.getLogger("test"))
    if "amx_tile" not in cpu_flags():
        assert decision.timed is None and decision.reason.endswith("this CPU has no AMX")
        return
    if not decision.round_ratios and "failed" in decision.reason:
        pytest.skip(f"timing with AMX denied failed here (a sandbox refusing seccomp?): "
                    f"{decision.reason}")
    assert decision.timed == spec.name and decision.decided_by == "auto"
    assert AMX_MIN_ROUNDS <= len(decision.round_ratios) <= AMX_ROUNDS
    assert decision.denied_speedup == statistics.median(decision.round_ratios)
    assert (decision.setting == "denied") == (decision.denied_speedup >= AMX_DENIED_FROM)
    assert decision.reason.startswith(
        f"AMX {decision.setting} (benchmark.amx: auto): {spec.name} ran")
