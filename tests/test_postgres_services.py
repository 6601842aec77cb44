"""Prefect and MLflow on a real local PostgreSQL server (`tfopt up --db postgres`).

`live_services` (tests/conftest.py) is that trio: every end-to-end test runs on it, the smoke
pipeline's read-back included. These tests check what is particular to it: the stores really are
in PostgreSQL, the password stays private, two pipelines at once lose nothing, `tfopt down`
leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import urllib.request
from collections import Counter
from pathlib import Path

import psutil
import psycopg2
import pytest
from mlflow.tracking import MlflowClient

from tests.live import (
    ROOT,
    free_port,
    service_env,
    state_folder_for_postgres,
    tfopt_command,
)
from tfopt import postgres
from tfopt.demo_data import write_demo_images
from tfopt.services import ServiceSettings

pytestmark = pytest.mark.e2e

LIGHT_PIPELINE = {
    "convert.tflite": "[fp32]", "convert.xla": "[]", "convert.onnx": "false",
    "compress.prune.enabled": "false", "compress.distill.enabled": "false",
    "input.sweep_batch_sizes": "[32]", "input.measure_layouts": "false", "train.epochs": 3,
    "train.stop": "fixed",
    "compress.qat.epochs": 1, "input.measure_passes": 1, "convert.bfloat16": "false",
    "runtimes.openvino.precisions": "[]", "benchmark.profile": "false", "input.sweep_steps": 2,
    "convert.onnx_quantize": "[]", "convert.selective_int8": "false",
}


def _query(settings: ServiceSettings, database: str, sql: str, *args: object) -> list[tuple]:
    connection = psycopg2.connect(host=postgres.LOOPBACK, port=settings.postgres_port,
                                  user=postgres.SUPERUSER, dbname=database,
                                  password=postgres.password(settings.state_dir))
    with contextlib.closing(connection), connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchall()


def _postgres_process(settings: ServiceSettings) -> psutil.Process:
    return psutil.Process(int((settings.state_dir / "run" / "postgres.pid").read_text()))


def test_the_stores_are_in_postgresql_and_its_password_stays_private(live_services):
    settings = live_services
    secret_path = postgres.password_file(settings.state_dir)
    mode = secret_path.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o600 and mode.st_uid == os.geteuid()
    secret = secret_path.read_text().strip()
    assert len(secret) >= 24
    assert not (settings.state_dir / "prefect" / "prefect.db").exists()
    assert not (settings.state_dir / "mlflow" / "mlflow.db").exists()
    assert _query(settings, "prefect", "SELECT count(*) FROM alembic_version")[0][0] == 1
    assert _query(settings, "mlflow", "SELECT count(*) FROM experiments")[0][0] >= 1

    server = _postgres_process(settings)
    listening = [c for c in server.net_connections(kind="inet") if c.status == "LISTEN"]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}
    named_sockets = [c.laddr for c in server.net_connections(kind="unix") if c.laddr]
    assert named_sockets == [], "no Unix socket: TCP with a password only"
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(host=postgres.LOOPBACK, port=settings.postgres_port,
                         user=postgres.SUPERUSER, password="not-the-password", dbname="mlflow")

    for log in (settings.state_dir / "logs").glob("*.log"):
        assert secret not in log.read_text(errors="replace"), log
    for process in psutil.process_iter(["cmdline"]):
        assert secret not in " ".join(process.info["cmdline"] or []), process


def _start_light_pipeline(settings: ServiceSettings, tmp: Path, name: str,
                          demo: Path) -> tuple[subprocess.Popen, Path, Path]:
    summary = tmp / f"{name}.json"
    command = ["run", "--config", "configs/smoke.yaml", "--summary-json", str(summary),
               "--set", f"name={name}", "--set", f"data.source_dir={demo}",
               "--set", f"work_dir={tmp / name}"]
    for key, value in LIGHT_PIPELINE.items():
        command += ["--set", f"{key}={value}"]
    log = tmp / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(tfopt_command(command), cwd=ROOT, env=service_env(settings),
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, summary, log


def _post(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _task_runs(settings: ServiceSettings, flow_run_id: str) -> list[dict]:
    """The task runs of a flow run and of its subflow runs, read back from the Prefect API."""
    api = settings.prefect_api_url
    runs = [flow_run_id] + [run["id"] for run in _post(
        f"{api}/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}})]
    flow_runs = _post(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": runs}}})
    assert {run["state_type"] for run in flow_runs} == {"COMPLETED"}
    return _post(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": runs}}})


def _check_mlflow_holds(settings: ServiceSettings, summary: dict) -> set[str]:
    """Assert MLflow has the parent run and each variant's child with the summary's figures."""
    client = MlflowClient(settings.mlflow_url)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {child.info.run_name: child for child in children}
    assert sorted(by_name) == sorted(v["name"] for v in summary["variants"])
    for variant in summary["variants"]:
        child = by_name[variant["name"]]
        assert child.data.tags["tfopt.status"] == variant["status"]
        if variant["status"] == "ok":
            assert child.data.metrics["latency_p50_ms"] == pytest.approx(
                variant["latency_ms"]["p50"], rel=1e-6)
            assert child.data.metrics["accuracy"] == pytest.approx(variant["accuracy"])
    stored = _query(settings, "mlflow", "SELECT count(*) FROM runs WHERE run_uuid = ANY(%s)",
                    [parent.info.run_id, *(c.info.run_id for c in children)])[0][0]
    assert stored == 1 + len(children)
    return set(parent.data.params)


def test_two_pipelines_at_once_lose_no_run_metric_or_task_run(live_services, tmp_path):
    demo = tmp_path / "demo"
    write_demo_images(demo)
    started = [_start_light_pipeline(live_services, tmp_path, name, demo)
               for name in ("together-a", "together-b")]
    summaries = []
    for process, summary, log in started:
        assert process.wait(timeout=900) == 0, log.read_text()[-4000:]
        summaries.append(json.loads(summary.read_text()))
    assert summaries[0]["mlflow_run_id"] != summaries[1]["mlflow_run_id"]

    params = [_check_mlflow_holds(live_services, summary) for summary in summaries]
    assert params[0] == params[1], "both parents hold every parameter"
    task_runs = [_task_runs(live_services, s["prefect_flow_run_id"]) for s in summaries]
    for runs in task_runs:
        assert runs and {run["state_type"] for run in runs} == {"COMPLETED"}
    names = [Counter(run["name"].rsplit("-", 1)[0] for run in runs) for runs in task_runs]
    assert names[0] == names[1], "the same pipeline twice: the same task runs in each"


def test_up_and_down_on_postgres_leave_no_process_behind():
    with state_folder_for_postgres() as state:
        settings = ServiceSettings(state_dir=state, prefect_port=free_port(),
                                   mlflow_port=free_port(), postgres_port=free_port(),
                                   db="postgres")
        env = service_env(settings)

        def tfopt(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(tfopt_command(list(args)), cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=300)

        try:
            up = tfopt("up", "--db", "postgres")
            assert up.returncode == 0, up.stdout + up.stderr
            assert "postgres: created database mlflow" in up.stdout
            status = tfopt("status")
            assert status.returncode == 0 and "postgres: up" in status.stdout, status.stdout
            switch = tfopt("up", "--db", "sqlite")
            assert switch.returncode == 2 and "run on postgres" in switch.stdout, switch.stdout
            servers = [psutil.Process(int(p.read_text())) for p in (state / "run").glob("*.pid")]
            assert len(servers) == 3
            pids = {p.pid for server in servers for p in [server, *server.children(True)]}
        finally:
            down = tfopt("down")
        assert down.returncode == 0 and "postgres: stopped" in down.stdout, down.stdout
        left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
                if str(state) in " ".join(p.info["cmdline"] or [])
                or p.info["pid"] in pids]
        assert left == [], left
        assert not postgres.can_log_in(state, settings.postgres_port)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_a_state_folder_postgres_cannot_enter_is_a_clear_error(tmp_path):
    tmp_path.chmod(0o700)
    with pytest.raises(postgres.PostgresError, match=r"cannot enter .*chmod o\+x"):
        postgres.ensure_cluster(tmp_path / "home")
