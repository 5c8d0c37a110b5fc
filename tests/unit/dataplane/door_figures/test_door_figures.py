"""kit/dataplane/door_figures/door_figures.py: nginx's per-request datagrams counted into Prometheus
text, run as the process the compose file starts (a real unix socket, a real HTTP scrape)."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.sites import REPO

SCRIPT = REPO / "kit" / "dataplane" / "door_figures" / "door_figures.py"


@pytest.fixture
def figures(tmp_path: Path):
    """door-figures.py listening on a socket in tmp_path; yields (socket path, scrape())."""
    path = tmp_path / "access.sock"
    with socket.socket() as probe:  # a port nothing listens on now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--socket", str(path), "--port",
                                str(port), "--upstreams", json.dumps({"kit_tiny": "tiny"})])

    def scrape() -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        return urllib.request.urlopen(url, timeout=5).read().decode()

    deadline = time.monotonic() + 10
    while not path.exists() or not _answers(scrape):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    yield path, scrape
    process.terminate()
    assert process.wait(timeout=5) == 0  # SIGTERM ends it at once (it may run as PID 1)


def _answers(scrape) -> bool:
    try:
        scrape()
    except OSError:
        return False
    return True


def send(path: Path, *messages: str) -> None:
    """As nginx sends them: `<PRI>TIMESTAMP TAG: MESSAGE` (nohostname), one per datagram."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for message in messages:
            sock.sendto(f"<190>Nov 30 19:00:00 kit: {message}".encode(), str(path))


def test_requests_by_status_and_service_with_their_times(figures) -> None:
    path, scrape = figures
    send(path, "200|0.120|0.118|kit_tiny", "200|0.020|0.015, 0.019|kit_tiny",
         "401|0.001|-|", "413|0.000|-|", "429|0.000|-|", "502|0.004|0.003|kit_tiny",
         "200|0.300|0.290|grafana:3000", "not a line")
    deadline = time.monotonic() + 5
    while "kit_door_unreadable_lines_total 1" not in (text := scrape()):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    lines = set(text.splitlines())
    assert {'kit_door_requests_total{service="tiny",status="200"} 2',
            'kit_door_requests_total{service="tiny",status="502"} 1',
            'kit_door_requests_total{status="401"} 1', 'kit_door_requests_total{status="413"} 1',
            'kit_door_requests_total{status="429"} 1',
            'kit_door_requests_total{status="200"} 1'} <= lines  # grafana: no service
    # upstream times per service, the last try of "0.015, 0.019" counted
    assert 'kit_door_upstream_response_seconds_count{service="tiny"} 3' in lines
    assert 'kit_door_upstream_response_seconds_bucket{service="tiny",le="0.025"} 2' in lines
    assert 'kit_door_upstream_response_seconds_bucket{service="tiny",le="0.1"} 2' in lines
    assert 'kit_door_upstream_response_seconds_bucket{service="tiny",le="0.25"} 3' in lines
    assert 'kit_door_request_duration_seconds_count{} 4' in lines  # 401, 413, 429, grafana
    assert 'kit_door_request_duration_seconds_count{service="tiny"} 3' in lines
