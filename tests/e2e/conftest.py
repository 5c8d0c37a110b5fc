"""Fixtures for end-to-end tests against a real Docker engine and the local test images.

The engine comes from scripts/dockerd.sh (or whatever engine already answers); the images from
tests/images/build.sh, run once per session. Without an engine the tests are skipped with the
reason (CI has one). Mark such tests with @pytest.mark.e2e.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "images" / "build.sh"
DOCKERD = REPO / "scripts" / "dockerd.sh"
PROJECT_LABEL = "com.docker.compose.project"

# What build.sh tags by default: the names the rendered compose file references, plus its own.
IMAGES = {
    "vllm": "vllm/vllm-openai:v0.33.0",
    "vllm_standin": "kit-test/vllm-standin:latest",
    "nginx": "nginx:1.27-alpine",  # Debian 13's nginx 1.26.3 + njs 0.8.9
    "nginx_debian": "kit-test/nginx:1.22",  # Debian 12's: only the ACME tests' rate limiter
    "prometheus": "prom/prometheus:v3.5.0",  # Debian's Prometheus 2.42
    "grafana": "grafana/grafana:12.1.1",  # a stand-in, NOT Grafana (tests/images/grafana-standin)
    "pebble": "kit-test/pebble:2.4",  # tls.mode acme: the ACME server (tests/e2e/acme.py)
    "certbot": "certbot/certbot:v3.1.0",  # Debian's certbot under the spec's default name
}
# What the spec's nginx image runs here: Debian 13's nginx and njs, the nearest to
# nginx:1.27-alpine's (docs/compatibility.md); version prefixes.
NGINX_VERSION, NJS_VERSION = "1.26.", "0.8."


@pytest.fixture(scope="session")
def docker_client():
    """docker.from_env(), or a skip (with the reason) when no engine answers."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine answers ({e}); start one with scripts/dockerd.sh start")
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_images(docker_client) -> dict[str, str]:
    """Builds (or re-tags, when nothing changed) the test images once a session, and proves that
    the engine gives containers GPUs (every kit service reserves some): an engine someone else
    started may lack even the test stub of the NVIDIA hook, and the fix is named once, here."""
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"tests/images/build.sh failed:\n{result.stderr}", pytrace=False)
    for name in IMAGES.values():
        docker_client.images.get(name)
    gpus = subprocess.run(["bash", str(DOCKERD), "gpus", IMAGES["vllm_standin"]],
                          capture_output=True, text=True, timeout=120)
    if gpus.returncode != 0:
        pytest.fail(f"the end-to-end tests need GPU reservations:\n{gpus.stderr}", pytrace=False)
    return dict(IMAGES)


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> Callable[..., int]:
    return pick_free_port


def remove_project(client, project: str) -> None:
    """Remove the containers, networks and volumes labelled with a compose project name."""
    label = f"{PROJECT_LABEL}={project}"
    for container in client.containers.list(all=True, filters={"label": label}):
        # NotFound: already gone (e.g. removed by `compose down` racing with us)
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
    for network in client.networks.list(filters={"label": label}):
        network.remove()
    for volume in client.volumes.list(filters={"label": label}):
        volume.remove(force=True)


@pytest.fixture
def compose_project(docker_client) -> Iterator[str]:
    """A fresh compose project name; everything labelled with it is removed afterwards."""
    project = f"kite2e{secrets.token_hex(4)}"
    yield project
    remove_project(docker_client, project)


@pytest.fixture
def project_labels(compose_project) -> dict[str, str]:
    """Labels that put a container started by hand into `compose_project` (so it is removed)."""
    return {PROJECT_LABEL: compose_project}


@pytest.fixture
def cleanup_project(docker_client) -> Iterator[Callable[[str], None]]:
    """Register project names (e.g. a site name) whose resources must go after the test."""
    projects: list[str] = []
    yield projects.append
    for project in projects:
        remove_project(docker_client, project)
