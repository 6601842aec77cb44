"""A baseline its compressed children beat: trained further when it may be, marked when not.

Two light runs at once on the live servers. One trains a deliberately under-trained baseline
(two epochs at a small rate) whose QAT model beats it on validation: the baseline is trained
further, its SavedModel, benchmark inputs and variants made again, and the verdicts are judged
against the new one. The other takes a model file as it is (`train.epochs: 0`), a network
trained on other classes (every digit's label moved on by one), at chance on this folder: its
pruned model beats it, yet it is never trained further; its health says it is at chance and its
classes may not be the folder's, and every verdict is marked. Both finish with a summary.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.live import LIGHT, finish_smoke, start_smoke_with
from tfopt.demo_data import write_demo_images

# Two pipeline runs at once, one training its baseline further: 300-570 s in CI beside three
# other test workers on two cores (docs/measurements.md), too close to pytest's default 900 s.
pytestmark = pytest.mark.e2e

SCENARIO = {
    **LIGHT, "convert.tflite": "[int8]", "convert.onnx": "false",
    "benchmark.runoff_margin": "null", "compress.prune.enabled": "false",
    "compress.distill.enabled": "false", "compress.qat.epochs": 4,
    "compress.qat.learning_rate": 0.003,
}


def _file_of_other_classes(path):
    """A small CNN trained on the digits with every label moved on by one: at chance here."""
    import io

    import numpy as np
    import tf_keras as keras
    from PIL import Image
    from sklearn.datasets import load_digits

    from tfopt.demo_data import digit_to_jpeg

    digits = load_digits()
    images = np.stack([np.asarray(Image.open(io.BytesIO(digit_to_jpeg(pixels, 32))),
                                  np.float32) / 255.0 for pixels in digits.images])
    inputs = keras.Input((32, 32, 3), name="images")
    x = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)  # global pooling here relearns far slower
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    keras.utils.set_random_seed(0)
    model.fit(images, (digits.target + 1) % 10, epochs=4, batch_size=64, verbose=0)
    model.save(path)
    return path


def test_a_beaten_baseline_is_trained_further_unless_taken_as_it_is(live_services, tmp_path):
    demo = tmp_path / "demo"
    write_demo_images(demo)
    common = {**SCENARIO, "data.source_dir": demo}
    under_trained = {**common, "name": "beaten", "work_dir": tmp_path / "beaten",
                     "train.epochs": 2, "train.learning_rate": 0.0003}
    as_it_is = {**common, "name": "as-it-is", "work_dir": tmp_path / "as-it-is",
                "model.source": "file",
                "model.path": _file_of_other_classes(tmp_path / "other-classes.keras"),
                "train.epochs": 0,
                # Pruning's plain fine-tuning relearns the labels reliably; QAT's fake
                # quantization on such a start sometimes sticks at one class.
                "compress.qat.enabled": "false", "compress.prune.enabled": "true",
                "compress.prune.target_sparsity": 0.5, "compress.prune.epochs": 4,
                "compress.prune.learning_rate": 0.002}
    started = [start_smoke_with(live_services, tmp_path / "beaten.json", under_trained),
               start_smoke_with(live_services, tmp_path / "as-it-is.json", as_it_is)]
    beaten, kept = (finish_smoke(process, tmp_path / f"{name}.json")
                    for process, name in zip(started, ("beaten", "as-it-is"), strict=True))
    client = MlflowClient(live_services.mlflow_url)

    training = beaten["baseline_training"]
    parent = client.get_run(beaten["mlflow_run_id"])
    assert int(parent.data.params["baseline_continued.continued_epochs"]) >= 1
    assert training["epochs_run"] > 2, "the baseline the verdicts use is the one trained further"
    assert training["verdicts_against_unconverged_baseline"] is None, training
    continued_test = parent.data.metrics["baseline_continued_test_accuracy"]
    assert beaten["baseline_accuracy"] == pytest.approx(continued_test, abs=0.02), (
        "its variants were made again from it")
    by_name = {v["name"]: v for v in beaten["variants"]}
    assert by_name["baseline-tflite-int8"]["status"] == "ok"
    assert by_name["qat-tflite-int8"]["status"] == "ok"

    training = kept["baseline_training"]
    assert training["epochs_run"] == 0 and not training["converged"]
    health = training["health"]
    assert health["status"] == "unhealthy"
    assert "its classes may not be this folder's" in health["reasons"][0]
    note = training["verdicts_against_unconverged_baseline"]
    assert note.startswith("beaten by pruned-50") and "never trained further" in note, note
    assert "unhealthy baseline" in note, note
    parent = client.get_run(kept["mlflow_run_id"])
    assert parent.data.tags["tfopt.baseline_health"] == "unhealthy"
    assert "baseline_continued.continued_epochs" not in parent.data.params
