"""Real Prefect and MLflow server processes for flow tests, on free ports, state in tmp."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfopt.services import ServiceSettings, start_services, stop_services


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def live_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceSettings]:
    settings = ServiceSettings(
        state_dir=tmp_path_factory.mktemp("tfopt-home"),
        prefect_port=_free_port(),
        mlflow_port=_free_port(),
    )
    start_services(settings, timeout_s=240)
    try:
        yield settings
    finally:
        stop_services(settings)


def service_env(settings: ServiceSettings) -> dict[str, str]:
    """Environment for a `tfopt` subprocess that talks to `settings`' servers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(
        TFOPT_HOME=str(settings.state_dir),
        TFOPT_PREFECT_PORT=str(settings.prefect_port),
        TFOPT_MLFLOW_PORT=str(settings.mlflow_port),
        PREFECT_HOME=str(Path(settings.state_dir) / "client"),
    )
    return env
