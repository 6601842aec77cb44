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


def environment_seen(name: str) -> tuple[str | None, str, int]:
    import tempfile

    return os.environ.get(name), tempfile.gettempdir(), os.getpid()


def test_a_reused_worker_runs_each_step_in_the_callers_environment_of_the_moment(
    tmp_path, monkeypatch
):
    """The fork server may have started before the run set its temporary folder and log (the
    command line's checks open the model first): each step still runs in the run's."""
    run_native(STEP, environment_seen, "TFOPT_TEST_STEP")  # the worker exists before the change
    monkeypatch.setenv("TFOPT_TEST_STEP", "the run's")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    first = run_native(STEP, environment_seen, "TFOPT_TEST_STEP")
    assert first[:2] == ("the run's", str(tmp_path))
    monkeypatch.delenv("TFOPT_TEST_STEP")
    second = run_native(STEP, environment_seen, "TFOPT_TEST_STEP")
    assert second[0] is None and second[2] == first[2], "the same worker, the variable gone"


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


def test_names_mlflow_refuses_are_made_ones_it_takes():
    from tfopt.tracking.client import mlflow_name

    assert mlflow_name("native.train_model") == "native.train_model", "a valid name is kept"
    assert mlflow_name("native.search_trial (channel_prune 0.75)") == \
        "native.search_trial channel_prune 0.75"
    assert mlflow_name("kept_filters.block_1/conv:0") == "kept_filters.block_1/conv:0"
    assert mlflow_name("a/../b") == "a___b" and mlflow_name("/root") == "_root"
    assert mlflow_name("()") == "_" and mlflow_name("..") == "_"


def test_a_crash_contained_in_a_search_trial_is_logged_on_the_run(live_services):
    """user25 (a Keras 3 ResNet nobody tuned): two trials' crashes failed the run at its end."""
    import uuid

    from mlflow.tracking import MlflowClient

    from tfopt.tracking import TrackedRun
    from tfopt.tracking.results import log_native_crashes

    client = MlflowClient(live_services.mlflow_url)
    experiment = client.create_experiment(f"native-crash-names-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment).info.run_id
    crashes = [{"step": f"search_trial (channel_prune {value})", "signal": "SIGABRT",
                "what": "the channel_prune trial's fine-tuning and conversion", "retried": True,
                "recovered": True, "retry": "TF_ENABLE_ONEDNN_OPTS=0"}
               for value in (0.75, 0.875)]
    log_native_crashes(TrackedRun(client, live_services.mlflow_url, experiment, run_id), crashes)
    params = client.get_run(run_id).data.params
    assert params["native.search_trial channel_prune 0.875"] == (
        "SIGABRT in the channel_prune trial's fine-tuning and conversion; retried with "
        "TF_ENABLE_ONEDNN_OPTS=0: ok")
    assert "native.search_trial channel_prune 0.75" in params


def test_a_trial_that_fails_with_an_ordinary_error_gets_its_failed_nested_run(
    live_services, tiny_baseline, tiny_data, tmp_path
):
    """Not only a crash: any error of a trial's is its nested run's, FAILED with the error."""
    import uuid

    from mlflow.tracking import MlflowClient

    from tasks.run_trial import run_trial
    from techniques.channel_prune import ChannelPruneConfig
    from tfopt.artifacts import BenchmarkInputs
    from tfopt.config import MeasurementProtocol
    from tfopt.runtimes import ConvertConfig
    from tfopt.tracking import RunRef

    client = MlflowClient(live_services.mlflow_url)
    experiment = client.create_experiment(f"failed-trial-{uuid.uuid4().hex[:8]}")
    parent = RunRef(tracking_uri=live_services.mlflow_url, experiment_id=experiment,
                    run_id=client.create_run(experiment).info.run_id)
    gone = tiny_baseline.model_copy(update={"path": tmp_path / "gone.keras"})
    with pytest.raises(Exception) as raised:
        run_trial.fn("channel_prune", {"fraction": 0.5}, "0.5", gone,
                     ChannelPruneConfig(fraction="auto", epochs=1), tiny_data, tmp_path / "trial",
                     ConvertConfig(), ("int8",),
                     BenchmarkInputs(images=None, labels=None, reference_logits=None, examples=1),
                     MeasurementProtocol(), parent)
    (trial,) = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert trial.info.status == "FAILED" and trial.data.tags["tfopt.status"] == "failed"
    assert trial.data.tags["tfopt.error"].startswith(type(raised.value).__name__)
    assert trial.data.params["fraction"] == "0.5"
