"""Native steps run in child processes: a crash is one line, retried once without oneDNN."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from tfopt.artifacts import ModelArtifact
from tfopt.native import (
    RECORD_ENV,
    RETRY_PARAM,
    NativeCrashError,
    NativeStep,
    read_record,
    run_native,
)

STEP = NativeStep("fake_step", "a fake step's native code", "try something else")


def answer(value: int, path: Path) -> ModelArtifact:
    logging.getLogger("tfopt").info("child %d says hello", os.getpid())
    return ModelArtifact(name="m", path=path, format="keras", image_size=8, num_classes=value)


def crash_while_onednn_is_on(path: Path) -> ModelArtifact:
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0":
        os.kill(os.getpid(), signal.SIGSEGV)
    return answer(2, path)


def always_crash() -> None:
    os.kill(os.getpid(), signal.SIGABRT)


def refuse(text: str) -> None:
    from techniques.base import NotApplicable

    raise NotApplicable(text)


def test_a_step_runs_in_a_child_and_its_result_and_log_lines_come_back(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tfopt"):
        made = run_native(STEP, answer, 3, tmp_path / "m.keras")
    assert made.num_classes == 3 and made.path == tmp_path / "m.keras"
    said = [r.getMessage() for r in caplog.records if "says hello" in r.getMessage()]
    assert said and f"child {os.getpid()} " not in said[0], "logged by another process, relayed"


def test_an_exception_in_the_child_is_raised_again_with_its_type():
    from techniques.base import NotApplicable

    with pytest.raises(NotApplicable, match="not this model"):
        run_native(STEP, refuse, "not this model")


def test_a_crash_is_retried_once_without_onednn_and_the_retry_is_recorded(
        tmp_path, monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "crashes.jsonl"))
    made = run_native(STEP, crash_while_onednn_is_on, tmp_path / "m.keras")
    assert made.params[RETRY_PARAM] == "TF_ENABLE_ONEDNN_OPTS=0 after SIGSEGV"
    assert read_record(tmp_path / "crashes.jsonl") == [{
        "step": "fake_step", "signal": "SIGSEGV", "what": "a fake step's native code",
        "retried": True, "recovered": True, "retry": "TF_ENABLE_ONEDNN_OPTS=0"}]


def test_a_step_that_crashes_again_is_one_line_naming_the_step_and_signal(
        tmp_path, monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "crashes.jsonl"))
    with pytest.raises(NativeCrashError) as crashed:
        run_native(STEP, always_crash)
    message = str(crashed.value)
    assert "\n" not in message
    assert message.startswith("fake_step crashed: its process died of SIGABRT in a fake "
                              "step's native code, and again with oneDNN off (SIGABRT)")
    assert message.endswith("try something else")
    assert read_record(tmp_path / "crashes.jsonl")[0]["recovered"] is False
