"""Local Prefect and MLflow servers: real processes, SQLite stores, bound to 127.0.0.1.

`tfopt up` starts both in the background (their own process groups, so they outlive the
command), writes their pids and logs under the state folder, and waits until each answers its
health check. Running it again while they are healthy does nothing; `tfopt down` stops them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000


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

    @classmethod
    def from_env(cls) -> ServiceSettings:
        """Read `TFOPT_HOME`, `TFOPT_HOST`, `TFOPT_PREFECT_PORT` and `TFOPT_MLFLOW_PORT`."""
        return cls(
            state_dir=Path(os.environ.get("TFOPT_HOME", ".tfopt")).resolve(),
            host=os.environ.get("TFOPT_HOST", DEFAULT_HOST),
            prefect_port=int(os.environ.get("TFOPT_PREFECT_PORT", DEFAULT_PREFECT_PORT)),
            mlflow_port=int(os.environ.get("TFOPT_MLFLOW_PORT", DEFAULT_MLFLOW_PORT)),
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
    health_url: str
    command: list[str]
    env: dict[str, str]


def _bin(name: str) -> str:
    """The console script installed beside this interpreter (the project's virtual environment)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _services(settings: ServiceSettings) -> list[_Service]:
    state = settings.state_dir
    prefect_home = state / "prefect"
    mlflow_home = state / "mlflow"
    prefect = _Service(
        name="prefect",
        port=settings.prefect_port,
        health_url=f"{settings.prefect_api_url}/health",
        command=[
            _bin("prefect"), "server", "start",
            "--host", settings.host, "--port", str(settings.prefect_port),
        ],
        env={
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": (
                f"sqlite+aiosqlite:///{prefect_home / 'prefect.db'}"
            ),
            "PREFECT_UI_API_URL": settings.prefect_api_url,
            # Only the server's own UI may call the API from a browser (Prefect allows any
            # origin by default, so any web page could create or delete objects).
            "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": settings.prefect_url,
        },
    )
    mlflow = _Service(
        name="mlflow",
        port=settings.mlflow_port,
        health_url=f"{settings.mlflow_url}/health",
        command=[
            _bin("mlflow"), "server",
            "--backend-store-uri", f"sqlite:///{mlflow_home / 'mlflow.db'}",
            "--artifacts-destination", str(mlflow_home / "artifacts"),
            "--host", settings.host, "--port", str(settings.mlflow_port),
            "--workers", "1",
        ],
        env={},
    )
    return [prefect, mlflow]


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


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_identity() -> dict[str, str]:
    """This process as tfopt records it on what it leaves behind (MLflow and Prefect tags).

    Returns:
        ``{"tfopt.host": <host name>, "tfopt.pid": <process id>}``.
    """
    return {"tfopt.host": socket.gethostname(), "tfopt.pid": str(os.getpid())}


def left_by_dead_process(identity: Mapping[str, object]) -> bool:
    """Whether a `process_identity` names a process of this machine that is gone."""
    pid = str(identity.get("tfopt.pid", ""))
    return (identity.get("tfopt.host") == socket.gethostname() and pid.isdigit()
            and not process_alive(int(pid)))


def health_url(server_url: str) -> str:
    """The health endpoint of a Prefect API (``.../api``) or MLflow server address."""
    return f"{server_url.rstrip('/')}/health"


def _warn_if_exposed(host: str) -> str | None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (
        f"warning: serving on {host}, reachable from other machines; the local servers have "
        "no authentication. Use 127.0.0.1 unless you mean it."
    )


def start_services(settings: ServiceSettings, timeout_s: float = 180.0) -> list[str]:
    """Start the Prefect and MLflow servers unless they already answer; wait until both do.

    Args:
        settings: State folder, host and ports.
        timeout_s: How long to wait for each health check.

    Returns:
        One human-readable line per service saying what happened.

    Raises:
        ServiceError: A port is taken by something else, or a server did not become healthy.
    """
    messages = []
    warning = _warn_if_exposed(settings.host)
    if warning:
        messages.append(warning)
    started: list[tuple[_Service, subprocess.Popen]] = []
    for service in _services(settings):
        if is_healthy(service.health_url):
            messages.append(f"{service.name}: already running at {service.health_url}")
            continue
        if not _port_is_free(settings.host, service.port):
            raise ServiceError(
                f"{service.name}: port {service.port} on {settings.host} is taken by another "
                f"process that is not a healthy {service.name} server. Stop it, or choose another "
                f"port with TFOPT_{service.name.upper()}_PORT=<port>."
            )
        started.append((service, _spawn(settings, service)))
    for service, process in started:
        _wait_healthy(settings, service, process, timeout_s)
        messages.append(f"{service.name}: started (pid {process.pid}) at {service.health_url}")
    return messages


def _spawn(settings: ServiceSettings, service: _Service) -> subprocess.Popen:
    log_path = _log_file(settings, service.name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    (settings.state_dir / "prefect").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **service.env}
    env.pop("PREFECT_API_URL", None)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            service.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=settings.state_dir,
            start_new_session=True,
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
        if is_healthy(service.health_url):
            return
        if process.poll() is not None:
            raise ServiceError(
                f"{service.name} exited with code {process.returncode} while starting; see "
                f"{_log_file(settings, service.name)}"
            )
        time.sleep(0.5)
    raise ServiceError(
        f"{service.name} did not answer {service.health_url} within {timeout_s:.0f} s; see "
        f"{_log_file(settings, service.name)}"
    )


def stop_services(settings: ServiceSettings, timeout_s: float = 30.0) -> list[str]:
    """Stop the servers that `start_services` started (by their pid files); idempotent.

    Args:
        settings: The same settings the servers were started with.
        timeout_s: Grace period after SIGTERM before SIGKILL.

    Returns:
        One line per service saying what happened.
    """
    messages = []
    for service in _services(settings):
        pid_path = _pid_file(settings, service.name)
        pid = _read_pid(pid_path)
        if pid is None:
            messages.append(f"{service.name}: not running")
            pid_path.unlink(missing_ok=True)
            continue
        _terminate_group(pid, timeout_s)
        pid_path.unlink(missing_ok=True)
        messages.append(f"{service.name}: stopped (pid {pid})")
    return messages


def _terminate_group(pid: int, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            _reap(pid)
            time.sleep(0.2)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def service_status(settings: ServiceSettings) -> dict[str, bool]:
    """Return whether each service answers its health check."""
    return {service.name: is_healthy(service.health_url) for service in _services(settings)}


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
