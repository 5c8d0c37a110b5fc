"""`kit up` of a multi-node service over two real engines in two network namespaces.

The head runs on this namespace's engine (host networking on its end of a veth pair), the worker
on a second host (tests/support/remote_host.py: its own namespace, dockerd and sshd), reached
only as the node's `engine: ssh://…`. With the vLLM stand-in: kit's preflight proves the master
port from the worker's network, the head becomes ready only after the worker joined, the gate
passes through the head's front door, a killed worker is diagnosed by `kit status`, the next
`kit up` brings the service back, and `kit down` removes the containers on both engines.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docker_engine import PROJECT_LABEL, remove_project
from tests.support.live_stack import kit, write_multinode_spec
from tests.support.remote_host import LOCAL_IP, REMOTE_IP, RemoteHost, operated_host

pytestmark = pytest.mark.e2e


@pytest.fixture
def worker_host(tmp_path: Path, docker_client, test_images) -> Iterator[RemoteHost]:
    """The worker's server; kit runs with its HOME (key, known_hosts) and no ssh-agent."""
    with operated_host(tmp_path / "worker", docker_client, test_images) as host:
        yield host


def containers(client, project: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{PROJECT_LABEL}={project}"})


def test_kit_up_starts_both_nodes_gates_diagnoses_a_lost_worker_and_down_removes_both(
    tmp_path: Path, docker_client, worker_host: RemoteHost, free_port
) -> None:
    site = f"mn{secrets.token_hex(3)}"
    folder = tmp_path / site
    folder.mkdir()
    spec = folder / "site.yaml"
    write_multinode_spec(spec, tmp_path / "models", site, free_port, nodes=[
        {"name": site, "address": LOCAL_IP},
        {"name": "gpu02", "address": REMOTE_IP, "engine": worker_host.url},
    ], master_port=free_port(LOCAL_IP))
    worker_project = f"{site}-gpu02"
    try:
        started = time.monotonic()
        up = kit("up", str(spec), timeout=600)
        up_seconds = time.monotonic() - started
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"kit up: {up_seconds:.1f}s\n{up.stdout}")
        for line in ("nodes " + site + ", gpu02: same image and model files",
                     f"master port {LOCAL_IP}:", "reachable from gpu02",
                     f"node gpu02: create container {worker_project}-big-1",
                     f"create container {site}-big-1", "big healthy after", "all checks passed"):
            assert line in up.stdout, line
        (head,) = [c for c in containers(docker_client, site) if c.name == f"{site}-big-1"]
        (worker,) = containers(worker_host.client, worker_project)
        assert head.attrs["HostConfig"]["NetworkMode"] == "host"
        (nginx,) = [c for c in containers(docker_client, site) if c.name == f"{site}-nginx-1"]
        assert nginx.attrs["HostConfig"]["ExtraHosts"] == [f"big:{LOCAL_IP}"]
        assert worker.attrs["HostConfig"]["NetworkMode"] == "host"
        assert worker.attrs["HostConfig"]["IpcMode"] == "host"
        log = head.logs().decode()
        assert log.index("All 2 nodes joined") < log.index("Application startup complete")
        assert worker_host.mounts_under(folder) == []  # nothing of the site folder over there
        logs = kit("logs", str(spec), "big")
        assert logs.returncode == 0, logs.stderr
        assert "big       | " in logs.stdout and "big@gpu02 | " in logs.stdout

        worker.kill()
        deadline = time.monotonic() + 60
        while "remote process exited" not in head.logs().decode():
            assert time.monotonic() < deadline, head.logs().decode()[-2000:]
            time.sleep(0.5)
        status = kit("status", str(spec))
        assert status.returncode == 0, status.stderr
        print(status.stdout)
        assert f"node gpu02 ({worker_host.url}): 0 of 1 worker container(s) running" \
            in status.stdout, status.stdout
        assert "multi-node: not serving; cause:" in status.stdout
        assert "spec key: services[].nodes" in status.stdout
        assert f"node gpu02: start container {worker_project}-big-1" in status.stdout

        again = kit("up", str(spec), timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"node gpu02: start container {worker_project}-big-1" in again.stdout

        down = kit("down", str(spec))
        assert down.returncode == 0, down.stdout + down.stderr
        assert "and on node(s) gpu02" in down.stdout
        assert containers(docker_client, site) == []
        assert containers(worker_host.client, worker_project) == []
    finally:
        remove_project(docker_client, site)
        remove_project(worker_host.client, worker_project)
