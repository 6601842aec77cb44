"""Models trained outside tfopt, through the whole pipeline against real servers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flows.parameters import load_pipeline_config
from tests.live import benchmark_split_of, run_smoke_with, scores_of
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def their_network(tmp_path_factory):
    """MobileNetV2 trained outside tfopt, saved as .keras, plain SavedModel, .tflite and .onnx.

    The SavedModel has no Keras metadata and its own tensor names (``pixels`` in, ``scores``
    out); the .tflite and .onnx files are converted from it, so they carry those names too.
    """
    import tensorflow as tf
    import tf_keras as keras

    from tasks.write_tfrecords import write_tfrecords
    from tfopt.data.pipeline import load_split
    from tfopt.runtimes.onnxruntime import run_tf2onnx

    tmp = tmp_path_factory.mktemp("theirs")
    demo = tmp / "demo"
    write_demo_images(demo)
    smoke = load_pipeline_config(ROOT / "configs" / "smoke.yaml", {"data.source_dir": str(demo)})
    dataset = write_tfrecords.fn(smoke.data, tmp / "outside")
    train_images, train_labels = load_split(dataset, "train")
    network = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                             weights=None, classes=10,
                                             classifier_activation=None)
    network.compile(optimizer=keras.optimizers.Adam(3e-3),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    network.fit(train_images, train_labels, epochs=4, batch_size=32, verbose=0)
    network.save(tmp / "theirs.keras")
    test_images, test_labels = load_split(dataset, "test")
    own_accuracy = float(np.mean(np.argmax(network.predict(test_images, verbose=0), 1)
                                 == test_labels))

    module = tf.Module()
    module.network = network
    module.serve = tf.function(lambda pixels: {"scores": network(pixels, training=False)},
                               input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32,
                                                              "pixels")])
    tf.saved_model.save(module, str(tmp / "theirs-savedmodel"),
                        signatures={"serving_default": module.serve})
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp / "theirs-savedmodel"))
    (tmp / "theirs.tflite").write_bytes(converter.convert())
    run_tf2onnx(tmp / "theirs-savedmodel", tmp / "theirs.onnx", opset=17)
    files = {"keras": tmp / "theirs.keras", "savedmodel": tmp / "theirs-savedmodel",
             "tflite": tmp / "theirs.tflite", "onnx": tmp / "theirs.onnx"}
    return demo, files, own_accuracy


def test_a_trained_model_file_goes_through_the_pipeline_as_it_is(live_services, tmp_path,
                                                                 their_network):
    """A network nobody here wrote, trained outside tfopt, optimized with train.epochs 0."""
    demo, files, own_accuracy = their_network
    summary_path = tmp_path / "out.json"
    overrides = {
        "data.source_dir": demo, "work_dir": tmp_path / "work", "name": "own-model",
        "model.source": "file", "model.path": files["keras"], "train.epochs": 0,
        "convert.tflite": "[fp32, int8]", "convert.xla": "[]", "compress.tflite": "[int8]",
        "compress.distill.enabled": "false", "compress.qat.enabled": "false",
        "compress.prune.epochs": 1, "input.sweep_batch_sizes": "[32]", "input.sweep_steps": 2,
        "convert.onnx_quantize": "[]", "convert.bfloat16": "false", "compress.graph": "false",
        "convert.selective_int8": "false", "input.measure_passes": 1,
        "runtimes.openvino.precisions": "[]",
    }
    summary = run_smoke_with(live_services, summary_path, overrides)
    by_name = {v["name"]: v for v in summary["variants"]}
    assert abs(summary["baseline_accuracy"] - own_accuracy) < 1e-6, "the model as it was"
    # Overall kernel sparsity: tfmot leaves some of MobileNetV2's kernels dense (0.75 seen).
    assert summary["techniques"]["pruned-80"]["metrics"]["sparsity"] >= 0.7
    assert by_name["pruned-80-tflite-int8"]["status"] == "ok", by_name["pruned-80-tflite-int8"]
    for name in ("baseline-graph", "baseline-tflite-fp32", "baseline-onnx"):
        assert by_name[name]["status"] == "ok", by_name[name]
        assert by_name[name]["top1_agreement"] >= 0.99, by_name[name]
    assert by_name["baseline-tflite-int8"]["status"] == "ok"
    assert "NCHW not measured" in summary["data_layout"]["note"]


# What each kind of file cannot give, and the reason the summary must give for it.
CANNOT = {
    "savedmodel": {"baseline-graph": "needs a tf_keras model",
                   "pruned-80-tflite-int8": "prune works on keras models"},
    "tflite": {"baseline-onnx": "benchmarked as it is", "qat-tflite-int8": "qat works on keras"},
    "onnx": {"baseline-savedmodel": "benchmarked as it is",
             "distilled-small-graph": "distill works on keras"},
}
# The variant that is the user's model itself (or its re-export with the serving contract).
THEIRS = {"savedmodel": "baseline-savedmodel", "tflite": "baseline-tflite-fp32",
          "onnx": "baseline-onnx"}


@pytest.mark.parametrize("kind", ["savedmodel", "tflite", "onnx"])
def test_a_model_file_that_is_not_keras_gets_what_its_kind_allows(
    live_services, tmp_path, their_network, kind
):
    import mlflow.pyfunc

    demo, files, own_accuracy = their_network
    summary = run_smoke_with(live_services, tmp_path / "out.json", {
        "data.source_dir": demo, "work_dir": tmp_path / "work", "name": f"own-{kind}",
        "model.source": "file", "model.path": files[kind], "train.epochs": 0,
        "convert.tflite": "[fp32]", "convert.xla": "[]", "convert.onnx_quantize": "[]",
        "convert.bfloat16": "false", "input.measure_passes": 1,
        "runtimes.openvino.precisions": "[fp32]",
    })
    by_name = {v["name"]: v for v in summary["variants"]}
    assert by_name[THEIRS[kind]]["status"] == "ok", by_name[THEIRS[kind]]
    openvino = by_name["baseline-openvino"]
    if kind == "savedmodel":  # a user's SavedModel converts to OpenVINO like tfopt's own
        assert openvino["status"] == "ok" and openvino["top1_agreement"] >= 0.99, openvino
    else:
        assert openvino["status"] == "skipped" and "benchmarked as it is" in openvino["error"]
    assert abs(by_name[THEIRS[kind]]["accuracy"] - own_accuracy) <= 0.01, "the model as it was"
    for name, reason in CANNOT[kind].items():
        assert by_name[name]["status"] == "skipped" and reason in by_name[name]["error"], (
            by_name[name])
    assert not [v for v in summary["variants"] if v["status"] == "failed"], summary["variants"]
    assert summary["batch_size_sweep"]["rule"].startswith("not measured")
    mlflow.set_tracking_uri(live_services.mlflow_url)
    champion = mlflow.pyfunc.load_model(summary["champion_model"]["uri"])
    images, _ = benchmark_split_of(tmp_path / "work", summary, f"own-{kind}")
    assert scores_of(champion.predict(images[:3])).shape == (3, 10)
