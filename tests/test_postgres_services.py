"""Prefect and MLflow on a real local PostgreSQL server (`tfopt up --db postgres`).

`live_services` (tests/conftest.py) is that trio: every end-to-end test runs on it, the smoke
pipeline's read-back included. These tests check what is particular to it: the stores really are
in PostgreSQL, the password stays private, `tfopt down` leaves no process behind (two pipelines at
once losing nothing: `tests/flows/test_failing_variant_e2e.py`, whose first run has a twin).
"""

from __future__ import annotations

import os
import stat
import subprocess

import psutil
import psycopg
import pytest

from tests.live import (
    ROOT,
    free_port,
    postgres_query,
    service_env,
    state_folder_for_postgres,
    tfopt_command,
)
from tfopt.services import ServiceSettings, postgres

pytestmark = pytest.mark.e2e

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
    assert postgres_query(settings, "prefect", "SELECT count(*) FROM alembic_version")[0][0] == 1
    assert postgres_query(settings, "mlflow", "SELECT count(*) FROM experiments")[0][0] >= 1

    server = _postgres_process(settings)
    listening = [c for c in server.net_connections(kind="inet") if c.status == "LISTEN"]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}
    named_sockets = [c.laddr for c in server.net_connections(kind="unix") if c.laddr]
    assert named_sockets == [], "no Unix socket: TCP with a password only"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host=postgres.LOOPBACK, port=settings.postgres_port,
                        user=postgres.SUPERUSER, password="not-the-password", dbname="mlflow")

    for log in (settings.state_dir / "logs").glob("*.log"):
        assert secret not in log.read_text(errors="replace"), log
    for process in psutil.process_iter(["cmdline"]):
        assert secret not in " ".join(process.info["cmdline"] or []), process


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
            assert "worker: up" in status.stdout, status.stdout
            servers = [psutil.Process(int(p.read_text())) for p in (state / "run").glob("*.pid")]
            assert len(servers) == 4, "PostgreSQL, Prefect, MLflow and the worker"
            pids = {p.pid for server in servers for p in [server, *server.children(True)]}
        finally:
            down = tfopt("down")
        assert down.returncode == 0 and "postgres: stopped" in down.stdout, down.stdout
        assert "worker: stopped" in down.stdout, down.stdout
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
