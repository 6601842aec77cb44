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
