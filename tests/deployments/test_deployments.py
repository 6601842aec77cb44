"""deployments/prefect.yaml served by `tfopt serve` and registered by `tfopt deploy`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from deployments.serve import (
    PREFECT_YAML,
    build_runner_deployments,
    complete_parameters,
    load_deployment_specs,
)
from tests.conftest import write_digit_folder
from tests.live import ROOT, run_tfopt, running_services, service_env, tfopt_process

EXPECTED = {"optimize-nightly": "optimize_model", "preprocess-hourly": "preprocess_data",
            "benchmark-champion-weekly": "benchmark_model"}


def test_the_yaml_names_three_flows_with_schedules_and_valid_parameters():
    specs = {spec.name: spec for spec in load_deployment_specs(PREFECT_YAML)}
    assert set(specs) == set(EXPECTED)
    deployments = build_runner_deployments(list(specs.values()))
    for deployment in deployments:
        spec = specs[deployment.name]
        assert deployment.flow_name == EXPECTED[spec.name]
        assert spec.schedules and spec.description and "tfopt" in spec.tags
        config = deployment.parameters["config"]
        assert config["name"] == spec.parameters["config"]["name"]
        assert len(config) > len(spec.parameters["config"]), "defaults are filled in"


def test_a_bad_value_in_the_yaml_is_refused_before_registering():
    from pydantic import ValidationError

    from flows.optimize_model import optimize_model

    with pytest.raises(ValidationError, match="epochs"):
        complete_parameters(optimize_model, {"config": {"train": {"epochs": 0}}})


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2.0)
    raise TimeoutError(what)


@pytest.mark.e2e
def test_serve_registers_scheduled_deployments_with_a_parameter_form(
    served_deployments, prefect_client
):
    deployments = {d.name: d for d in prefect_client.read_deployments()}
    assert set(EXPECTED) <= set(deployments)
    nightly = deployments["optimize-nightly"]
    assert nightly.schedules and nightly.schedules[0].schedule.cron == "0 2 * * *"
    assert not nightly.schedules[0].active, "registered paused, resumed by the user"
    assert "pipeline" in nightly.tags and nightly.description.startswith("The full pipeline")
    schema = nightly.parameter_openapi_schema
    definitions = schema["definitions"]
    architecture = definitions["ModelConfig"]["properties"]["architecture"]
    assert architecture["enum"][:2] == ["small_cnn", "mobilenet_v2"], "a dropdown in the form"
    assert "resnet50" in architecture["enum"]
    epochs = definitions["TrainConfig"]["properties"]["epochs"]
    # 0 is valid (a model.source=file model optimized as it is); the form refuses negatives.
    assert epochs["minimum"] == 0 and epochs["description"]
    assert nightly.parameters["config"]["train"]["epochs"] == epochs["default"]


@contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[dict]]]:
    """A webhook receiver on loopback: its URL, and the JSON bodies POSTed to it so far."""
    received: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/tfopt", received
    finally:
        server.shutdown()


@pytest.mark.e2e
def test_deploy_registers_to_a_work_pool_and_a_worker_runs_preprocessing_cached(tmp_path):
    """`tfopt deploy` + `tfopt worker`; the second run of unchanged data is a cache hit."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.serve import DeploymentConflictError, refuse_work_pool_twins

    parameters = _preprocessing(tmp_path)
    with running_services(tmp_path / "home") as settings, \
            temporary_settings({PREFECT_API_URL: settings.prefect_api_url}):
        deployed = run_tfopt(settings, ["deploy"], timeout_s=300)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert deployed.stdout.count("-> work pool tfopt-process") == 3
        assert "alerts: none registered (no notification block named tfopt-alerts" \
            in deployed.stdout, deployed.stdout
        with get_client(sync_client=True) as client:
            registered = {d.name: d for d in client.read_deployments()}
            assert {d.work_pool_name for d in registered.values()} == {"tfopt-process"}
            pull = registered["preprocess-hourly"].pull_steps[0]
            assert Path(pull["prefect.deployments.steps.set_working_directory"]["directory"]) \
                == ROOT
        # What `tfopt serve` would do now (it says so and ends with rc 2).
        with pytest.raises(DeploymentConflictError, match="already registered to a work pool"):
            refuse_work_pool_twins(build_runner_deployments(load_deployment_specs(PREFECT_YAML)))
        log = tmp_path / "worker.log"
        with tfopt_process(settings, ["worker"], log,
                           ready=lambda: "started" in log.read_text().lower()):
            states = []
            for _ in range(2):
                run = run_deployment("preprocess_data/preprocess-hourly",
                                     parameters=parameters, timeout=300)
                assert run.state.is_completed(), (run.state, log.read_text()[-3000:])
                states.append(_task_state(run.id, "write_tfrecords"))
        assert states[0] != "Cached" and states[1] == "Cached", states
        mlflow = MlflowClient(settings.mlflow_url)
        runs = mlflow.search_runs(
            [mlflow.get_experiment_by_name("tfopt-preprocess").experiment_id])
        assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
        # The same facts under the same names as in the pipeline's runs (tracking.log_dataset).
        assert runs[0].data.metrics["dataset_shards"] >= 3
        assert {"dataset_train_examples", "dataset_val_examples", "dataset_test_examples",
                "dataset_skipped_records"} <= set(runs[0].data.metrics)


@pytest.mark.e2e
def test_the_alerts_deploy_registers_reach_a_webhook_on_a_failed_run_and_a_regression(tmp_path):
    """`tfopt deploy --alert-webhook`'s automations, seen by a webhook receiver on loopback:
    `tfopt alerts test`, a deployment run that fails on the worker, a confirmed regression."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    config = _preprocessing(tmp_path)["config"]
    with running_services(tmp_path / "home") as settings, \
            temporary_settings({PREFECT_API_URL: settings.prefect_api_url}), \
            webhook_receiver() as (webhook, received):
        deployed = run_tfopt(settings, ["deploy", "--alert-webhook", webhook], timeout_s=300)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert deployed.stdout.count("-> Custom Webhook tfopt-alerts") == 2, deployed.stdout
        tested = run_tfopt(settings, ["alerts", "test"], timeout_s=120)
        assert tested.returncode == 0 and received[-1]["subject"] == "tfopt: test alert", (
            tested.stdout + tested.stderr, received)
        log = tmp_path / "worker.log"
        with tfopt_process(settings, ["worker"], log,
                           ready=lambda: "started" in log.read_text().lower()):
            failing = run_deployment("preprocess_data/preprocess-hourly", timeout=300,
                                     parameters={"config": {**config, "data": {
                                         "source_dir": str(tmp_path / "gone")}}})
            assert failing.state.is_failed(), failing.state
        _emit_regression(settings)
        alerts = _wait_for(lambda: len(received) >= 3 and received, 90,
                           f"two alerts by automation; received {received}")
        subjects = sorted(alert["subject"] for alert in alerts[1:])
        assert subjects == ["tfopt: preprocess-hourly Failed", "tfopt: worker-test regressed"]
        failed = next(a["body"] for a in alerts if a["subject"].endswith("Failed"))
        assert "does not exist" in failed and f"/runs/flow-run/{failing.id}" in failed, failed
        regressed = next(a["body"] for a in alerts if a["subject"].endswith("regressed"))
        assert "- baseline-tflite-int8: p50 1.0 -> 1.3 (slower)" in regressed, regressed


def _preprocessing(tmp_path: Path) -> dict:
    """The parameters of a preprocessing run of a small digit folder written under `tmp_path`."""
    data = write_digit_folder(tmp_path / "digits", classes=3, per_class=12)
    return {"config": {"name": "worker-test", "work_dir": str(tmp_path / "work"),
                       "data": {"source_dir": str(data), "image_size": 16,
                                "shard_size_mb": 0.004}}}


def _emit_regression(settings) -> None:
    """The event a pipeline run emits on a confirmed regression, from a process of its own
    (Prefect keeps one events worker per process, bound to the first server it sent to)."""
    code = ("from tfopt.prefect_artifacts import emit_regression_event\n"
            "emit_regression_event('worker-test', 'http://mlflow/run', {'regressions': [\n"
            "    {'variant': 'baseline-tflite-int8', 'what': 'p50', 'before': 1.0,\n"
            "     'after': 1.3, 'direction': 'slower'}]})\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**service_env(settings),
                                                       "PREFECT_API_URL": settings.prefect_api_url})
    assert done.returncode == 0, done.stdout + done.stderr


def _task_state(flow_run_id, task_name: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return next(t.state.name for t in task_runs if t.name.startswith(task_name))
