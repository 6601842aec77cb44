"""Local Prefect and MLflow servers: real processes, bound to 127.0.0.1.

`tfopt up` starts both in the background (their own process groups, so they outlive the
command), writes their pids and logs under the state folder, and waits until each answers its
health check. Their stores are SQLite files by default; with `--db postgres` both use a local
PostgreSQL server that `tfopt up` starts first (`tfopt.services.postgres`). It then starts a Prefect
worker on the local process work pool (`start_worker`), so deployments run from the Prefect UI
with no second terminal. Running it again while they are healthy does nothing; `tfopt down`
stops all of them, the worker first.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tfopt.processes import process_alive, terminate_group
from tfopt.services import postgres
from tfopt.services.credentials import (
    AUTH_USER,
    auth_file,
    client_credentials,
    is_loopback,
    requires_auth,
    server_password,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_POSTGRES_PORT = 5433  # 5432 is left to a system PostgreSQL
DATABASES = ("sqlite", "postgres")


_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """`text` with every URI's ``user:password@`` replaced by ``***@``."""
    return _CREDENTIALS.sub(r"\g<scheme>***@", text)


class ServiceError(RuntimeError):
    """A service could not be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True)
class ServiceSettings:
    """Where the local services keep their state and which addresses they serve on."""

    state_dir: Path
    host: str = DEFAULT_HOST
    prefect_port: int = DEFAULT_PREFECT_PORT
    mlflow_port: int = DEFAULT_MLFLOW_PORT
    db: str = "sqlite"
    postgres_port: int = DEFAULT_POSTGRES_PORT

    def __post_init__(self) -> None:
        if self.db not in DATABASES:
            raise ServiceError(f"unknown database {self.db!r}: choose one of {DATABASES}")

    @classmethod
    def from_env(cls, db: str | None = None) -> ServiceSettings:
        """Read `TFOPT_HOME`, `TFOPT_HOST`, `TFOPT_*_PORT` and `TFOPT_DB`.

        Args:
            db: The servers' database; None takes the one the running servers were started
                with, else `TFOPT_DB`, else SQLite.
        """
        state_dir = Path(os.environ.get("TFOPT_HOME", ".tfopt")).resolve()
        return cls(
            state_dir=state_dir,
            host=os.environ.get("TFOPT_HOST", DEFAULT_HOST),
            prefect_port=int(os.environ.get("TFOPT_PREFECT_PORT", DEFAULT_PREFECT_PORT)),
            mlflow_port=int(os.environ.get("TFOPT_MLFLOW_PORT", DEFAULT_MLFLOW_PORT)),
            db=db or running_database(state_dir) or os.environ.get("TFOPT_DB", "sqlite"),
            postgres_port=int(os.environ.get("TFOPT_POSTGRES_PORT", DEFAULT_POSTGRES_PORT)),
        )

    @property
    def prefect_url(self) -> str:
        """Base address of the Prefect server (the UI lives here)."""
        return f"http://{self.host}:{self.prefect_port}"

    @property
    def prefect_api_url(self) -> str:
        """The value for `PREFECT_API_URL`."""
        return f"{self.prefect_url}/api"

    @property
    def mlflow_url(self) -> str:
        """The MLflow tracking URI and UI address."""
        return f"http://{self.host}:{self.mlflow_port}"


@dataclass(frozen=True)
class _Service:
    name: str
    port: int
    address: str
    ready: Callable[[], bool]
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None


def _bin(name: str) -> str:
    """The console script installed beside this interpreter (the project's virtual environment)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _http_service(name: str, port: int, url: str, command: list[str],
                  env: dict[str, str]) -> _Service:
    return _Service(name=name, port=port, address=url, ready=lambda: is_healthy(url),
                    command=command, env=env)


def _postgres_service(settings: ServiceSettings) -> _Service:
    state, port = settings.state_dir, settings.postgres_port
    try:
        command, user = postgres.server_command(state, port), postgres.server_user()
    except postgres.PostgresError as error:
        raise ServiceError(str(error)) from None
    return _Service(
        name="postgres", port=port, address=f"{postgres.LOOPBACK}:{port}",
        ready=lambda: postgres.can_log_in(state, port), command=command, user=user,
    )


def _store_urls(settings: ServiceSettings) -> tuple[str, str]:
    """The Prefect and MLflow database addresses (PostgreSQL's carry the password)."""
    if settings.db == "postgres":
        state, port = settings.state_dir, settings.postgres_port
        return (postgres.database_url(state, port, "prefect", "asyncpg"),
                postgres.database_url(state, port, "mlflow", "psycopg"))
    return (f"sqlite+aiosqlite:///{settings.state_dir / 'prefect' / 'prefect.db'}",
            f"sqlite:///{settings.state_dir / 'mlflow' / 'mlflow.db'}")


def _services(settings: ServiceSettings) -> list[_Service]:
    """The servers to start, in order (stop them in reverse); addresses carry no password."""
    state = settings.state_dir
    prefect_store, mlflow_store = _store_urls(settings)
    prefect_auth, mlflow_auth, mlflow_auth_args = _auth_env(settings)
    prefect = _http_service(
        "prefect", settings.prefect_port, f"{settings.prefect_api_url}/health",
        command=[
            _bin("prefect"), "server", "start",
            "--host", settings.host, "--port", str(settings.prefect_port),
        ],
        env={
            "PREFECT_HOME": str(state / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": prefect_store,
            "PREFECT_UI_API_URL": settings.prefect_api_url,
            "PREFECT_UI_URL": settings.prefect_url,  # links in the alerts' text (ui_url)
            # Only the server's own UI may call the API from a browser (Prefect allows any
            # origin by default, so any web page could create or delete objects).
            "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": settings.prefect_url,
            **prefect_auth,
        },
    )
    mlflow = _http_service(
        "mlflow", settings.mlflow_port, f"{settings.mlflow_url}/health",
        command=[
            _bin("mlflow"), "server",
            "--artifacts-destination", str(state / "mlflow" / "artifacts"),
            "--host", settings.host, "--port", str(settings.mlflow_port),
            "--workers", "1", *mlflow_auth_args,
        ],
        # In the environment, not on the command line, where `ps` would show the password.
        # MLflow 3's job runner (seven huey consumers, ~240 MB each) serves GenAI jobs tfopt
        # never starts: off, the server takes ~0.3 GB instead of ~2.4 GB.
        env={"MLFLOW_BACKEND_STORE_URI": mlflow_store,
             "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **mlflow_auth},
    )
    if settings.db == "postgres":
        return [_postgres_service(settings), prefect, mlflow]
    return [prefect, mlflow]


SERVICE_NAMES = ("postgres", "prefect", "mlflow", "worker")
"""In start order; `stop_services` stops them in reverse (the worker before its server)."""
LOCAL_WORK_POOL = "tfopt-process"
"""The process work pool of `deployments/prefect.yaml`, whose worker `tfopt up` starts."""
PROJECT_DIR = Path(__file__).resolve().parents[2]


def _database_file(state_dir: Path) -> Path:
    return state_dir / "run" / "database"


def running_database(state_dir: Path) -> str | None:
    """The database the servers of `state_dir` were started with, while they run."""
    path = _database_file(state_dir)
    return path.read_text().strip() if path.exists() else None


def is_healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Return True when `url` answers HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _pid_file(settings: ServiceSettings, name: str) -> Path:
    return settings.state_dir / "run" / f"{name}.pid"


def _log_file(settings: ServiceSettings, name: str) -> Path:
    return settings.state_dir / "logs" / f"{name}.log"


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) else None


def health_url(server_url: str) -> str:
    """The health endpoint of a Prefect API (``.../api``) or MLflow server address."""
    return f"{server_url.rstrip('/')}/health"


def _auth_env(settings: ServiceSettings) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The Prefect and MLflow servers' environment and MLflow's extra arguments for a password.

    Prefect checks ``PREFECT_SERVER_API_AUTH_STRING`` on every API request but its health
    probe; MLflow runs its basic-auth app (users in a SQLite file beside its state) with
    `AUTH_USER` as admin and no permission for anyone else. Both answer 401 without it.
    """
    if not requires_auth(settings.host):
        return {}, {}, []
    secret = server_password(settings.state_dir)
    config = settings.state_dir / "mlflow" / "basic_auth.ini"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{settings.state_dir / 'mlflow' / 'auth.db'}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return (
        {"PREFECT_SERVER_API_AUTH_STRING": f"{AUTH_USER}:{secret}"},
        {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": AUTH_USER,
         "MLFLOW_AUTH_ADMIN_PASSWORD": secret,
         # The auth app's own session secret (Flask); its form login is not used by tfopt.
         "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)},
        ["--app-name", "basic-auth"],
    )


def _note_if_exposed(settings: ServiceSettings) -> str | None:
    if is_loopback(settings.host):
        return None
    return (
        f"note: serving on {settings.host}, reachable from other machines: both servers require "
        f"user {AUTH_USER!r} and the password in {auth_file(settings.state_dir)} (clients on "
        "this machine read it from there; elsewhere set MLFLOW_TRACKING_USERNAME, "
        "MLFLOW_TRACKING_PASSWORD and PREFECT_API_AUTH_STRING)"
    )


def start_services(settings: ServiceSettings, timeout_s: float = 180.0) -> list[str]:
    """Start the servers unless they already answer; wait until each does.

    With `settings.db == "postgres"` the PostgreSQL server comes first (its cluster and the
    Prefect and MLflow databases created on first use), then Prefect and MLflow on it.

    Args:
        settings: State folder, host, ports and database.
        timeout_s: How long to wait for each health check.

    Returns:
        One human-readable line per service saying what happened.

    Raises:
        ServiceError: A port is taken by something else, the running servers use another
            database, PostgreSQL cannot be set up, or a server did not become healthy.
    """
    messages = []
    note = _note_if_exposed(settings)
    if note:
        messages.append(note)
    _refuse_other_database(settings)
    services = _services(settings)
    databases = [service for service in services if service.name == "postgres"]
    servers = [service for service in services if service.name != "postgres"]
    for group in (databases, servers):
        started: list[tuple[_Service, subprocess.Popen]] = []
        for service in group:
            if service.ready():
                messages.append(f"{service.name}: already running at {service.address}")
                continue
            _check_port(settings, service)
            if service.name == "postgres":
                messages.extend(_postgres_setup(settings))
            started.append((service, _spawn(settings, service)))
        for service, process in started:
            _wait_healthy(settings, service, process, timeout_s)
            messages.append(f"{service.name}: started (pid {process.pid}) at {service.address}")
        if group is databases and databases:
            created = postgres.create_databases(settings.state_dir, settings.postgres_port)
            messages.extend(f"postgres: created database {name}" for name in created)
    _database_file(settings.state_dir).write_text(f"{settings.db}\n")
    return messages


def worker_env(settings: ServiceSettings) -> dict[str, str]:
    """What a worker's flow runs need to find the servers of `settings` (and their password)."""
    env = {
        "PREFECT_API_URL": settings.prefect_api_url,
        "TFOPT_HOME": str(settings.state_dir), "TFOPT_HOST": settings.host,
        "TFOPT_PREFECT_PORT": str(settings.prefect_port),
        "TFOPT_MLFLOW_PORT": str(settings.mlflow_port),
        "TFOPT_POSTGRES_PORT": str(settings.postgres_port), "TFOPT_DB": settings.db,
    }
    if requires_auth(settings.host):
        env.update(client_credentials(settings.state_dir))
    return env


def _worker_is_registered(settings: ServiceSettings, pool: str, name: str) -> bool:
    """Whether the Prefect server lists a worker called `name` on `pool`."""
    import json

    request = urllib.request.Request(
        f"{settings.prefect_api_url}/work_pools/{pool}/workers/filter", data=b"{}",
        headers={"Content-Type": "application/json"}, method="POST")
    if requires_auth(settings.host):
        import base64

        secret = client_credentials(settings.state_dir).get("PREFECT_API_AUTH_STRING") or (
            os.environ.get("PREFECT_API_AUTH_STRING", ""))
        request.add_header("Authorization",
                           "Basic " + base64.b64encode(secret.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return any(worker.get("name") == name for worker in json.load(response))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def worker_pid(settings: ServiceSettings) -> int | None:
    """The pid of the worker `start_worker` started, while it runs."""
    return _read_pid(_pid_file(settings, "worker"))


def start_worker(settings: ServiceSettings, pool: str = LOCAL_WORK_POOL,
                 timeout_s: float = 180.0) -> str:
    """Start a Prefect worker on the process work `pool` unless one of ours runs already.

    Its flow runs start in this checkout with the servers of `settings`, so a deployment
    registered by `tfopt deploy` runs from the Prefect UI's Run button. The pool is created
    if missing (a process pool).

    Returns:
        One line saying what happened.

    Raises:
        ServiceError: The worker exited or did not register with the server in time.
    """
    pid = worker_pid(settings)
    if pid is not None:
        return f"worker: already running (pid {pid}) on work pool {pool}"
    name = f"tfopt-local-{secrets.token_hex(3)}"
    worker = _Service(
        name="worker", port=0, address=f"work pool {pool}",
        ready=lambda: _worker_is_registered(settings, pool, name),
        command=[_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process",
                 "--name", name],
        env=worker_env(settings))
    process = _spawn(settings, worker, cwd=PROJECT_DIR)
    _wait_healthy(settings, worker, process, timeout_s)
    return f"worker: started (pid {process.pid}) on work pool {pool}"


def _refuse_other_database(settings: ServiceSettings) -> None:
    running = running_database(settings.state_dir)
    if running and running != settings.db and any(service_status(settings).values()):
        raise ServiceError(
            f"the servers of {settings.state_dir} run on {running}, not {settings.db}. "
            f"Stop them with `tfopt down` first, then `tfopt up --db {settings.db}`."
        )


def _check_port(settings: ServiceSettings, service: _Service) -> None:
    host = postgres.LOOPBACK if service.name == "postgres" else settings.host
    if not _port_is_free(host, service.port):
        raise ServiceError(
            f"{service.name}: port {service.port} on {host} is taken by another "
            f"process that is not a healthy {service.name} server. Stop it, or choose another "
            f"port with TFOPT_{service.name.upper()}_PORT=<port>."
        )


def _postgres_setup(settings: ServiceSettings) -> list[str]:
    try:
        created = postgres.ensure_cluster(settings.state_dir)
    except postgres.PostgresError as error:
        raise ServiceError(str(error)) from None
    return [created] if created else []


def _spawn(settings: ServiceSettings, service: _Service,
           cwd: Path | None = None) -> subprocess.Popen:
    log_path = _log_file(settings, service.name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "prefect").mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(service.env)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            service.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd or settings.state_dir,
            start_new_session=True,
            user=service.user,
        )
    pid_path = _pid_file(settings, service.name)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path.write_text(f"{process.pid}\n")
    return process


def _wait_healthy(
    settings: ServiceSettings, service: _Service, process: subprocess.Popen, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.ready():
            return
        if process.poll() is not None:
            raise ServiceError(
                f"{service.name} exited with code {process.returncode} while starting; "
                f"{_log_ending(settings, service.name)}"
            )
        time.sleep(0.5)
    raise ServiceError(
        f"{service.name} did not answer at {service.address} within {timeout_s:.0f} s; "
        f"{_log_ending(settings, service.name)}"
    )


_LOG_ENDING_CHARS = 1500


def _log_ending(settings: ServiceSettings, name: str) -> str:
    """Where a server's log is and how it ends (the folder may be gone when it is read)."""
    path = _log_file(settings, name)
    try:
        tail = path.read_text(errors="replace")[-_LOG_ENDING_CHARS:].strip()
    except OSError:
        tail = ""
    return f"its log ({path}) ends:\n{tail}" if tail else f"see {path}"


def stop_services(settings: ServiceSettings, timeout_s: float = 30.0) -> list[str]:
    """Stop the servers that `start_services` started (by their pid files); idempotent.

    The worker goes first, then Prefect and MLflow, then the PostgreSQL server they used, if
    any.

    Args:
        settings: The same state folder the servers were started with.
        timeout_s: Grace period after the stop signal before SIGKILL.

    Returns:
        One line per service saying what happened.
    """
    messages = []
    for name in reversed(SERVICE_NAMES):
        pid_path = _pid_file(settings, name)
        pid = _read_pid(pid_path)
        if pid is None:
            if name not in ("postgres", "worker") or pid_path.exists():
                messages.append(f"{name}: not running")
            pid_path.unlink(missing_ok=True)
            continue
        # SIGINT is PostgreSQL's fast shutdown; SIGTERM would wait for every client to leave.
        first = signal.SIGINT if name == "postgres" else signal.SIGTERM
        terminate_group(pid, timeout_s, first)
        pid_path.unlink(missing_ok=True)
        messages.append(f"{name}: stopped (pid {pid})")
    _database_file(settings.state_dir).unlink(missing_ok=True)
    return messages


def service_status(settings: ServiceSettings) -> dict[str, bool]:
    """Whether each server answers: Prefect and MLflow, and PostgreSQL when it is in use."""
    status = {
        "prefect": is_healthy(f"{settings.prefect_api_url}/health"),
        "mlflow": is_healthy(f"{settings.mlflow_url}/health"),
    }
    if settings.db == "postgres":
        status = {"postgres": postgres.can_log_in(settings.state_dir, settings.postgres_port),
                  **status}
    return status


def require_services(prefect_api_url: str, mlflow_url: str) -> None:
    """Raise a clear error naming the address and `tfopt up` when a server does not answer.

    Args:
        prefect_api_url: The Prefect API address (``.../api``).
        mlflow_url: The MLflow tracking server address.

    Raises:
        ServiceError: One of the servers is down.
    """
    checks = {"prefect": health_url(prefect_api_url), "mlflow": health_url(mlflow_url)}
    down = [f"{name} at {redact(url)}" for name, url in checks.items()
            if not is_healthy(url, 5.0)]
    if down:
        raise ServiceError(
            "not answering: " + ", ".join(down) + ". Start the local services with `tfopt up` "
            "(or point PREFECT_API_URL / MLFLOW_TRACKING_URI at running servers)."
        )
