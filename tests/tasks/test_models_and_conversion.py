from __future__ import annotations

import numpy as np
import tensorflow as tf

from tasks.benchmark_variant import benchmark_variant
from tasks.export_savedmodel import export_savedmodel
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tests.steps import to_tflite
from tfopt.config import BenchmarkConfig
from tfopt.data.pipeline import load_split_arrays
from tfopt.fileio import sha256_file
from tfopt.models.keras_io import load_keras_model
from tfopt.runtimes import ConvertConfig
from tfopt.runtimes.litert import TFLiteRunner
from tfopt.runtimes.tensorflow import GraphRunner, SavedModelRunner

TFLITE_FP32_ATOL = 1e-4


def _test_images(dataset, limit=24):
    images, _ = load_split_arrays(dataset.splits["test"].files, dataset.image_size, limit)
    return images


def test_training_learns_better_than_chance(tiny_baseline, tiny_dataset):
    assert tiny_baseline.path.exists()
    assert tiny_baseline.history["loss"][-1] < tiny_baseline.history["loss"][0]
    images, labels = load_split_arrays(tiny_dataset.splits["train"].files, 16)
    logits = GraphRunner(tiny_baseline.path).predict(images)
    assert np.mean(np.argmax(logits, 1) == labels) > 1.0 / tiny_dataset.num_classes


def test_exported_savedmodel_reloads_and_matches_keras(tiny_baseline, tiny_dataset, tmp_path):
    before = sha256_file(tiny_baseline.path)
    exported = export_savedmodel.fn(tiny_baseline, tmp_path)
    assert sha256_file(tiny_baseline.path) == before, "export changed its input model"
    images = _test_images(tiny_dataset)
    keras_out = load_keras_model(tiny_baseline.path)(images, training=False).numpy()
    loaded = tf.saved_model.load(str(exported.path))
    signature = loaded.signatures["serving_default"]
    assert list(signature.structured_input_signature[1]) == ["images"]
    outputs = signature(images=tf.constant(images))
    assert set(outputs) == {"logits", "probabilities"}
    np.testing.assert_allclose(outputs["logits"].numpy(), keras_out, atol=1e-5)
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(1), 1.0, atol=1e-5)
    single = SavedModelRunner(exported.path).predict(images[:1])
    np.testing.assert_allclose(single, keras_out[:1], atol=1e-5)


def test_tflite_fp32_matches_the_savedmodel(tiny_baseline, tiny_dataset, tmp_path):
    exported = export_savedmodel.fn(tiny_baseline, tmp_path)
    variant = to_tflite(exported, "fp32", tiny_dataset, ConvertConfig(),
                                tmp_path / "variants")
    assert variant.name == "baseline-tflite-fp32" and variant.path.stat().st_size > 0
    images = _test_images(tiny_dataset)
    reference = SavedModelRunner(exported.path).predict(images)
    runner = TFLiteRunner(variant.path, threads=1)
    np.testing.assert_allclose(runner.predict(images), reference, atol=TFLITE_FP32_ATOL)
    np.testing.assert_allclose(runner.predict(images[:1]), reference[:1], atol=TFLITE_FP32_ATOL)


def test_benchmark_reports_accuracy_latency_and_sizes(tiny_baseline, tiny_dataset, tmp_path):
    from tfopt.artifacts import VariantSpec

    spec = VariantSpec(name="baseline-graph", source="baseline", format="graph",
                       precision="fp32", path=tiny_baseline.path)
    cfg = BenchmarkConfig(warmup_runs=2, min_runs=12, min_seconds=0, max_seconds=5,
                          isolate=False)
    exported = export_savedmodel.fn(tiny_baseline, tmp_path)
    inputs = prepare_benchmark_inputs.fn(_reference(exported), tiny_dataset, tmp_path / "inputs")
    result = benchmark_variant.fn(spec, inputs, cfg)
    assert result.top1_agreement == 1.0
    images, labels = load_split_arrays(tiny_dataset.splits["test"].files, 16)
    expected = np.mean(np.argmax(GraphRunner(tiny_baseline.path).predict(images), 1) == labels)
    assert result.status == "ok" and result.timed_runs >= 12
    assert abs(result.accuracy - expected) < 1e-9
    stats = result.latency_ms
    assert 0 < stats.p50 <= stats.p90 <= stats.p99
    assert 0 < result.gzip_bytes < result.size_bytes
    assert result.throughput_per_s > 0


def test_a_model_benchmarked_alone_is_its_own_reference_and_opened_only_when_measured(
    tiny_savedmodel, tiny_dataset, tmp_path
):
    from tfopt.artifacts import VariantSpec

    inputs = prepare_benchmark_inputs.fn(None, tiny_dataset, tmp_path / "inputs")
    written = sorted(path.name for path in inputs.images.parent.iterdir())
    assert inputs.reference_logits is None
    assert written == ["harness-floor", "test-images.npy", "test-labels.npy", "val-images.npy",
                       "val-labels.npy"], "the test split to report, the validation to choose"
    spec = VariantSpec(name="theirs", source="theirs", format="savedmodel", precision="fp32",
                       path=tiny_savedmodel.path)
    result = benchmark_variant.fn(spec, inputs, BenchmarkConfig(
        warmup_runs=1, min_runs=5, min_seconds=0, max_seconds=5))
    assert result.status == "ok" and result.top1_agreement == 1.0 and result.max_abs_diff == 0.0
    assert result.val_accuracy is not None and result.predictions.is_file()
    assert result.val_predictions.is_file() and result.val_predictions != result.predictions


def test_mixed_precision_training_saves_a_float32_model(tiny_dataset, tmp_path):
    import tf_keras as keras

    from tasks.train_model import train_model
    from tests.steps import training_data
    from tfopt.config import TrainConfig
    from tfopt.models.config import ModelConfig

    model = train_model.fn(
        training_data(tiny_dataset, seed=42), ModelConfig(width=4),
        TrainConfig(epochs=1, batch_size=16, mixed_precision="mixed_bfloat16"), tmp_path,
    )
    assert model.params["mixed_precision"] == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == "float32", "policy leaked"
    loaded = load_keras_model(model.path)
    assert all(w.dtype == tf.float32 for w in loaded.weights)
    assert loaded.layers[1].dtype_policy.name == "float32"
    images = _test_images(tiny_dataset, 4)
    assert np.all(np.isfinite(loaded(images).numpy()))


def test_mirrored_strategy_training_learns_and_reloads(tiny_dataset, tmp_path):
    from tasks.train_model import train_model
    from tests.steps import training_data
    from tfopt.config import TrainConfig
    from tfopt.models.config import ModelConfig

    model = train_model.fn(
        training_data(tiny_dataset, seed=42), ModelConfig(width=8),
        TrainConfig(epochs=3, batch_size=16, distribute="mirrored"), tmp_path,
    )
    assert model.params["distribute"].startswith("mirrored (")
    assert model.history["loss"][-1] < model.history["loss"][0]
    loaded = load_keras_model(model.path)
    images = _test_images(tiny_dataset, 4)
    assert loaded(images).shape == (4, tiny_dataset.num_classes)


def _reference(savedmodel):
    from tfopt.artifacts import VariantSpec

    return VariantSpec(name="baseline-savedmodel", source="baseline", format="savedmodel",
                       precision="fp32", path=savedmodel.path)
