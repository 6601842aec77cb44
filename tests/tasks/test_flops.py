from __future__ import annotations

import numpy as np
import pytest

from tfopt.models.flops import keras_flops
from tfopt.provenance import machine_memory_gb_per_s, machine_peak_gflops
from tfopt.runtimes.litert import tflite_flops
from tfopt.runtimes.onnxruntime import onnx_flops

# Conv 3x3x3->4 on 8x8 (same): 2*8*8*4*27; depthwise 3x3 on 8x8x4: 2*8*8*4*9; dense 4->5: 2*4*5.
EXPECTED_FLOPS = 2 * 8 * 8 * 4 * 27 + 2 * 8 * 8 * 4 * 9 + 2 * 4 * 5


@pytest.fixture(scope="module")
def counted_model(tmp_path_factory):
    import tensorflow as tf
    import tf_keras as keras

    from tfopt.models.serving_export import save_serving_savedmodel
    from tfopt.runtimes.onnxruntime import run_tf2onnx
    from tfopt.runtimes.openvino import convert_savedmodel
    from tfopt.serving import SIGNATURE_KEY

    folder = tmp_path_factory.mktemp("flops")
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(5)(x))
    save_serving_savedmodel(model, 8, folder / "savedmodel")
    converter = tf.lite.TFLiteConverter.from_saved_model(str(folder / "savedmodel"),
                                                         signature_keys=[SIGNATURE_KEY])
    (folder / "model.tflite").write_bytes(converter.convert())
    run_tf2onnx(folder / "savedmodel", folder / "model.onnx", 17)
    convert_savedmodel(folder / "savedmodel", folder, "model")
    model.save(folder / "model.keras")
    return model, folder


def test_the_same_network_has_the_same_flops_in_every_format(counted_model):
    from tfopt.runtimes.litert import TFLiteRunner
    from tfopt.runtimes.openvino import OpenVINORunner, openvino_flops

    model, folder = counted_model
    assert keras_flops(model) == EXPECTED_FLOPS
    runner = TFLiteRunner(folder / "model.tflite")
    runner.predict(np.zeros((3, 8, 8, 3), np.float32))  # a batch of 3: counted per example
    assert tflite_flops(runner.interpreter) == EXPECTED_FLOPS
    assert onnx_flops(folder / "model.onnx") == EXPECTED_FLOPS
    assert openvino_flops(OpenVINORunner(folder / "model.openvino" / "model.xml").model) \
        == EXPECTED_FLOPS


def test_wrapped_layers_are_counted_like_the_layers_they_wrap(counted_model):
    import tensorflow_model_optimization as tfmot

    model, _ = counted_model
    pruned = tfmot.sparsity.keras.prune_low_magnitude(model)
    assert keras_flops(pruned) == EXPECTED_FLOPS


def test_machine_limits_are_measured_positive():
    assert machine_peak_gflops(size=256, repeats=2) > 0.1
    assert machine_memory_gb_per_s(megabytes=16, repeats=2) > 0.1


def test_each_runtime_names_its_top_operators(counted_model):
    from tfopt.runtimes import registry
    from tfopt.runtimes.litert import PROFILE_METHOD as TFLITE_METHOD
    from tfopt.runtimes.litert import TFLiteRunner
    from tfopt.runtimes.onnxruntime import PROFILE_METHOD as ONNX_METHOD
    from tfopt.runtimes.onnxruntime import OnnxRunner
    from tfopt.runtimes.openvino import PROFILE_METHOD as OPENVINO_METHOD
    from tfopt.runtimes.openvino import OpenVINORunner
    from tfopt.runtimes.tensorflow import PROFILE_METHOD as TF_METHOD
    from tfopt.runtimes.tensorflow import GraphRunner

    _, folder = counted_model
    images = np.random.default_rng(0).random((4, 8, 8, 3), dtype=np.float32)
    tensorflow, litert, onnxruntime, openvino = (
        registry()[name] for name in ("tensorflow", "litert", "onnxruntime", "openvino"))
    for runtime, runner, method, convolution in (
        (tensorflow, GraphRunner(folder / "model.keras"), TF_METHOD, "Conv2D"),
        (tensorflow, GraphRunner(folder / "model.keras", jit_compile=True), TF_METHOD, "XLA"),
        (onnxruntime, OnnxRunner(folder / "model.onnx"), ONNX_METHOD, "Conv"),
        (openvino, OpenVINORunner(folder / "model.openvino" / "model.xml"), OPENVINO_METHOD,
         "Convolution"),
    ):
        profile = runtime.op_profile(runner, runner.prepare(images), threads=1)
        assert profile.method == method and profile.calls > 0
        assert any(convolution in op.kind for op in profile.ops), profile.ops
        assert all(op.ms is not None and op.ms > 0 for op in profile.ops)
        assert 0.99 <= sum(op.share for op in profile.ops) <= 1.01 or len(profile.ops) == 8
    runner = TFLiteRunner(folder / "model.tflite")
    runner.prepare(images)
    profile = litert.op_profile(runner, [], threads=1)
    assert profile.method == TFLITE_METHOD
    assert [op.kind for op in profile.ops] == ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"]
    assert profile.ops[0].share == pytest.approx(2 * 8 * 8 * 4 * 27 / EXPECTED_FLOPS)
    assert all(op.ms is None for op in profile.ops)
