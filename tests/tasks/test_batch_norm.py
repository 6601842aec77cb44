"""Batch-norm statistics re-estimated before a model is judged; QAT ranges set from images."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tf_keras

from techniques.qat import make_quantization_aware
from tfopt.models.batch_norm import (
    batch_norm_layers,
    reestimate,
    reestimated_if_better,
)
from tfopt.models.quantization_ranges import (
    calibrate_ranges,
    moving_average_ranges,
)
from tfopt.models.training import fit

RNG = np.random.default_rng(0)


def _net(module, image_size: int = 8, classes: int = 3):
    inputs = module.Input((image_size, image_size, 3))
    x = module.layers.Conv2D(4, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = module.layers.BatchNormalization(name="bn")(x)
    x = module.layers.ReLU(name="relu")(x)
    x = module.layers.GlobalAveragePooling2D(name="pool")(x)
    return module.Model(inputs, module.layers.Dense(classes, name="logits")(x))


@pytest.mark.parametrize("module", [tf_keras, keras], ids=["tf_keras", "keras3"])
def test_the_moving_statistics_become_the_mean_over_the_images(module):
    model = _net(module)
    (bn,) = batch_norm_layers(model)
    bn.moving_mean.assign(np.full(4, 5.0, np.float32))
    bn.moving_variance.assign(np.full(4, 100.0, np.float32))
    images = RNG.random((96, 8, 8, 3), dtype=np.float32)
    reestimate(model, [bn], images, batch_size=32)
    conv = np.asarray(model.get_layer("conv")(images))
    batches = [conv[start:start + 32] for start in range(0, 96, 32)]
    assert np.allclose(np.array(bn.moving_mean), np.mean([b.mean(axis=(0, 1, 2))
                                                          for b in batches], axis=0), atol=1e-4)
    assert np.allclose(np.array(bn.moving_variance),
                       np.mean([b.var(axis=(0, 1, 2)) for b in batches], axis=0), rtol=0.05)
    assert bn.momentum == pytest.approx(0.99), "its momentum as it was"


def test_stale_statistics_are_replaced_and_better_ones_kept():
    model = _net(tf_keras)
    (bn,) = batch_norm_layers(model)
    images = RNG.random((64, 8, 8, 3), dtype=np.float32)
    labels = np.argmax(np.asarray(model(images, training=False)), axis=1)
    kept_mean = np.array(bn.moving_mean)
    # The labels are what the statistics as they are predict: nothing scores better.
    judged = reestimated_if_better(model, [bn], images * 50.0, images, labels)
    assert judged["bn_val_accuracy_before"] == 1.0
    if judged["bn_val_accuracy_after"] < 1.0:
        assert judged["bn_reestimated"] == 0.0
        assert np.array_equal(np.array(bn.moving_mean), kept_mean), "the better ones restored"
    # Labels the statistics of these images predict; stale ones (every unit switched off)
    # predict worse, and re-estimating from the same images gives those statistics back.
    reestimate(model, [bn], images)
    labels = np.argmax(np.asarray(model(images, training=False)), axis=1)
    bn.moving_mean.assign(np.full(4, 40.0, np.float32))
    judged = reestimated_if_better(model, [bn], images, images, labels)
    assert judged["bn_val_accuracy_after"] == 1.0 and judged["bn_reestimated"] == 1.0


def test_models_without_batch_norm_are_left_alone():
    plain = tf_keras.Sequential([tf_keras.Input((8, 8, 3)), tf_keras.layers.Flatten(),
                                 tf_keras.layers.Dense(3)])
    assert batch_norm_layers(plain) == []


def test_a_quantization_aware_model_keeps_its_ranges_when_its_statistics_are_reestimated():
    qat, _ = make_quantization_aware(_net(tf_keras))
    (bn,) = batch_norm_layers(qat)
    ranges = moving_average_ranges(qat)
    for quantizer in ranges:
        quantizer.low.assign(np.full(quantizer.low.shape, -1.5, np.float32))
        quantizer.high.assign(np.full(quantizer.high.shape, 2.5, np.float32))
    bn.moving_mean.assign(np.full(4, 5.0, np.float32))
    reestimate(qat, [bn], RNG.random((64, 8, 8, 3), dtype=np.float32))
    assert not np.allclose(np.array(bn.moving_mean), 5.0), "the statistics re-estimated"
    assert ranges and all(float(np.min(q.low)) == -1.5 and float(np.max(q.high)) == 2.5
                          for q in ranges), "the ranges the training pass moved put back"


def test_quantization_ranges_start_where_the_float_tensors_are():
    base = _net(tf_keras)
    qat, _ = make_quantization_aware(base)
    images = RNG.random((96, 8, 8, 3), dtype=np.float32) * 4.0
    calibrated = calibrate_ranges(qat, base, images, batch_size=32)
    assert calibrated == ["logits", "pool", "relu"]
    ranges = {q.layer: q for q in moving_average_ranges(qat)}
    logits = np.asarray(base(images, training=False))
    batches = [logits[start:start + 32] for start in range(0, 96, 32)]
    assert float(ranges["logits"].high) == pytest.approx(
        np.mean([max(b.max(), 0.0) for b in batches]), rel=1e-5)
    assert float(ranges["logits"].low) == pytest.approx(
        np.mean([min(b.min(), 0.0) for b in batches]), rel=1e-5)
    assert float(ranges["relu"].low) == 0.0, "0 always inside a range, as tfmot keeps it"


def test_every_validation_of_a_training_sees_reestimated_statistics(tiny_data):
    model = _net(tf_keras, image_size=16, classes=tiny_data.dataset.num_classes)
    fitted = fit(model, tiny_data, epochs=2, learning_rate=1e-3)
    for key in ("bn_val_accuracy_before", "bn_val_accuracy_after", "bn_reestimated"):
        assert len(fitted.curves[key]) == 2, key
    kept = [max(before, after) for before, after in zip(
        fitted.curves["bn_val_accuracy_before"], fitted.curves["bn_val_accuracy_after"],
        strict=True)]
    assert fitted.curves["val_accuracy"] == pytest.approx(kept, abs=1e-6), (
        "Keras validated the statistics kept")
