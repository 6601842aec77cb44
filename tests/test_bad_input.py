"""Bad parameters and bad data: refused before any work, or skipped and counted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from cli.main import main
from flows.parameters import load_pipeline_config
from tasks.write_tfrecords import write_tfrecords
from tests.conftest import write_digit_folder
from tfopt.config import ConfigError, DataConfig
from tfopt.data.sources import NoUsableDataError
from tfopt.preflight import check_paths

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"


@pytest.mark.parametrize(
    ("override", "field", "allowed"),
    [
        ({"compress.prune.target_sparsity": 1.5}, "compress.prune.target_sparsity", "0.95"),
        ({"train.epochs": -3}, "train.epochs", "greater than or equal to 0"),
        ({"model.architecture": "resnet9000"}, "model.architecture", "mobilenet_v2"),
        ({"model.data_format": "NCWH"}, "model.data_format", "channels_first"),
        ({"data.image_size": 4}, "data.image_size", "8"),
        ({"data.test_fraction": 0.0}, "data.test_fraction", "0"),
        ({"data.val_fraction": 0.4, "data.test_fraction": 0.4}, "data", "0.8"),
        ({"data.compression": "zip"}, "data.compression", "gzip"),
        ({"convert.tflite": ["int4"]}, "convert.tflite.0", "int8"),
        ({"convert.onnx_opset": 11}, "convert.onnx_opset", "17"),
        ({"convert.calibration_examples": 0}, "convert.calibration_examples", "1"),
        ({"benchmark.threads": 0}, "benchmark.threads", "1"),
        ({"benchmark.objective": "vibes"}, "benchmark.objective", "p50"),
        ({"compress.distill.temperature": 0.5}, "compress.distill.temperature", "1"),
        ({"train.batch_size": 0}, "train.batch_size", "1"),
        ({"train.mixed_precision": "fp8"}, "train.mixed_precision", "mixed_bfloat16"),
        ({"input.sweep_tolerance": 2}, "input.sweep_tolerance", "1"),
        ({"train.warp_speed": True}, "train.warp_speed", "Extra inputs"),
        ({"name": "has spaces"}, "name", "pattern"),
        ({"train.epochs": True}, "train.epochs", "a number is expected, not true"),
        ({"train.learning_rate": False}, "train.learning_rate", "not false"),
        ({"data.max_examples_per_class": 1e26}, "data.max_examples_per_class",
         "exceeded maximum size"),
        ({"data.max_examples_per_class": 10**12}, "data.max_examples_per_class",
         "less than or equal to 100000000"),
        ({"train.seed": 2**70}, "train.seed", "less than or equal"),
        ({"input.sweep_batch_sizes": [32, 10**9]}, "input.sweep_batch_sizes.1", "65536"),
    ],
)
def test_bad_input_parameters_are_refused_naming_field_and_allowed_values(override, field,
                                                                         allowed):
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(SMOKE, override)
    message = str(caught.value)
    assert f" {field}:" in message and allowed in message, message


def test_bad_input_missing_data_folder_is_refused_before_any_work(tmp_path, capsys):
    code = main(["run", "--config", str(SMOKE), "--set", f"data.source_dir={tmp_path / 'nope'}",
                 "--set", f"work_dir={tmp_path / 'work'}"])
    assert code == 2
    assert "data.source_dir" in capsys.readouterr().out
    assert not (tmp_path / "work" / "datasets").exists()


def test_bad_input_unwritable_work_folder_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    config = load_pipeline_config(SMOKE, {"data.source_dir": str(tmp_path),
                                 "work_dir": str(tmp_path / "a-file" / "work")})
    with pytest.raises(ConfigError, match="work_dir"):
        check_paths(config)


@pytest.mark.parametrize(
    ("override", "message"),
    [("train.epochs.foo=1", "train.epochs"), ("train..epochs=1", "empty key part"),
     ("name.deeper=1", "name is a value ('smoke'), not a section")],
)
def test_bad_input_set_mistakes_are_one_line_errors(override, message, tmp_path, capsys):
    code = main(["run", "--config", str(SMOKE), "--set", override,
                 "--set", f"work_dir={tmp_path / 'work'}"])
    out = capsys.readouterr()
    assert code == 2 and message in out.out, out
    assert "Traceback" not in out.out + out.err


def test_bad_input_unreadable_config_file(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().out


@pytest.fixture
def messy_folder(tmp_path: Path) -> Path:
    source = write_digit_folder(tmp_path / "messy data", classes=3, per_class=8)
    (source / "0" / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    good = next((source / "1").glob("*.jpg")).read_bytes()
    (source / "1" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (source / "2" / "readme.txt").write_text("not an image")
    (source / "2" / "broken-link.jpg").symlink_to(tmp_path / "does-not-exist.jpg")
    Image.new("RGBA", (20, 20), (0, 0, 255, 100)).save(source / "0" / "rgba.png")
    Image.new("L", (30, 30), 90).save(source / "1" / "gray.jpg")
    Image.new("P", (12, 12)).save(source / "2" / "palette.gif")
    (source / "ünïcode class").mkdir()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(source / "ünïcode class" / "x y.jpg")
    (source / "empty class").mkdir()
    (source / "0" / os.fsdecode(b"caf\xe9.jpg")).write_bytes(good)  # a Latin-1 name
    return source


def test_bad_input_messy_folder_is_sharded_with_bad_files_counted(messy_folder, tmp_path):
    dataset = write_tfrecords.fn(DataConfig(source_dir=messy_folder, shard_size_mb=1),
                                 tmp_path / "work")
    manifest = json.loads(dataset.manifest_path.read_text())
    reasons = {item["path"]: item["reason"] for item in manifest["quarantine"]}
    assert set(reasons) == {"0/corrupt.jpg", "1/truncated.jpg", "2/readme.txt",
                            "2/broken-link.jpg", "empty class/", "0/caf\\xe9.jpg"}
    assert "cannot read" in reasons["2/broken-link.jpg"]
    assert "not valid UTF-8" in reasons["0/caf\\xe9.jpg"]
    assert dataset.skipped_records == 6
    assert dataset.class_names == ["0", "1", "2", "ünïcode class"]
    assert dataset.splits["train"].class_counts["ünïcode class"] == 1, "its one image trains"
    assert not [r for r in reasons.values() if "0x" in r], "no memory address in a reason"
    again = write_tfrecords.fn(DataConfig(source_dir=messy_folder, shard_size_mb=1),
                               tmp_path / "again")
    assert json.loads(again.manifest_path.read_text())["quarantine"] == manifest["quarantine"]
    assert manifest["reencoded_to_jpeg"] == 2  # the RGBA PNG and the palette GIF
    assert sum(info.examples for info in dataset.splits.values()) == 3 * 8 + 4


def test_bad_input_only_bad_files_is_a_clear_error(tmp_path):
    for name in ("cats", "dogs"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "a.jpg").write_bytes(b"nope")
        (tmp_path / "src" / name / "b.txt").write_text("nope")
    with pytest.raises(NoUsableDataError, match="no usable example"):
        write_tfrecords.fn(DataConfig(source_dir=tmp_path / "src"), tmp_path / "work")


def test_bad_input_a_single_class_is_refused(tmp_path):
    source = write_digit_folder(tmp_path / "one", classes=1, per_class=5)
    with pytest.raises(NoUsableDataError, match=r"1 class with images .* at least two classes"):
        write_tfrecords.fn(DataConfig(source_dir=source), tmp_path / "work")


def test_a_password_in_the_tracking_uri_is_never_printed(tmp_path):
    import subprocess
    import sys

    from tests.live import free_port

    env = {**os.environ,
           "MLFLOW_TRACKING_URI": f"http://alice:s3cret-pw@127.0.0.1:{free_port()}",
           "PREFECT_API_URL": f"http://bob:0ther-pw@127.0.0.1:{free_port()}/api"}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "run", "--config", str(SMOKE),
         "--set", f"work_dir={tmp_path / 'work'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "not answering" in output, output[-2000:]
    assert "***@127.0.0.1" in output
    assert "s3cret-pw" not in output and "0ther-pw" not in output


def test_a_full_disk_is_recognised_and_its_partial_files_removed(tmp_path):
    import errno
    import time

    from tfopt.fileio import is_disk_full, remove_partial_files

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("export failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert is_disk_full(ValueError("ResourceExhaustedError: ... No space left on device"))
    assert not is_disk_full(ValueError("something else"))
    old = tmp_path / "models" / ".old.tmp"
    old.mkdir(parents=True)
    os.utime(old, (1, 1))
    started = time.time() - 1
    staging = tmp_path / "models" / ".baseline-savedmodel.tmp"
    (staging / "variables").mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    partial = tmp_path / "runs" / ".summary.json.x1.tmp"
    partial.write_text("{")
    done = tmp_path / "runs" / "summary.json"
    done.write_text("{}")
    assert set(remove_partial_files(tmp_path, started)) == {staging, partial}
    assert done.exists() and old.exists(), "finished files and another run's stay"


def test_an_unexpected_failure_in_a_step_is_one_line_naming_the_step(tmp_path, capsys):
    from tfopt.supervision import RunFailedError, failure_in_one_line

    log = tmp_path / "run.log"
    with pytest.raises(RunFailedError) as failed:
        failure_in_one_line(lambda: write_tfrecords.fn(None, tmp_path), log)
    message = str(failed.value)
    assert message.startswith("the run failed in write_tfrecords: AttributeError: "), message
    assert message.endswith(f"(traceback: {log})") and "\n" not in message
    assert "Traceback (most recent call last)" in capsys.readouterr().err, "kept for the log"


def test_a_model_file_that_is_not_there_is_said_before_the_servers_are_asked_for(tmp_path):
    """`tfopt benchmark` on a mistyped path, servers down: the path's error, not theirs."""
    import subprocess
    import sys

    from tests.live import free_port

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
           "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "benchmark", "--model", str(tmp_path / "typo.tflite"),
         "--inputs", "random", "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-2000:]
    assert "typo.tflite does not exist" in done.stdout and "not answering" not in output, (
        output[-2000:])
