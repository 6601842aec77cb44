"""`tfopt benchmark` on a model that is not there or cannot run: one error line, exit code 2."""

from __future__ import annotations

import pytest

from tests.live import run_tfopt
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench-errors") / "demo"
    write_demo_images(folder)
    return folder


def _bad_models(tmp_path):
    corrupt = tmp_path / "corrupt.tflite"
    corrupt.write_bytes(b"not a flatbuffer at all")
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_text("<html>a web page saved as .onnx</html>")
    return {
        str(tmp_path / "missing.tflite"): "missing.tflite does not exist",
        str(corrupt): "corrupt.tflite cannot be opened as tflite",
        str(not_onnx): "model.onnx cannot be opened as onnx",
        "models:/no-such-model@champion": "no registered model 'no-such-model' with alias",
        "models:/no-such-model/7": "no registered model 'no-such-model' with version 7",
        "models:/bad": "is not models:/<name>@<alias>",
    }


def test_bad_input_benchmark_models_are_one_line_errors(live_services, demo, tmp_path):
    for model, message in _bad_models(tmp_path).items():
        done = run_tfopt(live_services, ["benchmark", "--model", model, "--data", str(demo),
                                         "--work-dir", str(tmp_path / "work")], timeout_s=300)
        output = done.stdout + done.stderr
        assert done.returncode == 2, (model, output[-2000:])
        assert message in done.stdout and "error:" in done.stdout, (model, output[-2000:])
        assert "Traceback" not in output, (model, output[-2000:])
        assert not (tmp_path / "work" / "benchmarks").exists(), "refused before any flow ran"
