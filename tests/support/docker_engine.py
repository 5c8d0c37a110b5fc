"""The real Docker engine the end-to-end tests run on: the local test images (what
tests/images/build.sh tags), the scripts that build them and start an engine, free ports, and
removing a compose project's resources. The fixtures on top are in tests/e2e/conftest.py."""

from __future__ import annotations

import contextlib
import itertools
import random
import socket

import docker

from tests.support.sites import REPO
from tests.support.workers import worker_index

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
    "alertmanager": "prom/alertmanager:v0.33.1",  # Debian forky's Alertmanager 0.33.1
    "pebble": "kit-test/pebble:2.4",  # tls.mode acme: the ACME server (tests/support/acme_ca.py)
    "certbot": "certbot/certbot:v3.1.0",  # Debian's certbot under the spec's default name
}
# What the spec's nginx image runs here: Debian 13's nginx and njs, the nearest to
# nginx:1.27-alpine's (docs/compatibility.md); version prefixes.
NGINX_VERSION, NJS_VERSION = "1.26.", "0.8."


# scripts/test.sh runs the suite in pytest-xdist workers at once on one engine (docs/testing.md).
# Stacks, networks and volumes take random names; what else could collide is split by worker:
# each picks ports in its own slice, below the kernel's ephemeral range (32768-), so no other
# worker and no outgoing connection holds one it picked (the second host's addresses:
# tests/support/remote_host.py).
FIRST_PORT, WORKER_PORTS = 20000, 1000
_port_cursor = itertools.count(random.randrange(WORKER_PORTS))


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, from this worker's slice, and the next one
    round it each call (a port just handed out may not be listened on yet)."""
    first = FIRST_PORT + worker_index() * WORKER_PORTS
    for _ in range(WORKER_PORTS):
        port = first + next(_port_cursor) % WORKER_PORTS
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {first}-{first + WORKER_PORTS - 1}")


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
