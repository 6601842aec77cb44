"""A local PostgreSQL server behind the Prefect and MLflow servers (`tfopt up --db postgres`).

Debian's PostgreSQL binaries; the data folder lives under the tfopt state folder; the server
listens on 127.0.0.1 only (no Unix socket) and asks for a password (scram-sha-256). Its one
superuser, `tfopt`, gets a generated password kept in a file only the tfopt user can read; it
reaches the other servers through their environment, never through a command line or a log.
PostgreSQL refuses to run as root, so when tfopt runs as root the database server runs as the
`postgres` system user that Debian's package creates.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

from tfopt.services.credentials import private_secret, write_private

SUPERUSER = "tfopt"
DATABASES = ("prefect", "mlflow")
LOOPBACK = "127.0.0.1"
_SYSTEM_USER = "postgres"
_INSTALL_HINT = ("Install Debian's `postgresql` package (`make db-deps` does), or put its bin "
                 "folder on PATH.")


class PostgresError(RuntimeError):
    """The local PostgreSQL server cannot be set up; the message says what to do."""


def binary(name: str) -> str:
    """The path of a PostgreSQL server program (`initdb`, `postgres`).

    Looks on PATH first, then in Debian's versioned folders (newest version first), which
    Debian does not put on PATH.

    Raises:
        PostgresError: PostgreSQL is not installed.
    """
    found = shutil.which(name)
    if found:
        return found
    debian = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
                    key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
                    reverse=True)
    if debian:
        return str(debian[0])
    raise PostgresError(f"PostgreSQL's `{name}` was not found. {_INSTALL_HINT}")


def server_user() -> str | None:
    """The system user the database server runs as: None (this user) unless tfopt is root.

    Raises:
        PostgresError: tfopt runs as root and there is no `postgres` user to run the server.
    """
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        raise PostgresError(
            "PostgreSQL refuses to run as root and there is no `postgres` system user. "
            f"{_INSTALL_HINT} Or run tfopt as a normal user."
        ) from None
    return _SYSTEM_USER


def home(state_dir: Path) -> Path:
    """The folder holding the data folder and the password file."""
    return state_dir / "postgres"


def data_dir(state_dir: Path) -> Path:
    """PostgreSQL's data folder (PGDATA)."""
    return home(state_dir) / "data"


def password_file(state_dir: Path) -> Path:
    """The file with the superuser's password, readable only by its owner."""
    return home(state_dir) / "password"


def password(state_dir: Path) -> str:
    """The superuser's password; generated and written (mode 0600, atomically) the first time."""
    return private_secret(password_file(state_dir))


def database_url(state_dir: Path, port: int, database: str, driver: str) -> str:
    """The SQLAlchemy address of one database, password included (keep it out of logs).

    Args:
        state_dir: The tfopt state folder.
        port: The PostgreSQL port.
        database: One of `DATABASES`.
        driver: The SQLAlchemy driver (`asyncpg` for Prefect, `psycopg` (3) for MLflow).
    """
    return (f"postgresql+{driver}://{SUPERUSER}:{password(state_dir)}@{LOOPBACK}:{port}/"
            f"{database}")


def ensure_cluster(state_dir: Path) -> str | None:
    """Create the database cluster under the state folder unless it exists.

    Returns:
        A line saying the cluster was created, or None when it already existed.

    Raises:
        PostgresError: PostgreSQL is missing, or its user cannot reach or create the folder.
    """
    data = data_dir(state_dir)
    if (data / "PG_VERSION").exists():
        return None
    user = server_user()
    data.mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    if user:
        shutil.chown(data, user=user)
        blocked = _folder_closed_to(data.parent, user)
        if blocked:
            raise PostgresError(
                f"the `{user}` user cannot enter {blocked}, so the database server cannot reach "
                f"its data folder {data}. Allow it (`chmod o+x {blocked}`) or set TFOPT_HOME to "
                "a folder it can reach."
            )
    secret = home(state_dir) / ".initdb-password"
    write_private(secret, password(state_dir), owner=user)
    try:
        completed = subprocess.run(
            [binary("initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=scram-sha-256",
             f"--pwfile={secret}", "--encoding=UTF8", "--locale=C.UTF-8"],
            capture_output=True, text=True, user=user, check=False,
        )
    finally:
        secret.unlink(missing_ok=True)
    if completed.returncode != 0:
        raise PostgresError(f"initdb failed for {data}: {completed.stderr.strip()[-1500:]}")
    return f"postgres: created a database cluster in {data}"


def _folder_closed_to(folder: Path, user: str) -> Path | None:
    """The first folder on the way to `folder` that `user` may not enter, if any."""
    account = pwd.getpwnam(user)
    groups = {account.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for path in [*reversed(folder.resolve().parents), folder.resolve()]:
        mode = path.stat()
        if mode.st_uid == account.pw_uid:
            allowed = mode.st_mode & stat.S_IXUSR
        elif mode.st_gid in groups:
            allowed = mode.st_mode & stat.S_IXGRP
        else:
            allowed = mode.st_mode & stat.S_IXOTH
        if not allowed:
            return path
    return None


def server_command(state_dir: Path, port: int) -> list[str]:
    """The `postgres` command line: the data folder, 127.0.0.1:`port`, no Unix socket."""
    return [binary("postgres"), "-D", str(data_dir(state_dir)), "-p", str(port),
            "-c", f"listen_addresses={LOOPBACK}", "-c", "unix_socket_directories="]


def can_log_in(state_dir: Path, port: int) -> bool:
    """Whether the server accepts the superuser's password (it is up and ready)."""
    import psycopg

    if not password_file(state_dir).exists():
        return False
    try:
        connection = psycopg.connect(host=LOOPBACK, port=port, user=SUPERUSER,
                                     password=password(state_dir), dbname="postgres",
                                     connect_timeout=2)
    except psycopg.OperationalError:
        return False
    connection.close()
    return True


def create_databases(state_dir: Path, port: int) -> list[str]:
    """Create the Prefect and MLflow databases that do not exist yet.

    Returns:
        The names of the databases created.
    """
    import psycopg

    created = []
    connection = psycopg.connect(host=LOOPBACK, port=port, user=SUPERUSER,
                                 password=password(state_dir), dbname="postgres",
                                 autocommit=True)
    with contextlib.closing(connection), connection.cursor() as cursor:
        for database in DATABASES:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE DATABASE "{database}"')
                created.append(database)
    return created
