"""Every variant as an MLflow Model: loads with pyfunc, answers like its runner, benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.steps import to_onnx, to_tflite
from tfopt.data.pipeline import load_split_arrays
from tfopt.models.references import detect_format
from tfopt.models.sources import labels_of
from tfopt.packaging import model_file_of, save_variant_model
from tfopt.runtimes import ConvertConfig
from tfopt.runtimes.base import ServingContract
from tfopt.runtimes.litert import TFLiteRunner
from tfopt.runtimes.onnxruntime import OnnxRunner
from tfopt.runtimes.tensorflow import GraphRunner, SavedModelRunner
from tfopt.serving import LABELS_FILE, read_labels


@pytest.fixture(scope="module")
def images(tiny_dataset) -> np.ndarray:
    return load_split_arrays(tiny_dataset.splits["test"].files, tiny_dataset.image_size)[0][:8]


@pytest.fixture(scope="module")
def contract(tiny_dataset, images) -> ServingContract:
    return ServingContract(tiny_dataset.class_names, "unit", images[:2])


@pytest.fixture(scope="module")
def variant_files(tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("variants")
    cfg = ConvertConfig(calibration_examples=16)
    return {
        "graph": (tiny_baseline.path, "fp32", GraphRunner),
        "savedmodel": (tiny_savedmodel.path, "fp32", SavedModelRunner),
        "tflite": (to_tflite(tiny_savedmodel, "int8", tiny_dataset, cfg, out).path, "int8",
                   TFLiteRunner),
        "onnx": (to_onnx(tiny_savedmodel, tiny_dataset, cfg, out).path, "fp32", OnnxRunner),
    }


@pytest.mark.parametrize("model_format", ["graph", "savedmodel", "tflite", "onnx"])
def test_a_packaged_variant_predicts_what_its_runner_predicts(
    model_format, variant_files, contract, images, tmp_path
):
    import mlflow.pyfunc

    path, precision, runner = variant_files[model_format]
    assert labels_of(path) == list(contract.class_names), "the step wrote labels.txt"
    folder = save_variant_model(path, model_format, precision, contract, tmp_path / "model")
    predicted = mlflow.pyfunc.load_model(str(folder)).predict(images)
    if isinstance(predicted, dict):  # the ONNX flavor answers every output by name
        predicted = predicted["logits"]
    expected = runner(path).predict(images)
    assert np.asarray(predicted).shape == expected.shape
    np.testing.assert_allclose(predicted, expected, atol=1e-4)

    assert read_labels(folder / LABELS_FILE) == list(contract.class_names)
    found_format, found_file = detect_format(folder)
    assert found_format == model_format and found_file.exists()
    np.testing.assert_allclose(runner(found_file).predict(images), expected, atol=1e-4)


def test_a_keras_variant_loads_without_the_legacy_keras_switch(variant_files, contract,
                                                               images, tmp_path):
    folder = save_variant_model(variant_files["graph"][0], "graph", "fp32", contract,
                                tmp_path / "model")
    np.save(tmp_path / "images.npy", images)
    script = (
        "import sys, numpy as np, mlflow.pyfunc\n"
        f"model = mlflow.pyfunc.load_model({str(folder)!r})\n"
        f"print(model.predict(np.load({str(tmp_path / 'images.npy')!r})).shape)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"({len(images)}, {len(contract.class_names)})"


def test_only_tfopt_model_folders_name_a_model_file(tmp_path):
    assert model_file_of(tmp_path) is None
    with pytest.raises(ValueError, match="no model found"):
        detect_format(Path(tmp_path))
