"""Models from the wild: a Keras 2-era grayscale .hdf5 with a softmax end, and pretrained
networks put on the data's classes (``model.head: replace``)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.export_savedmodel import export_savedmodel
from tasks.inspect_model import inspect_model
from tasks.train_model import train_model
from tests.conftest import write_digit_folder
from tests.steps import to_onnx, to_tflite, training_data
from tfopt.config import TrainConfig
from tfopt.data.pipeline import load_split
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import load_keras_model
from tfopt.models.sources import ModelSourceError, baseline_factory
from tfopt.runtimes import ConvertConfig, runtime_of

SIZE = 32


def mini_xception(classes: int):
    """Arriaga et al.'s mini-Xception shape (emotion classifiers): grayscale in, softmax out."""
    import tf_keras as keras

    inputs = keras.Input((SIZE, SIZE, 1))
    x = keras.layers.Conv2D(8, 3, use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    residual = keras.layers.Conv2D(16, 1, strides=2, padding="same", use_bias=False)(x)
    residual = keras.layers.BatchNormalization()(residual)
    x = keras.layers.SeparableConv2D(16, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.SeparableConv2D(16, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = keras.layers.add([x, residual])
    x = keras.layers.Conv2D(classes, 3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", name="predictions")(x))


@pytest.fixture(scope="module")
def emotion_file(tmp_path_factory):
    """A trained-looking grayscale classifier of 7 classes saved as legacy HDF5 (.hdf5)."""
    import tf_keras as keras

    path = tmp_path_factory.mktemp("wild") / "emotion_model.hdf5"
    model = mini_xception(7)
    keras.utils.set_random_seed(3)
    model.compile(optimizer="adam", loss="categorical_crossentropy")  # saved with its state
    model.save(path)
    return path


def _data(tmp_path_factory, classes: int):
    from tasks.write_tfrecords import write_tfrecords
    from tfopt.config import DataConfig

    root = tmp_path_factory.mktemp(f"faces{classes}")
    folder = write_digit_folder(root / "digits", classes=classes, per_class=12, size=SIZE)
    dataset = write_tfrecords.fn(DataConfig(source_dir=folder, image_size=SIZE,
                                            val_fraction=0.15, test_fraction=0.25),
                                 root / "work")
    return training_data(dataset, batch_size=16)


def test_a_grayscale_softmax_hdf5_goes_through_as_it_is(emotion_file, tmp_path_factory,
                                                       tmp_path):
    data = _data(tmp_path_factory, 7)
    cfg = ModelConfig(source="file", path=emotion_file)
    facts = inspect_model.fn(cfg, data.dataset)
    assert (facts.kind, facts.keras, facts.channels, facts.output) == (
        "keras", "tf_keras", 1, "softmax")
    data = data.model_copy(update={"dataset": data.dataset.model_copy(
        update={"channels": facts.channels})})
    baseline = train_model.fn(data, cfg, TrainConfig(epochs=0), tmp_path)
    assert baseline.channels == 1
    images, _ = load_split(data.dataset, "test")
    assert images.shape[1:] == (SIZE, SIZE, 1), "the RGB shards are read as grayscale"
    theirs = load_keras_model(emotion_file).predict(images, verbose=0)
    logits = load_keras_model(baseline.path).predict(images, verbose=0)
    np.testing.assert_allclose(_softmax(logits), theirs, atol=1e-5)
    savedmodel = export_savedmodel.fn(baseline, tmp_path)
    for variant in (to_tflite(savedmodel, "fp32", data.dataset, ConvertConfig(), tmp_path),
                    to_onnx(savedmodel, data.dataset, ConvertConfig(), tmp_path)):
        assert variant.status == "ok", variant.error
        runner = runtime_of(variant.format).load_runner(variant)
        np.testing.assert_allclose(runner.run(images)["probabilities"], theirs, atol=1e-4)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def test_a_pretrained_model_is_put_on_the_datas_classes(emotion_file, tmp_path_factory,
                                                        tmp_path):
    data = _data(tmp_path_factory, 3)
    keep = ModelConfig(source="file", path=emotion_file)
    with pytest.raises(ModelSourceError, match="7 outputs but the data folder has 3 classes"):
        baseline_factory(keep, SIZE, 3)
    cfg = ModelConfig(source="file", path=emotion_file, head="replace")
    facts = inspect_model.fn(cfg, data.dataset)
    classifier = [layer.name for layer in load_keras_model(emotion_file).layers
                  if type(layer).__name__ == "Conv2D"][-1]
    assert facts.head_replaced == classifier and facts.channels == 1
    data = data.model_copy(update={"dataset": data.dataset.model_copy(
        update={"channels": facts.channels})})
    before = load_keras_model(emotion_file)
    baseline = train_model.fn(data, cfg, TrainConfig(epochs=1, head_epochs=2), tmp_path)
    assert len(baseline.history["head_loss"]) == 2 and len(baseline.history["loss"]) == 1
    model = load_keras_model(baseline.path)
    assert model.output_shape == (None, 3) and model.layers[-2].name == "logits"
    assert model.get_layer("separable_conv2d").get_weights()[0].shape == before.get_layer(
        "separable_conv2d").get_weights()[0].shape
    assert (tmp_path / "labels.txt").read_text().split() == data.dataset.class_names


def test_a_head_that_cannot_be_followed_back_is_refused_naming_the_layer(tmp_path):
    import tf_keras as keras

    inputs = keras.Input((SIZE, SIZE, 3))
    left = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
    right = keras.layers.GlobalMaxPooling2D()(keras.layers.Conv2D(4, 3)(inputs))
    two_heads = keras.Model(inputs, keras.layers.Concatenate()([left, right]))
    two_heads.save(tmp_path / "two.keras")
    cfg = ModelConfig(source="file", path=tmp_path / "two.keras", head="replace")
    with pytest.raises(ModelSourceError,
                       match=r"concatenate \(Concatenate\) in model\.path takes several inputs"):
        baseline_factory(cfg, SIZE, 3)
    with pytest.raises(ValueError, match=r"model\.head: replace is for a model you bring"):
        ModelConfig(head="replace")
