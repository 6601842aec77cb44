"""A user's SavedModel, .tflite or .onnx file taken in as the baseline, checked before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from flows.parameters import PipelineConfig
from tasks.import_model import import_model
from tests.steps import to_onnx, to_tflite
from tfopt.config import ConfigError
from tfopt.data.pipeline import load_split_arrays
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import load_keras_model
from tfopt.models.sources import ModelSourceError, baseline_factory
from tfopt.preflight import check_paths
from tfopt.runtimes import ConvertConfig
from tfopt.runtimes.litert import TFLiteRunner
from tfopt.runtimes.onnxruntime import OnnxRunner
from tfopt.runtimes.tensorflow import SavedModelRunner
from tfopt.serving import write_labels


@pytest.fixture(scope="module")
def images(tiny_dataset) -> np.ndarray:
    return load_split_arrays(tiny_dataset.splits["test"].files, tiny_dataset.image_size)[0]


def _plain_savedmodel(keras_path: Path, out: Path, size: int) -> Path:
    """A SavedModel without Keras metadata, with its own signature and tensor names."""
    model = load_keras_model(keras_path)
    module = tf.Module()
    module.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, size, size, 3], tf.float32, "pixels")])
    def predict(pixels):
        return {"scores": model(pixels, training=False)}

    module.predict = predict
    tf.saved_model.save(module, str(out), signatures={"predict": predict})
    assert not (out / "keras_metadata.pb").exists()
    return out


def _file_cfg(path: Path) -> ModelConfig:
    return ModelConfig(source="file", path=path)


def test_a_plain_savedmodel_is_reexported_with_the_serving_contract(
    tiny_baseline, tiny_dataset, images, tmp_path
):
    theirs = _plain_savedmodel(tiny_baseline.path, tmp_path / "theirs", tiny_dataset.image_size)
    assert _file_cfg(theirs).kind == "savedmodel"
    baseline = import_model.fn(_file_cfg(theirs), tiny_dataset, tmp_path / "models")
    assert baseline.format == "savedmodel" and baseline.class_names == tiny_dataset.class_names
    expected = load_keras_model(tiny_baseline.path)(images).numpy()
    np.testing.assert_allclose(SavedModelRunner(baseline.path).predict(images), expected,
                               atol=1e-5)
    assert (baseline.path / "assets" / "labels.txt").is_file()


def test_tflite_and_onnx_files_are_taken_as_they_are(tiny_savedmodel, tiny_dataset, images,
                                                     tmp_path):
    cfg = ConvertConfig(calibration_examples=16)
    cases = {
        "int8": to_tflite(tiny_savedmodel, "int8", tiny_dataset, cfg, tmp_path / "int8").path,
        "fp32": to_tflite(tiny_savedmodel, "fp32", tiny_dataset, cfg, tmp_path / "fp32").path,
        "onnx": to_onnx(tiny_savedmodel, tiny_dataset, cfg, tmp_path / "onnx").path,
    }
    for precision, path in cases.items():
        baseline = import_model.fn(_file_cfg(path), tiny_dataset, tmp_path / f"in-{precision}")
        runner = OnnxRunner if path.suffix == ".onnx" else TFLiteRunner
        assert baseline.format == path.suffix[1:]
        assert baseline.precision == ("fp32" if precision == "onnx" else precision)
        np.testing.assert_array_equal(runner(baseline.path).predict(images),
                                      runner(path).predict(images))


def test_a_keras_savedmodel_folder_is_a_keras_model(tiny_baseline, tiny_dataset, tmp_path):
    folder = tmp_path / "keras-savedmodel"
    load_keras_model(tiny_baseline.path).save(folder, save_format="tf")
    cfg = _file_cfg(folder)
    assert cfg.kind == "keras"
    model = baseline_factory(cfg, tiny_dataset.image_size, tiny_dataset.num_classes)()
    assert model.output_shape[-1] == tiny_dataset.num_classes


def test_bad_input_model_files_are_refused_naming_both_values(
    tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path
):
    size, classes = tiny_dataset.image_size, tiny_dataset.num_classes
    tflite = to_tflite(tiny_savedmodel, "fp32", tiny_dataset, ConvertConfig(), tmp_path).path
    bigger = tiny_dataset.model_copy(update={"image_size": size + 8})
    with pytest.raises(ModelSourceError, match=f"input is {size}x{size} but data.image_size is "
                                               f"{size + 8}"):
        import_model.fn(_file_cfg(tflite), bigger, tmp_path / "a")
    (tflite.parent / "labels.txt").unlink()  # else its class names are refused first
    more = tiny_dataset.model_copy(update={"class_names": [*tiny_dataset.class_names, "extra"]})
    with pytest.raises(ModelSourceError, match=f"{classes} outputs but the data folder has "
                                               f"{classes + 1} classes"):
        import_model.fn(_file_cfg(tflite), more, tmp_path / "b")
    corrupt = tmp_path / "corrupt.tflite"
    corrupt.write_bytes(b"not a flatbuffer")
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_text("hello")
    for path in (corrupt, not_onnx):
        with pytest.raises(ModelSourceError, match=rf"model\.path: .*{path.name} cannot be read"):
            import_model.fn(_file_cfg(path), tiny_dataset, tmp_path / "c")
    write_labels(tflite.parent, list(reversed(tiny_dataset.class_names)))
    with pytest.raises(ModelSourceError, match="in another order"):
        import_model.fn(_file_cfg(tflite), tiny_dataset, tmp_path / "d")


def test_bad_input_a_model_tfopt_cannot_train_with_epochs_is_refused(tmp_path, digit_folder):
    tflite = tmp_path / "model.tflite"
    tflite.write_bytes(b"x")
    config = PipelineConfig.model_validate({
        "data": {"source_dir": str(digit_folder)}, "work_dir": str(tmp_path / "work"),
        "model": {"source": "file", "path": str(tflite)}, "train": {"epochs": 2}})
    with pytest.raises(ConfigError,
                       match=r"train\.epochs: 2 .* tflite model, .* set train\.epochs: 0"):
        check_paths(config)
    with pytest.raises(ValueError, match=r"model\.path: .*model\.pt is not a \.keras"):
        ModelConfig(source="file", path=tmp_path / "model.pt")
