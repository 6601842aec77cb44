"""Real service processes for tests: Prefect and MLflow servers, `tfopt serve`, a worker."""

from __future__ import annotations

import dataclasses
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


def _folder_for_postgres() -> Path:
    """A temporary tfopt state folder that PostgreSQL's own user may enter (pytest's are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="tfopt-home-"))
    folder.chmod(0o711)
    return folder


@contextmanager
def state_folder_for_postgres() -> Iterator[Path]:
    """`_folder_for_postgres`, removed after the block."""
    folder = _folder_for_postgres()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_session_services(_: Path) -> dict[str, Any]:
    """The test session's servers: PostgreSQL, Prefect and MLflow on it, as a team's would be.

    Started once for every test worker (`tests.shared.made_once`) and stopped once at the
    session's end (`stop_session_services`); the returned record rebuilds their settings.
    """
    settings = ServiceSettings(state_dir=_folder_for_postgres(), prefect_port=free_port(),
                               mlflow_port=free_port(), db="postgres",
                               postgres_port=free_port())
    record = {**dataclasses.asdict(settings), "state_dir": str(settings.state_dir)}
    try:
        start_services(settings, timeout_s=240)
        _raise_benchmark_limit(settings, SESSION_BENCHMARK_SLOTS)
    except BaseException:
        stop_session_services(record)
        raise
    return record


SESSION_BENCHMARK_SLOTS = 2
"""The session's servers let two measurements overlap on this machine, as a user may raise the
limit (docs/operations.md): every test worker's pipeline runs share one Prefect server, and
with one slot their measurements queued behind each other for up to a minute each."""


def _raise_benchmark_limit(settings: ServiceSettings, slots: int) -> None:
    """Create this machine's benchmark limit (`tfopt.orchestration`) with `slots` slots."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tfopt.orchestration import benchmark_limit

    with temporary_settings({PREFECT_API_URL: settings.prefect_api_url}), \
            get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=benchmark_limit(), limit=slots))


def session_services(record: dict[str, Any]) -> ServiceSettings:
    """The settings of the servers `start_session_services` recorded."""
    return ServiceSettings(**{**record, "state_dir": Path(record["state_dir"])})


def stop_session_services(record: dict[str, Any]) -> None:
    """Stop the session's servers and remove their state."""
    settings = session_services(record)
    try:
        stop_services(settings, timeout_s=10)  # disposable servers: a short grace
    finally:
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def postgres_query(settings: ServiceSettings, database: str, sql: str,
                   *args: object) -> list[tuple]:
    """The rows of `sql` in `database` of `settings`' PostgreSQL server."""
    import contextlib

    import psycopg

    from tfopt.services import postgres

    connection = psycopg.connect(host=postgres.LOOPBACK, port=settings.postgres_port,
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


LIGHT: dict[str, Any] = {
    "convert.xla": [], "convert.bfloat16": False, "convert.onnx_quantize": [],
    "convert.selective_int8": False, "runtimes.openvino.precisions": [],
    "input.sweep_batch_sizes": [32], "input.measure_layouts": False, "input.measure_passes": 1,
    "input.sweep_steps": 2, "benchmark.profile": False,
}
"""The smoke config's overrides for a run whose test is about one scenario, not every step (the
shared `smoke_run` covers those): no XLA, bfloat16, ONNX int8, selective int8 or OpenVINO forms,
one batch size swept, no layout measurement, no operator profiles. A test adds its scenario's."""
TECHNIQUES_OFF: dict[str, Any] = {
    f"compress.{name}.enabled": False for name in ("channel_prune", "prune", "distill", "qat")}
"""Beside `LIGHT`, for a scenario about the baseline's variants alone."""


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


SMOKE_RUN_S = 900.0
"""The longest the shared smoke run may take (`make_smoke_run`)."""


def make_smoke_run(settings: ServiceSettings, folder: Path) -> dict[str, str]:
    """The smoke config run once for the session's read-only assertions, with both searches.

    Its own experiment, so that what other tests run on the smoke config (under the same
    servers) never shows among its runs.

    Returns:
        Its demo folder, summary file and terminal output.
    """
    from tfopt.demo_data import write_demo_images

    demo, summary_path = folder / "demo", folder / "out.json"
    write_demo_images(demo)
    completed = run_tfopt(
        settings,
        ["run", "--config", "configs/smoke.yaml", "--summary-json", str(summary_path),
         "--set", f"data.source_dir={demo}", "--set", f"work_dir={folder / 'work'}",
         "--set", "experiment=tfopt-smoke-shared",
         "--set", "compress.channel_prune.enabled=true",  # fraction: auto, a search
         "--set", "compress.channel_prune.epochs=2",
         # small_cnn has no residual block: one trial says so and ends depth pruning's search
         "--set", "compress.depth_prune.enabled=true", "--set", "compress.depth_prune.share=auto"],
        timeout_s=SMOKE_RUN_S,
    )
    (folder / "out.log").write_text(completed.stdout + completed.stderr)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-5000:]
    return {"demo": str(demo), "summary": str(summary_path), "stdout": completed.stdout}
