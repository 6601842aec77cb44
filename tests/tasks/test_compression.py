from __future__ import annotations

import numpy as np
import pytest

from tasks.convert_tflite import convert_tflite
from tasks.distill_model import distill_model
from tasks.input_pipeline import load_split_arrays
from tasks.prune_model import kernel_sparsity, prune_and_finetune, prune_model
from tasks.quantize_aware_train import quantize_aware_train
from tasks.runners import SavedModelRunner, TFLiteRunner
from tasks.train_model import load_keras_model
from tfopt.config import CompressConfig, ConvertConfig
from tfopt.fileio import sha256_file


@pytest.fixture(scope="module")
def test_images(tiny_dataset):
    images, _ = load_split_arrays(tiny_dataset.splits["test"].files, tiny_dataset.image_size)
    return images


def test_pruning_reaches_the_target_sparsity_and_leaves_its_input(tiny_baseline, tiny_dataset,
                                                                  tmp_path):
    before = sha256_file(tiny_baseline.path)
    cfg = CompressConfig(target_sparsity=0.8, prune_epochs=2)
    pruned = prune_model.fn(tiny_baseline, tiny_dataset, cfg, 16, 0, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    assert pruned.name == "pruned-80" and pruned.path != tiny_baseline.path
    assert pruned.metrics["sparsity"] >= 0.78
    per_layer = kernel_sparsity(load_keras_model(pruned.path))
    assert per_layer and all(value >= 0.75 for value in per_layer.values()), per_layer
    assert kernel_sparsity(load_keras_model(tiny_baseline.path))["logits"] < 0.05


def test_stripped_model_equals_the_pruned_model(tiny_baseline, tiny_dataset, test_images):
    import tensorflow_model_optimization as tfmot

    base = load_keras_model(tiny_baseline.path)
    base_weights = [w.copy() for w in base.get_weights()]
    pruned, _ = prune_and_finetune(base, tiny_dataset, CompressConfig(prune_epochs=1), 16, 0)
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    np.testing.assert_allclose(stripped(test_images, training=False).numpy(),
                               pruned(test_images, training=False).numpy(), atol=1e-6)
    for before, after in zip(base_weights, base.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)


def test_structured_2_4_sparsity(tiny_baseline, tiny_dataset, tmp_path):
    cfg = CompressConfig(structured_2_4=True, prune_epochs=1)
    pruned = prune_model.fn(tiny_baseline, tiny_dataset, cfg, 16, 0, tmp_path)
    assert pruned.name == "pruned-2of4"
    model = load_keras_model(pruned.path)
    kernel = model.get_layer("logits").kernel.numpy()
    groups = kernel.T.reshape(-1, 4)
    assert np.all(np.sum(groups == 0.0, axis=1) >= 2)


def test_qat_converts_to_int8_that_agrees_with_the_float_qat_model(
    tiny_baseline, tiny_dataset, test_images, tmp_path
):
    before = sha256_file(tiny_baseline.path)
    qat = quantize_aware_train.fn(tiny_baseline, tiny_dataset, CompressConfig(qat_epochs=1), 16,
                                  0, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    int8 = convert_tflite.fn(qat, "int8", tiny_dataset, ConvertConfig(calibration_examples=20),
                             tmp_path / "variants")
    assert int8.name == "qat-tflite-int8"
    float_top1 = np.argmax(SavedModelRunner(qat.path).predict(test_images), 1)
    int8_top1 = np.argmax(TFLiteRunner(int8.path).predict(test_images), 1)
    assert np.mean(float_top1 == int8_top1) >= 0.85


def test_distillation_loss_decreases_and_the_control_is_reported(tiny_baseline, tiny_dataset,
                                                                 tmp_path):
    before = sha256_file(tiny_baseline.path)
    cfg = CompressConfig(distill_epochs=4, student_width=4)
    student = distill_model.fn(tiny_baseline, tiny_dataset, cfg, 3e-3, 16, 0, tmp_path)
    assert sha256_file(tiny_baseline.path) == before
    curve = student.history["distillation_loss"]
    assert len(curve) == 4 and curve[-1] < curve[0]
    assert {"test_accuracy", "scratch_test_accuracy", "distillation_gain_points"} <= set(
        student.metrics
    )
    assert student.params["student_parameters"] < student.params["teacher_parameters"]
