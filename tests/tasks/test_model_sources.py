"""The baseline from the user's own model: a trained file, or their model-building function."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from flows.parameters import PipelineConfig
from tasks.measure_data_layout import measure_data_layout
from tasks.train_model import train_model
from tests.conftest import write_digit_folder
from tests.steps import training_data
from tfopt.config import ConfigError, TrainConfig
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import load_keras_model
from tfopt.models.sources import ModelSourceError, baseline_factory
from tfopt.preflight import check_paths

BUILDER = """
import tf_keras as keras

def build(image_size, num_classes):
    return keras.Sequential([
        keras.Input((image_size, image_size, 3), name="images"),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes),
    ])

def raises(image_size, num_classes):
    raise RuntimeError("no GPU here")

def not_a_model(image_size, num_classes):
    return "a string"
"""


@pytest.fixture(scope="module")
def builder_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("user-code") / "my_model.py"
    path.write_text(textwrap.dedent(BUILDER))
    return path


def test_a_trained_file_with_zero_epochs_is_optimized_as_it_is(tiny_baseline, tiny_data,
                                                               tmp_path):
    cfg = ModelConfig(source="file", path=tiny_baseline.path)
    model = train_model.fn(tiny_data, cfg, TrainConfig(epochs=0), tmp_path)
    assert model.history == {} and model.params["source"] == "file"
    assert model.metrics["test_accuracy"] == tiny_baseline.metrics["test_accuracy"]
    for mine, theirs in zip(load_keras_model(model.path).get_weights(),
                            load_keras_model(tiny_baseline.path).get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_network_nobody_here_wrote_is_fine_tuned_from_its_file(tmp_path):
    import tf_keras as keras

    from tasks.write_tfrecords import write_tfrecords
    from tfopt.config import DataConfig

    folder = write_digit_folder(tmp_path / "digits", classes=3, per_class=12, size=32)
    dataset = write_tfrecords.fn(DataConfig(source_dir=folder, image_size=32), tmp_path / "work")
    network = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                             weights=None, classes=3,
                                             classifier_activation=None)
    network.save(tmp_path / "theirs.keras")
    cfg = ModelConfig(source="file", path=tmp_path / "theirs.keras")
    model = train_model.fn(training_data(dataset, batch_size=8), cfg, TrainConfig(epochs=1),
                           tmp_path / "models")
    assert len(model.history["loss"]) == 1
    assert load_keras_model(model.path).count_params() == network.count_params()


def test_a_builder_function_is_trained_like_a_zoo_network(builder_file, tiny_data, tmp_path):
    cfg = ModelConfig(source="builder", builder=f"{builder_file}:build")
    model = train_model.fn(tiny_data, cfg, TrainConfig(epochs=2), tmp_path)
    assert model.params["builder"] == f"{builder_file}:build"
    assert len(model.history["loss"]) == 2
    assert model.num_classes == tiny_data.dataset.num_classes


@pytest.mark.parametrize(
    ("function", "message"),
    [("missing", "has no function 'missing'"), ("raises", "raised RuntimeError: no GPU here"),
     ("not_a_model", "returned a builtins.str, not a Keras model")],
)
def test_bad_input_builder_is_refused_naming_it(builder_file, tiny_dataset, function, message):
    cfg = ModelConfig(source="builder", builder=f"{builder_file}:{function}")
    with pytest.raises(ModelSourceError, match=r"model\.builder") as caught:
        baseline_factory(cfg, tiny_dataset.image_size, tiny_dataset.num_classes)
    assert message in str(caught.value)


def test_bad_input_model_files_are_refused_naming_the_field(tiny_baseline, tiny_dataset,
                                                            tmp_path):
    import keras as keras3

    size, classes = tiny_dataset.image_size, tiny_dataset.num_classes
    cases = {}
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(b"not a model")
    cases[corrupt] = "cannot be loaded by tf_keras (Keras 2)"
    keras3_file = tmp_path / "keras3.keras"
    keras3.Sequential([keras3.Input((size, size, 5)), keras3.layers.Flatten(),
                       keras3.layers.Dense(classes)]).save(keras3_file)
    cases[keras3_file] = "expected one image tensor [batch, height, width, channels] with 1"
    for path, message in cases.items():
        with pytest.raises(ModelSourceError, match=r"model\.path") as caught:
            baseline_factory(ModelConfig(source="file", path=path), size, classes)
        assert message in str(caught.value)
    file_cfg = ModelConfig(source="file", path=tiny_baseline.path)
    with pytest.raises(ModelSourceError, match=f"input is {size}x{size} but data.image_size is 24"):
        baseline_factory(file_cfg, 24, classes)
    with pytest.raises(ModelSourceError, match=f"{classes} outputs but the data folder has 5"):
        baseline_factory(file_cfg, size, 5)


def test_bad_input_model_source_settings_are_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"needs model\.path"):
        ModelConfig(source="file")
    with pytest.raises(ValueError, match=r"train\.epochs: 0 trains nothing"):
        PipelineConfig.model_validate({"model": {"source": "builder", "builder": "m.py:build"},
                                       "train": {"epochs": 0}})
    with pytest.raises(ValueError, match=r"not a \.keras, \.h5, \.hdf5, \.tflite or \.onnx file"):
        ModelConfig(source="file", path=tmp_path / "model.pt")
    missing = PipelineConfig.model_validate({
        "data": {"source_dir": str(tmp_path)}, "work_dir": str(tmp_path / "work"),
        "model": {"source": "file", "path": str(tmp_path / "gone.keras")}})
    with pytest.raises(ConfigError, match=r"model\.path: .*gone\.keras does not exist"):
        check_paths(missing)


def test_a_users_model_is_measured_in_its_own_layout_only(tiny_baseline, tiny_dataset):
    cfg = ModelConfig(source="file", path=tiny_baseline.path)
    layout = measure_data_layout.fn(tiny_dataset, cfg, 8, 3)
    assert layout.nhwc_examples_per_s > 0 and layout.nchw_examples_per_s is None
    assert "NCHW not measured" in layout.note


def test_input_scales_map_the_same_pixels(tiny_dataset):
    from tfopt.data.pipeline import load_split

    unit, labels = load_split(tiny_dataset, "test", 8)
    symmetric, same_labels = load_split(tiny_dataset, "test", 8, scale="symmetric")
    raw, _ = load_split(tiny_dataset, "test", 8, scale="raw")
    np.testing.assert_array_equal(labels, same_labels)
    assert unit.min() >= 0.0 and unit.max() <= 1.0 and raw.max() > 1.0
    np.testing.assert_allclose(symmetric, unit * 2.0 - 1.0, atol=1e-5)
    np.testing.assert_allclose(raw, unit * 255.0, atol=1e-3)


RAW_BUILDER = """
import tf_keras as keras

def build(image_size, num_classes):
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
    for filters in (16, 32):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


def test_a_raw_pixel_model_is_trained_calibrated_and_measured_on_raw_pixels(tiny_dataset,
                                                                            tmp_path):
    from tasks.export_savedmodel import export_savedmodel
    from tests.steps import to_tflite
    from tfopt.data.pipeline import load_split
    from tfopt.runtimes import ConvertConfig
    from tfopt.runtimes.litert import TFLiteRunner
    from tfopt.runtimes.tensorflow import SavedModelRunner

    (tmp_path / "raw_model.py").write_text(RAW_BUILDER)
    cfg = ModelConfig(source="builder", builder=f"{tmp_path / 'raw_model.py'}:build",
                      input_scale="raw")
    data = training_data(tiny_dataset).model_copy(update={"input_scale": "raw"})
    model = train_model.fn(data, cfg, TrainConfig(epochs=10), tmp_path / "models")
    assert model.input_scale == "raw"
    assert model.metrics["test_accuracy"] > 0.5, "it learns from raw pixels"
    savedmodel = export_savedmodel.fn(model, tmp_path / "models")
    int8 = to_tflite(savedmodel, "int8", tiny_dataset, ConvertConfig(calibration_examples=30),
                     tmp_path / "variants")
    raw_images, _ = load_split(tiny_dataset, "test", scale="raw")
    float_top1 = np.argmax(SavedModelRunner(savedmodel.path).predict(raw_images), 1)
    int8_top1 = np.argmax(TFLiteRunner(int8.path).predict(raw_images), 1)
    assert np.mean(float_top1 == int8_top1) >= 0.85, "calibrated on the same raw pixels"


def test_a_model_file_with_labels_must_list_the_data_classes_in_order(tiny_baseline,
                                                                      tiny_dataset, tmp_path):
    from tfopt.serving import write_labels

    size, names = tiny_dataset.image_size, list(tiny_dataset.class_names)
    theirs = tmp_path / "theirs.keras"
    theirs.write_bytes(tiny_baseline.path.read_bytes())
    cfg = ModelConfig(source="file", path=theirs)
    write_labels(tmp_path, names)
    assert baseline_factory(cfg, size, len(names), names)() is not None
    write_labels(tmp_path, names[::-1])
    with pytest.raises(ModelSourceError, match=r"model\.path: .*in another order"):
        baseline_factory(cfg, size, len(names), names)
    write_labels(tmp_path, [f"other-{name}" for name in names])
    with pytest.raises(ModelSourceError, match=r"other classes .*model \['other-"):
        baseline_factory(cfg, size, len(names), names)


def test_every_produced_model_carries_the_class_order(tiny_baseline, tiny_savedmodel,
                                                      tiny_dataset):
    from tfopt.models.sources import labels_of

    names = list(tiny_dataset.class_names)
    assert tiny_baseline.class_names == names
    assert labels_of(tiny_baseline.path) == names, "labels.txt beside baseline.keras"
    assert labels_of(tiny_savedmodel.path) == names, "assets/labels.txt in the SavedModel"


def test_a_builder_outside_the_allowed_folders_is_refused_naming_the_setting(
        builder_file, tiny_dataset, monkeypatch, tmp_path):
    monkeypatch.setenv("TFOPT_CODE_DIRS", str(tmp_path / "only-here"))
    cfg = ModelConfig(source="builder", builder=f"{builder_file}:build")
    with pytest.raises(ModelSourceError, match=r"model\.builder: .*my_model\.py is outside the "
                                               r"folders this machine runs code from .*"
                                               r"TFOPT_CODE_DIRS"):
        baseline_factory(cfg, tiny_dataset.image_size, tiny_dataset.num_classes)
    monkeypatch.setenv("TFOPT_CODE_DIRS", str(builder_file.parent))
    assert baseline_factory(cfg, tiny_dataset.image_size, tiny_dataset.num_classes)() is not None


def test_a_model_that_crashes_tensorflow_when_opened_is_one_line_not_the_end_of_the_run(
        tiny_data_cfg, tiny_dataset, tmp_path, monkeypatch):
    from tasks.inspect_model import inspect_model
    from tfopt.native import RECORD_ENV, NativeCrashError
    from tfopt.preflight import check_run

    crashing = tmp_path / "crashing.py"
    crashing.write_text(textwrap.dedent('''
        import os
        import signal


        def build(image_size, num_classes):
            os.kill(os.getpid(), signal.SIGSEGV)
    '''))
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "crashes.jsonl"))
    cfg = ModelConfig(source="builder", builder=f"{crashing}:build")
    with pytest.raises(NativeCrashError, match=r"^inspect_model crashed: .*SIGSEGV"):
        inspect_model.fn(cfg, tiny_dataset)
    config = PipelineConfig(data=tiny_data_cfg, model=cfg, work_dir=tmp_path / "work")
    with pytest.raises(ConfigError, match=r"^model: opening or building it crashed"):
        check_run(config)
