from __future__ import annotations

import socket

import pytest

from tfopt.services import ServiceError, ServiceSettings, require_services, start_services


def test_a_taken_port_gives_a_clear_message(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        settings = ServiceSettings(state_dir=tmp_path, prefect_port=port, mlflow_port=port)
        with pytest.raises(ServiceError, match=f"port {port} .* taken"):
            start_services(settings, timeout_s=5)


def test_down_services_name_the_address_and_tfopt_up():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ServiceError, match=rf"127\.0\.0\.1:{port}.*tfopt up"):
        require_services(f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}")
