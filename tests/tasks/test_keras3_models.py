"""Keras 3 models are first-class: trained, traced, exported and packaged by Keras 3 itself;
translated into tf_keras (and checked) only for tensorflow-model-optimization's techniques."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tasks.export_savedmodel import export_savedmodel
from tasks.train_model import train_model
from tests.conftest import write_digit_folder
from tests.steps import training_data
from tfopt.artifacts import VariantSpec
from tfopt.config import TrainConfig
from tfopt.data.pipeline import load_split
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import flavor_of, keras_flavor_of_file, load_keras_model
from tfopt.runtimes import runtime_of

SIZE = 32


def keras3_cnn(num_classes: int):
    import keras

    inputs = keras.Input((SIZE, SIZE, 3), name="images")
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    branch = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    branch = keras.layers.Conv2D(8, 1, activation="hard_swish")(branch)
    x = keras.layers.Add()([x, branch])
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="theirs")


@pytest.fixture(scope="module")
def data32(tmp_path_factory):
    from tasks.write_tfrecords import write_tfrecords
    from tfopt.config import DataConfig

    root = tmp_path_factory.mktemp("keras3")
    folder = write_digit_folder(root / "digits", classes=3, per_class=20, size=SIZE)
    dataset = write_tfrecords.fn(DataConfig(source_dir=folder, image_size=SIZE,
                                            val_fraction=0.15, test_fraction=0.25),
                                 root / "work")
    return training_data(dataset, batch_size=16)


@pytest.fixture(scope="module")
def keras3_baseline(data32, tmp_path_factory):
    """A Keras 3 functional CNN saved by Keras 3, fine-tuned by tfopt (in Keras 3)."""
    root = tmp_path_factory.mktemp("keras3-model")
    keras3_cnn(data32.dataset.num_classes).save(root / "theirs.keras")
    cfg = ModelConfig(source="file", path=root / "theirs.keras")
    return train_model.fn(data32, cfg, TrainConfig(epochs=6, learning_rate=5e-3, stop="fixed"),
                          root / "out")


def test_a_keras3_file_is_trained_and_exported_by_keras3(keras3_baseline, data32, tmp_path):
    assert keras_flavor_of_file(keras3_baseline.path) == "keras3"
    model = load_keras_model(keras3_baseline.path)
    assert flavor_of(model) == "keras3", "trained and saved by Keras 3, not translated"
    assert len(keras3_baseline.history["loss"]) == 6
    losses = keras3_baseline.history["loss"]
    assert losses[-1] < losses[0], "Keras 3's fit trained it"
    savedmodel = export_savedmodel.fn(keras3_baseline, tmp_path)
    images, _ = load_split(data32.dataset, "test")
    served = runtime_of("savedmodel").load_runner(VariantSpec(
        name="s", source="baseline", format="savedmodel", precision="fp32",
        path=savedmodel.path))
    np.testing.assert_allclose(served.predict(images), model.predict(images, verbose=0),
                               atol=1e-4)


@pytest.mark.parametrize("form", ["graph", "xla"])
def test_keras3_graph_and_xla_forms_run_the_keras3_model(keras3_baseline, data32, form):
    runtime = runtime_of(form)
    runner = runtime.load_runner(VariantSpec(
        name=form, source="baseline", format=form, precision="fp32", path=keras3_baseline.path,
        params={"xla_mode": "jit_compile"} if form == "xla" else {}))
    images, _ = load_split(data32.dataset, "test")
    expected = load_keras_model(keras3_baseline.path).predict(images, verbose=0)
    np.testing.assert_allclose(runner.predict(images), expected, atol=1e-4)
    assert runner.inputs[0].shape == (None, SIZE, SIZE, 3)
    assert runtime.flops(runner) > 0, "FLOPs counted on Keras 3 layers too"


def test_keras3_models_go_through_pruning_and_qat_on_a_checked_translation(
        keras3_baseline, data32, tmp_path):
    from techniques.prune import PruneConfig, prune_model
    from techniques.qat import QatConfig, quantize_aware_train

    pruned = prune_model.fn(keras3_baseline, PruneConfig(epochs=2), data32, tmp_path)
    assert pruned.params["translated_from"].startswith("Keras 3.")
    assert pruned.metrics["translation_max_abs_diff"] < 1e-3
    assert pruned.metrics["translation_top1_agreement"] == 1.0
    assert pruned.metrics["sparsity"] > 0.7
    assert flavor_of(load_keras_model(pruned.path)) == "tf_keras"
    qat = quantize_aware_train.fn(keras3_baseline, QatConfig(epochs=2), data32, tmp_path)
    assert qat.metrics["translation_max_abs_diff"] < 1e-3
    assert "tf.nn.relu6" in qat.params["float_layers"], "hard-swish's ops train in float"


def test_keras3_applications_translate_exactly(data32):
    import keras

    from tfopt.models.translate import tf_keras_twin

    images, _ = load_split(data32.dataset, "test")
    for network in (keras.applications.MobileNetV3Small, keras.applications.MobileNetV2):
        model = network(input_shape=(SIZE, SIZE, 3), weights=None, classes=3,
                        classifier_activation=None)
        translation = tf_keras_twin(model, images)
        assert translation.max_abs_diff < 1e-4 and translation.top1_agreement == 1.0
        assert flavor_of(translation.model) == "tf_keras"


def test_a_keras3_upsampling_is_translated_to_the_ops_keras3_converts_to_and_thinned():
    """Keras 3's nearest UpSampling2D repeats rows and columns; tf_keras' layer resizes, which
    LiteRT runs by another kernel: the twin repeats too, and channel pruning follows it."""
    import keras
    import tensorflow as tf

    from tfopt.models.channel_pruning import thin_model
    from tfopt.models.translate import tf_keras_twin

    inputs = keras.Input((8, 8, 3), name="images")
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="down")(
        inputs)
    x = keras.layers.UpSampling2D(name="up")(x)
    model = keras.Model(inputs, keras.layers.Conv2D(2, 1, name="mask")(x))
    images = np.random.default_rng(0).random((4, 8, 8, 3), dtype=np.float32)
    translation = tf_keras_twin(model, images)
    assert translation.max_abs_diff == 0.0
    assert "UpSampling2D" not in {type(layer).__name__ for layer in translation.model.layers}
    interpreter = tf.lite.Interpreter(model_content=tf.lite.TFLiteConverter.from_keras_model(
        translation.model).convert())
    ops = {op["op_name"] for op in interpreter._get_ops_details()}  # no public API lists them
    assert "TILE" in ops and "RESIZE_NEAREST_NEIGHBOR" not in ops, ops
    thinned = thin_model(translation.model, 0.5, min_channels=1)
    assert thinned.kept == {"down": (8, 16)}
    assert thinned.model(images).shape == (4, 8, 8, 2)


SUBCLASSED = """
import keras


@keras.saving.register_keras_serializable(package="user")
class Tiny(keras.Model):
    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        self.conv = keras.layers.Conv2D(8, 3, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(classes)

    def call(self, images):
        return self.head(self.pool(self.conv(images)))

    def get_config(self):
        return {**super().get_config(), "classes": self.classes}


def build(image_size, num_classes):
    model = Tiny(num_classes)
    model(keras.ops.zeros((1, image_size, image_size, 3)))
    return model
"""


def test_a_subclassed_keras3_model_trains_and_converts_but_tfmot_skips_naming_why(
        data32, tmp_path):
    from techniques.base import NotApplicable
    from techniques.prune import PruneConfig, prune_model

    builder = tmp_path / "subclassed.py"
    builder.write_text(textwrap.dedent(SUBCLASSED))
    cfg = ModelConfig(source="builder", builder=f"{builder}:build")
    model = train_model.fn(data32, cfg, TrainConfig(epochs=2), tmp_path / "out")
    savedmodel = export_savedmodel.fn(model, tmp_path / "out")
    assert (Path(savedmodel.path) / "saved_model.pb").is_file()
    probe = ("import sys, numpy as np, tfopt; from tfopt.models.keras_io import load_keras_model;"
             f"m = load_keras_model(__import__('pathlib').Path('{model.path}'));"
             f"print(type(m).__name__, m(np.zeros((1, {SIZE}, {SIZE}, 3), 'float32')).shape)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, timeout=300).stdout.split("\n")[-2]
    assert shown == "Tiny (1, 3)", "another process loads it with the builder's classes"
    with pytest.raises(NotApplicable, match="subclassed Keras 3 model"):
        prune_model.fn(model, PruneConfig(epochs=1), data32, tmp_path)


def test_a_keras3_teacher_is_distilled_and_packaged_with_mlflows_keras_flavor(
        keras3_baseline, data32, tmp_path):
    import mlflow.pyfunc

    from techniques.distill import DistillConfig, distill_model
    from tfopt.packaging import save_variant_model
    from tfopt.runtimes.base import ServingContract

    student = distill_model.fn(keras3_baseline, DistillConfig(epochs=1, student_width=4),
                               data32, tmp_path)
    assert student.params["teacher_parameters"] == load_keras_model(
        keras3_baseline.path).count_params(), "the Keras 3 teacher"
    assert "distillation_gain_points" in student.metrics
    images, _ = load_split(data32.dataset, "test")
    contract = ServingContract(class_names=data32.dataset.class_names, input_scale="unit",
                               example=images[:2])
    folder = save_variant_model(keras3_baseline.path, "graph", "fp32", contract,
                                tmp_path / "packaged")
    assert "keras" in (folder / "MLmodel").read_text()
    expected = load_keras_model(keras3_baseline.path).predict(images, verbose=0)
    np.testing.assert_allclose(mlflow.pyfunc.load_model(str(folder)).predict(images), expected,
                               atol=1e-5)
