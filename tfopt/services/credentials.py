"""The servers' password: who needs one, where it is kept, and what clients send.

Servers reachable from other machines require a password (`requires_auth`); `tfopt up`
generates it once (`private_secret`, the one generator of secrets kept in files: PostgreSQL's
superuser password uses it too) and clients on this machine read it (`client_credentials`).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
from pathlib import Path


def private_secret(path: Path) -> str:
    """The secret kept in `path`: generated and written (mode 0600, atomically) the first time."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(24)
    write_private(path, value, owner=None)
    return value


def write_private(path: Path, text: str, owner: str | None) -> None:
    """Write `text` to `path` atomically, readable only by `owner` (None: this user)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    if owner:
        shutil.chown(partial, user=owner)
    os.replace(partial, path)


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


AUTH_USER = "tfopt"
"""The user both servers know when authentication is on (MLflow's admin, Prefect's one user)."""


def auth_file(state_dir: Path) -> Path:
    """The file holding the servers' password (mode 0600), made by `tfopt up` when needed."""
    return state_dir / "auth" / "password"


def requires_auth(host: str) -> bool:
    """Whether servers serving on `host` require a password.

    Servers reachable from other machines always do; ``TFOPT_AUTH=1`` asks for one on loopback
    too.
    """
    return not is_loopback(host) or os.environ.get("TFOPT_AUTH") == "1"


def server_password(state_dir: Path) -> str:
    """The servers' password: generated (mode 0600, atomically) the first time."""
    return private_secret(auth_file(state_dir))


def client_credentials(state_dir: Path) -> dict[str, str]:
    """The environment a client needs to reach servers that require a password.

    Read from `auth_file` when the environment does not set them already: MLflow's
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` and Prefect's
    ``PREFECT_API_AUTH_STRING``. Empty when there is no password file.
    """
    path = auth_file(state_dir)
    if not path.exists():
        return {}
    secret = path.read_text().strip()
    wanted = {"MLFLOW_TRACKING_USERNAME": AUTH_USER, "MLFLOW_TRACKING_PASSWORD": secret,
              "PREFECT_API_AUTH_STRING": f"{AUTH_USER}:{secret}"}
    return {key: value for key, value in wanted.items() if not os.environ.get(key)}
