"""The real Docker engine the end-to-end tests run on: the local test images (what
tests/images/build.sh tags), the scripts that build them and start an engine, free ports, and
removing a compose project's resources. The fixtures on top are in tests/e2e/conftest.py."""

from __future__ import annotations

import contextlib
import socket

import docker

from tests.support.sites import REPO

BUILD = REPO / "tests" / "images" / "build.sh"
DOCKERD = REPO / "scripts" / "dockerd.sh"
PROJECT_LABEL = "com.docker.compose.project"

# What build.sh tags by default: the names the rendered compose file references, plus its own.
IMAGES = {
    "vllm": "vllm/vllm-openai:v0.33.0",
    "vllm_standin": "kit-test/vllm-standin:latest",
    "nginx": "nginx:1.27-alpine",  # Debian 13's nginx 1.26.3 + njs 0.8.9
    "nginx_debian": "kit-test/nginx:1.22",  # Debian 12's: only the ACME tests' rate limiter
    "prometheus": "prom/prometheus:v3.5.0",  # Debian forky's Prometheus 3.5.3
    "grafana": "grafana/grafana:12.1.1",  # a stand-in, NOT Grafana (tests/images/grafana-standin)
    "pebble": "kit-test/pebble:2.4",  # tls.mode acme: the ACME server (tests/support/acme_ca.py)
    "certbot": "certbot/certbot:v3.1.0",  # Debian's certbot under the spec's default name
}
# What the spec's nginx image runs here: Debian 13's nginx and njs, the nearest to
# nginx:1.27-alpine's (docs/compatibility.md); version prefixes.
NGINX_VERSION, NJS_VERSION = "1.26.", "0.8."


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
