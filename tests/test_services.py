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


def test_a_server_that_dies_while_starting_is_quoted_in_the_error(tmp_path):
    """Its log may be in a folder removed before anyone reads it (a test's temporary home)."""
    import sys

    from tfopt.services import _Service, _spawn, _wait_healthy

    settings = ServiceSettings(state_dir=tmp_path)
    dying = _Service(name="postgres", port=0, address="127.0.0.1:0", ready=lambda: False,
                     command=[sys.executable, "-c",
                              "print('FATAL:  could not create lock file'); raise SystemExit(1)"])
    with pytest.raises(ServiceError, match=r"exited with code 1(.|\n)*could not create lock file"):
        _wait_healthy(settings, dying, _spawn(settings, dying), timeout_s=30)


def test_a_chosen_free_port_is_below_the_range_outgoing_connections_take():
    """Else a client's source port can take a test server's port before it binds it."""
    from pathlib import Path

    from tfopt.processes import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low <= 21000:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: any free port is taken")
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all(port < low for port in ports), ports
    for port in ports:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_down_services_name_the_address_and_tfopt_up():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ServiceError, match=rf"127\.0\.0\.1:{port}.*tfopt up"):
        require_services(f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}")


def _preflight(url: str, origin: str) -> tuple[int, str | None]:
    """A browser's CORS preflight for a JSON POST from `origin`: status and allowed origin."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("access-control-allow-origin")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("access-control-allow-origin")


@pytest.mark.e2e
def test_a_cross_origin_post_to_the_prefect_api_is_refused(live_services):
    url = f"{live_services.prefect_api_url}/flows/"
    status, allowed = _preflight(url, "http://evil.example")
    assert status >= 400 and allowed is None, (status, allowed)
    status, allowed = _preflight(url, live_services.prefect_url)
    assert status == 200 and allowed == live_services.prefect_url, "the UI's own origin works"


def _status(url: str, method: str = "GET", auth: tuple[str, str] | None = None,
            body: bytes | None = None) -> int:
    import base64
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.e2e
def test_servers_reachable_from_other_machines_refuse_requests_without_the_password(tmp_path):
    import os
    import stat
    import subprocess

    from tests.live import ROOT, service_env, tfopt_command
    from tests.tasks.test_benchmark_any_model import detector_onnx
    from tfopt.processes import free_port
    from tfopt.services.credentials import AUTH_USER, auth_file, client_credentials

    settings = ServiceSettings(state_dir=tmp_path / "state", host="0.0.0.0",
                               prefect_port=free_port(), mlflow_port=free_port())
    env = {**service_env(settings), "TFOPT_HOST": "0.0.0.0"}
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING"):
        env.pop(key, None)
    # The first start of a fresh state folder: its own clean-up must use the new password.
    up = subprocess.run(tfopt_command(["up"]), cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=400)
    try:
        said = up.stdout + up.stderr
        assert up.returncode == 0 and "Traceback" not in said, said[-3000:]
        assert "reachable from other machines" in said
        secret_file = auth_file(settings.state_dir)
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        secret = secret_file.read_text().strip()
        local = settings.mlflow_url.replace("0.0.0.0", "127.0.0.1")
        search = f"{local}/api/2.0/mlflow/experiments/search?max_results=1"
        flows = settings.prefect_api_url.replace("0.0.0.0", "127.0.0.1") + "/flows/filter"
        assert _status(f"{local}/health") == 200, "health probes stay open"
        assert _status(search) == 401
        assert _status(search, auth=(AUTH_USER, "wrong")) == 401
        assert _status(search, auth=(AUTH_USER, secret)) == 200
        assert _status(flows, "POST", body=b"{}") == 401
        assert _status(flows, "POST", auth=(AUTH_USER, "wrong"), body=b"{}") == 401
        assert _status(flows, "POST", auth=(AUTH_USER, secret), body=b"{}") == 200
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                    "PREFECT_API_AUTH_STRING"):
            os.environ.pop(key, None)
        assert client_credentials(settings.state_dir) == {
            "MLFLOW_TRACKING_USERNAME": AUTH_USER, "MLFLOW_TRACKING_PASSWORD": secret,
            "PREFECT_API_AUTH_STRING": f"{AUTH_USER}:{secret}"}, "what tfopt's clients send"
        model = detector_onnx(tmp_path / "detector.onnx")
        env = {**service_env(settings), "TFOPT_HOST": "0.0.0.0"}
        done = subprocess.run(
            tfopt_command(["benchmark", "--model", str(model), "--inputs", "random",
                           "--work-dir", str(tmp_path / "work"), "--set",
                           "benchmark.min_seconds=0.1", "--set", "benchmark.max_seconds=0.5"]),
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "MLflow UI" in done.stdout, "tfopt benchmark ran its flow and logged to MLflow"
    finally:
        subprocess.run(tfopt_command(["down"]), cwd=ROOT, env=env, capture_output=True,
                       timeout=120)
