"""Real service processes for tests: Prefect and MLflow servers, `tfopt serve`, a worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.processes import free_port
from tfopt.services import ServiceSettings, start_services, stop_services

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def running_services(state_dir: Path, db: str = "sqlite",
                     host: str = "127.0.0.1") -> Iterator[ServiceSettings]:
    """Prefect and MLflow servers (and PostgreSQL for `db="postgres"`) on free ports."""
    settings = ServiceSettings(state_dir=state_dir, host=host, prefect_port=free_port(),
                               mlflow_port=free_port(), db=db, postgres_port=free_port())
    try:
        start_services(settings, timeout_s=240)
        yield settings
    finally:
        stop_services(settings, timeout_s=10)  # disposable servers: a short grace


@contextmanager
def state_folder_for_postgres() -> Iterator[Path]:
    """A temporary tfopt state folder that PostgreSQL's own user may enter (pytest's are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="tfopt-home-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def postgres_query(settings: ServiceSettings, database: str, sql: str,
                   *args: object) -> list[tuple]:
    """The rows of `sql` in `database` of `settings`' PostgreSQL server."""
    import contextlib

    import psycopg2

    from tfopt import postgres

    connection = psycopg2.connect(host=postgres.LOOPBACK, port=settings.postgres_port,
                                  user=postgres.SUPERUSER, dbname=database,
                                  password=postgres.password(settings.state_dir))
    with contextlib.closing(connection), connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchall()


def service_env(settings: ServiceSettings) -> dict[str, str]:
    """Environment for a `tfopt` subprocess that talks to `settings`' servers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(
        TFOPT_HOME=str(settings.state_dir),
        TFOPT_PREFECT_PORT=str(settings.prefect_port),
        TFOPT_MLFLOW_PORT=str(settings.mlflow_port),
        TFOPT_POSTGRES_PORT=str(settings.postgres_port),
        PREFECT_HOME=str(Path(settings.state_dir) / "client"),
        # Workers and `tfopt serve` poll for scheduled runs every 10 s by default: each test
        # flow run would wait 5 s on average before it starts.
        PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_RUNNER_POLL_FREQUENCY="2",
    )
    return env


def tfopt_command(args: list[str]) -> list[str]:
    """The command line of ``tfopt <args>`` run by this interpreter."""
    return [sys.executable, "-m", "cli", *args]


def run_tfopt(
    settings: ServiceSettings, args: list[str], timeout_s: float = 900.0
) -> subprocess.CompletedProcess:
    """Run ``tfopt <args>`` from the checkout against `settings`' servers; capture its output."""
    return subprocess.run(tfopt_command(args), cwd=ROOT, env=service_env(settings),
                          capture_output=True, text=True, timeout=timeout_s)


@contextmanager
def tfopt_process(
    settings: ServiceSettings, args: list[str], log: Path, ready: Callable[[], bool],
    timeout_s: float = 180.0, env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen]:
    """Run ``tfopt <args>`` in the background until the block ends; wait until `ready()`.

    `env` adds to the servers' environment (e.g. another ``TMPDIR``).
    """
    with log.open("w") as out:
        process = subprocess.Popen(
            tfopt_command(args), cwd=ROOT, env={**service_env(settings), **(env or {})},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if process.poll() is not None:
                raise RuntimeError(f"tfopt {args[0]} exited: {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tfopt {args[0]} not ready: {log.read_text()[-3000:]}")
            time.sleep(1.0)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=10)  # `tfopt serve` may linger on Prefect's shutdown
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _smoke_command(summary_path: Path, overrides: dict) -> list[str]:
    command = ["run", "--config", "configs/smoke.yaml", "--summary-json", str(summary_path)]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    return command


def run_smoke_with(settings, summary_path, overrides: dict) -> dict:
    """`tfopt run` on the smoke config with `--set` overrides; the summary it wrote."""
    completed = run_tfopt(settings, _smoke_command(summary_path, overrides))
    summary_path.with_suffix(".log").write_text(completed.stdout + completed.stderr)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(summary_path.read_text())


def start_smoke_with(settings, summary_path: Path, overrides: dict) -> subprocess.Popen:
    """`run_smoke_with` in the background, its output in the summary's ``.log``."""
    with summary_path.with_suffix(".log").open("w") as out:
        return subprocess.Popen(tfopt_command(_smoke_command(summary_path, overrides)),
                                cwd=ROOT, env=service_env(settings), stdout=out,
                                stderr=subprocess.STDOUT)


def finish_smoke(process: subprocess.Popen, summary_path: Path) -> dict:
    """Wait for a `start_smoke_with` run; the summary it wrote."""
    code = process.wait(timeout=900)
    assert code == 0, summary_path.with_suffix(".log").read_text()[-4000:]
    return json.loads(summary_path.read_text())


def scores_of(predicted: Any) -> np.ndarray:
    """A pyfunc model's class scores (the ONNX flavor answers a dict of named outputs)."""
    if isinstance(predicted, dict):
        predicted = predicted.get("logits", next(iter(predicted.values())))
    return np.asarray(predicted)


def benchmark_split_of(work: Path, summary: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A run's benchmark inputs (scaled test images, labels) in work folder `work`."""
    inputs = work / "runs" / f"{name}-{summary['mlflow_run_id'][:12]}" / "benchmark-inputs"
    return np.load(inputs / "test-images.npy"), np.load(inputs / "test-labels.npy")
