"""A multi-node service on a real engine with the vLLM stand-in, the rendered files run as they
are with plain Docker Compose v2 (kit up over two engines: tests/e2e/test_multinode_up.py).

Both nodes are compose projects on one engine with host networking, each on its own address of
a veth interface the test creates (the spec's network_interface): the head waits until the
worker joins before it serves, the gate passes through the head's front door, and killing the
worker stops the head with a log kit.converge.diagnose explains.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import pytest

from kit.converge.diagnose import diagnose
from tests.support.compose import COMPOSE_V2
from tests.support.docker_engine import PROJECT_LABEL, remove_project
from tests.support.live_stack import kit, write_multinode_spec

pytestmark = pytest.mark.e2e

INTERFACE = "kitmn0"
HEAD, WORKER = "10.213.7.1", "10.213.7.2"


@pytest.fixture
def node_addresses() -> str:
    """One end of a veth pair holding both nodes' addresses (removed afterwards)."""
    created = subprocess.run(["ip", "link", "add", INTERFACE, "type", "veth", "peer", "name",
                              f"{INTERFACE}p"], capture_output=True, text=True, check=False)
    if created.returncode != 0:
        pytest.skip(f"cannot create a veth pair here: {created.stderr.strip()}")
    try:
        for address in (HEAD, WORKER):
            subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", INTERFACE], check=True)
        for name in (INTERFACE, f"{INTERFACE}p"):
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield INTERFACE
    finally:
        subprocess.run(["ip", "link", "del", INTERFACE], check=False)


def compose(project: str, file: str, *args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(COMPOSE_V2), "-p", project, "-f", file, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_nodes_join_serve_through_the_head_and_a_lost_worker_is_diagnosed(
    tmp_path: Path, docker_client, test_images, free_port, node_addresses: str
) -> None:
    if not COMPOSE_V2.exists():
        pytest.skip(f"{COMPOSE_V2} is missing (scripts/dockerd.sh installs it)")
    site = f"mn{secrets.token_hex(3)}"
    spec = tmp_path / "site.yaml"
    write_multinode_spec(spec, tmp_path / "models", site, free_port, nodes=[
        {"name": site, "address": HEAD}, {"name": "gpu02", "address": WORKER}],
        network_interface=node_addresses, master_port=free_port())
    rendered = kit("render", str(spec))
    assert rendered.returncode == 0, rendered.stderr
    worker_project = f"{site}-gpu02"
    try:
        head_up = compose(site, "compose/docker-compose.yml", "up", "-d", "--wait", cwd=tmp_path)
        deadline = time.monotonic() + 60
        while not docker_client.containers.list(filters={"label": f"{PROJECT_LABEL}={site}"}):
            assert time.monotonic() < deadline, "the head was not created"
            time.sleep(0.5)
        time.sleep(6)  # several load times: alone, the head waits for its worker
        (head,) = [c for c in docker_client.containers.list(
            filters={"label": f"{PROJECT_LABEL}={site}"}) if "big" in c.name]
        head.reload()
        assert head.attrs["State"]["Health"]["Status"] == "starting"
        assert "Waiting for 1 other node(s) to join" in head.logs().decode()
        assert head_up.poll() is None  # nginx waits for a healthy head

        worker_up = compose(worker_project, "compose/node-gpu02.yml", "up", "-d", cwd=tmp_path)
        assert worker_up.wait(timeout=120) == 0, worker_up.stdout.read()
        assert head_up.wait(timeout=180) == 0, head_up.stdout.read()
        assert "All 2 nodes joined" in head.logs().decode()

        gate = kit("probe", str(spec))
        assert gate.returncode == 0, gate.stdout + gate.stderr

        (worker,) = docker_client.containers.list(
            filters={"label": f"{PROJECT_LABEL}={worker_project}"})
        worker.kill()
        deadline = time.monotonic() + 60
        while "remote process exited" not in head.logs().decode():
            assert time.monotonic() < deadline, head.logs().decode()[-2000:]
            time.sleep(0.5)
        found = diagnose(head.logs().decode())
        assert found is not None and found.spec_key == "services[].nodes", found
    finally:
        for project in (site, worker_project):
            remove_project(docker_client, project)
