"""Prefect glue: which failures are retried, and what the preprocessing cache is keyed on."""

from __future__ import annotations

import os

from prefect.states import Completed, Failed

from tests.conftest import write_digit_folder
from tfopt.config import DataConfig
from tfopt.data.sharding import preprocessing_cache_key
from tfopt.data.sources import source_fingerprint
from tfopt.orchestration import StepProgress, TransientError, retry_if_transient


def test_only_transient_failures_are_retried():
    assert retry_if_transient(None, None, Failed(data=TransientError("killed by signal 9")))
    assert retry_if_transient(None, None, Failed(data=ConnectionResetError("reset")))
    assert not retry_if_transient(None, None, Failed(data=ValueError("onnx differs by 0.3")))
    assert not retry_if_transient(None, None, Completed(data=1))


def test_the_cache_key_follows_the_folder_content_and_settings(tmp_path):
    folder = write_digit_folder(tmp_path / "digits", classes=2, per_class=3)
    cfg = DataConfig(source_dir=folder, image_size=16)
    key = preprocessing_cache_key(None, {"cfg": cfg, "work_dir": tmp_path / "work"})
    assert key == preprocessing_cache_key(None, {"cfg": cfg, "work_dir": tmp_path / "work"})
    assert key != preprocessing_cache_key(
        None, {"cfg": cfg.model_copy(update={"image_size": 24}), "work_dir": tmp_path / "work"})
    assert key != preprocessing_cache_key(None, {"cfg": cfg, "work_dir": tmp_path / "other"})

    before = source_fingerprint(folder)
    image = next(folder.rglob("*.jpg"))
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert source_fingerprint(folder) != before, "an edited file changes the fingerprint"
    edited = source_fingerprint(folder)
    (folder / "1" / "new.jpg").write_bytes(image.read_bytes())
    assert source_fingerprint(folder) != edited, "an added file changes the fingerprint"


def test_a_missing_source_folder_is_not_cached(tmp_path):
    cfg = DataConfig(source_dir=tmp_path / "absent")
    assert preprocessing_cache_key(None, {"cfg": cfg, "work_dir": tmp_path}) is None


def test_progress_outside_a_prefect_run_is_silent(caplog, monkeypatch):
    import prefect.artifacts

    calls = []
    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact",
                        lambda *args, **kwargs: calls.append(args))
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact",
                        lambda *args, **kwargs: calls.append(args))
    with caplog.at_level("DEBUG"):
        progress = StepProgress("train-baseline", "epochs trained")
        progress.update(1, 3)
        progress.update(3, 3)
    assert calls == [], "no artifact is created or updated outside a run"
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
