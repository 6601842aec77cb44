"""Model files trained outside tfopt that are not Keras files, through the whole pipeline."""

from __future__ import annotations

import pytest

from tests.live import LIGHT, benchmark_split_of, run_smoke_with, scores_of
from tests.theirs import their_keras3_network

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def their_network(tmp_path_factory):
    """A Keras 3 CNN trained outside tfopt, exported with Keras 3's `model.export()` (a
    plain SavedModel: no Keras metadata, its own tensor names), and .tflite and .onnx files
    converted from that export, so they carry those names too."""
    import tensorflow as tf

    from tfopt.runtimes.onnxruntime import run_tf2onnx

    tmp = tmp_path_factory.mktemp("theirs")
    demo, network, own_accuracy, _ = their_keras3_network(tmp)
    network.export(str(tmp / "theirs-savedmodel"), verbose=False)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp / "theirs-savedmodel"))
    (tmp / "theirs.tflite").write_bytes(converter.convert())
    run_tf2onnx(tmp / "theirs-savedmodel", tmp / "theirs.onnx", opset=17)
    files = {"savedmodel": tmp / "theirs-savedmodel", "tflite": tmp / "theirs.tflite",
             "onnx": tmp / "theirs.onnx"}
    return demo, files, own_accuracy


# What each kind of file cannot give, and the reason the summary must give for it.
CANNOT = {
    "savedmodel": {"baseline-graph": "needs a Keras model",
                   "pruned-80-tflite-int8": "prune works on keras models"},
    "tflite": {"baseline-onnx": "benchmarked as it is", "qat-tflite-int8": "qat works on keras"},
    "onnx": {"baseline-savedmodel": "benchmarked as it is",
             "distilled-small-tflite-int8": "distill works on keras"},
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
        **LIGHT, "data.source_dir": demo, "work_dir": tmp_path / "work", "name": f"own-{kind}",
        "model.source": "file", "model.path": files[kind], "train.epochs": 0,
        "convert.tflite": "[fp32]", "runtimes.openvino.precisions": "[fp32]",
        # A SavedModel's ONNX form is tfopt's own export, tested apart (tests/tasks); the other
        # kinds need it planned: the user's .onnx file is that form, a .tflite file skips it.
        "convert.onnx": kind != "savedmodel",
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
