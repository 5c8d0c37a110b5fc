"""A site on a second host, driven from a working folder that host cannot see, over ssh:// only.

One remote host (tests/support/remote_host.py: its own namespace, dockerd and sshd) serves every
test of this module. The refusals are provoked for real (no known_hosts entry, a wrong host key, no
client key, sshd stopped); then `kit up` brings the stack up there and the gate passes through
its front door, a password rotation under running streams drops none, a fleet of two servers
(this machine's engine and the remote one) is one status table within 5 s and names the remote
when its sshd is down, and `kit down` cleans.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from kit.front_door.client import basic_header
from kit.plan.usage import USAGE_SERVICE
from tests.support.live_stack import (
    LOADGEN,
    SERVED_NAME,
    SERVICE,
    LiveSite,
    checked,
    finished,
    kit,
    timed_kit,
    write_spec,
)
from tests.support.remote_host import (
    REMOTE_IP,
    SSH_PORT,
    RemoteHost,
    operated_host,
    write_sshd_config,
)
from tests.support.sites import LLAMA_8B
from tests.support.synthetic_ledger import chained, ledger_files, record, stopped_collector

pytestmark = pytest.mark.e2e

HTTPS_PORT, HTTP_PORT = 8443, 8080  # the remote host's own ports (its namespace is empty)
STREAMS = 50
TOKENS = 250
# Each stream lasts about 25 s: the rotation happens inside. Over SSH each API connection is a
# `docker system dial-stdio` on the remote, so a rotation takes seconds, not a fraction of one
# (11.5 s at load 14 on 2 cores; a rotation that outlasts the streams fails the test, naming it).
TOKEN_INTERVAL_MS = 100


@pytest.fixture(scope="module")
def remote(tmp_path_factory, docker_client, test_images) -> Iterator[RemoteHost]:
    """The second host; kit runs with its HOME (key, known_hosts) and no ssh-agent."""
    with operated_host(tmp_path_factory.mktemp("remote"), docker_client, test_images) as host:
        yield host


def remote_spec(root: Path, remote: RemoteHost, name: str) -> Path:
    """A one-service site whose engine is the remote host; its model folder is that host's."""
    models = remote.root / "models"
    (models / SERVICE).mkdir(parents=True, exist_ok=True)
    (models / SERVICE / "config.json").write_text(json.dumps(LLAMA_8B))
    root.mkdir(parents=True)
    write_spec(root / "site.yaml", {
        "site": name, "domain": REMOTE_IP, "engine": remote.url, "models_root": str(models),
        "healthcheck_interval": 1, "auth": {"users": ["ops"], "api_keys": True},
        "proxy": {"bind": "0.0.0.0", "https_port": HTTPS_PORT, "http_port": HTTP_PORT},
        "services": [{"name": SERVICE, "model": SERVICE, "served_name": SERVED_NAME,
                      "gpus": [0], "max_model_len": 4096, "max_num_seqs": 256,
                      "env": {"STANDIN_LOAD_SECONDS": "1",
                              "STANDIN_TOKEN_INTERVAL_MS": str(TOKEN_INTERVAL_MS)}}],
    })
    return root / "site.yaml"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, remote: RemoteHost) -> LiveSite:
    root = tmp_path_factory.mktemp("remote-site") / "site"
    site = LiveSite(root, "remote1", remote.client, HTTPS_PORT)
    remote_spec(root, remote, site.name)
    output = checked(site.kit("render")).stdout
    site.passwords = {"ops": output.split("password for ops: ")[1].split()[0]}
    return site


def refused(site: LiveSite) -> subprocess.CompletedProcess:
    result = site.kit("status")
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_an_unknown_host_key_is_refused_with_the_keyscan_line(
    remote: RemoteHost, rendered: LiveSite
) -> None:
    remote.known_hosts.write_text("")
    try:
        result = refused(rendered)
    finally:
        remote.known_hosts.write_text(remote.host_key_line)
    assert result.returncode == 2, result.stderr
    assert f"[{REMOTE_IP}]:{SSH_PORT} is not in ~/.ssh/known_hosts" in result.stderr
    assert f"ssh-keyscan -p {SSH_PORT} {REMOTE_IP}" in result.stderr


def test_a_changed_host_key_is_refused(remote: RemoteHost, rendered: LiveSite,
                                       tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
                   check=True)
    other = (tmp_path / "other.pub").read_text().split()
    remote.known_hosts.write_text(f"[{REMOTE_IP}]:{SSH_PORT} {other[0]} {other[1]}\n")
    try:
        result = refused(rendered)
    finally:
        remote.known_hosts.write_text(remote.host_key_line)
    assert result.returncode == 2, result.stderr
    assert "CHANGED" in result.stderr and f"ssh-keygen -R '[{REMOTE_IP}]:{SSH_PORT}'" in (
        result.stderr)


def test_without_a_key_the_login_is_refused(remote: RemoteHost, rendered: LiveSite) -> None:
    key = remote.home / ".ssh" / "id_ed25519"
    key.rename(key.with_suffix(".away"))
    try:
        result = refused(rendered)
    finally:
        key.with_suffix(".away").rename(key)
    assert result.returncode == 2, result.stderr
    assert f"{REMOTE_IP} refused the SSH login of root" in result.stderr
    assert "authorized_keys" in result.stderr


def test_with_sshd_stopped_the_engine_is_unreachable(remote: RemoteHost,
                                                      rendered: LiveSite) -> None:
    remote.stop_sshd()
    try:
        result = refused(rendered)
    finally:
        remote.start_sshd()
    assert result.returncode == 1, result.stderr
    assert f"cannot reach the SSH server of the engine at root@{REMOTE_IP}:{SSH_PORT}" in (
        result.stderr)
    assert "connection refused" in result.stderr


def test_ssh_without_docker_there_is_named(remote: RemoteHost, rendered: LiveSite) -> None:
    remote.stop_sshd()
    write_sshd_config(remote.root, "/nonexistent/docker")
    remote.start_sshd()
    try:
        result = refused(rendered)
    finally:
        remote.stop_sshd()
        write_sshd_config(remote.root)
        remote.start_sshd()
    assert result.returncode == 1, result.stderr
    assert f"SSH to root@{REMOTE_IP}:{SSH_PORT} works, but no Docker engine answers" in (
        result.stderr)
    assert "docker is not installed there" in result.stderr


def test_a_model_folder_missing_on_that_host_is_refused_before_anything_starts(
    tmp_path: Path, remote: RemoteHost
) -> None:
    """The models are on the remote host's disk, not the working folder's: a spec naming a
    model that is not there is refused (exit 2) by a look through that host's engine."""
    spec = remote_spec(tmp_path / "site", remote, "remote2")
    text = spec.read_text()
    spec.write_text(text.replace(f"model: {SERVICE}", "model: not-copied-there"))
    result = kit("up", str(spec))
    assert result.returncode == 2, result.stdout + result.stderr
    missing = f"{remote.root / 'models' / 'not-copied-there'} does not exist on the engine's host"
    assert missing in result.stderr and remote.url in result.stderr, result.stderr
    assert "fix: copy the model to" in result.stderr, result.stderr
    assert not remote.client.containers.list(
        all=True, filters={"label": "com.docker.compose.project=remote2"})


@pytest.fixture(scope="module")
def up(rendered: LiveSite, remote: RemoteHost) -> Iterator[str]:
    """`kit up` of the rendered site on the remote host (its output); `kit down` at the end."""
    yield checked(rendered.kit("up")).stdout
    rendered.kit("down")


def test_up_runs_the_stack_there_and_the_gate_passes_through_its_front_door(
    remote: RemoteHost, rendered: LiveSite, up: str
) -> None:
    assert "site files delivered through the engine" in up
    assert "all checks passed" in up and f"via {REMOTE_IP}" in up, up
    assert remote.mounts_under(rendered.root) == [], "a remote container mounts a local path"
    assert {c.name for c in remote.client.containers.list()} == {
        f"{rendered.name}-{service}-1"
        for service in (SERVICE, "nginx", "kit-auth", USAGE_SERVICE)}
    assert rendered.status(credentials=rendered.basic("ops")) == 200
    logs = rendered.kit("logs", "nginx")
    assert logs.returncode == 0 and "GET /v1/models" in logs.stdout, logs.stdout + logs.stderr


def test_a_rotation_under_streams_there_drops_none(rendered: LiveSite, up: str) -> None:
    site = rendered
    old, new = site.passwords["ops"], "rotated-on-the-remote-9Zq"
    load = subprocess.Popen(
        [sys.executable, str(LOADGEN), "--url", f"https://{REMOTE_IP}:{HTTPS_PORT}",
         "--ca", str(site.layout.ca_cert), "--model", SERVED_NAME, "--streams",
         str(STREAMS), "--tokens", str(TOKENS), "--auth", basic_header("ops", old),
         "--announce"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert load.stderr.readline() == "streaming\n", "the streams did not start"
    started = time.monotonic()
    rotated = site.kit("rotate-password", "ops", "--password-stdin", stdin=f"{new}\n{old}\n")
    rotation_s = time.monotonic() - started
    streams_still_running = load.poll() is None
    figures = finished(load)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "proven through the front door: old password: 401" in rotated.stdout
    assert streams_still_running, f"streams ended before the rotation ({rotation_s:.1f} s)"
    assert figures["ok"] == STREAMS and figures["tokens"] == STREAMS * TOKENS, figures
    print(f"rotation over SSH under {STREAMS} streams: {rotation_s:.1f} s, "
          f"{figures['ok']}/{STREAMS} streams complete")
    site.passwords["ops"] = new
    probe = site.kit("probe")
    assert probe.returncode == 0 and f"via {REMOTE_IP}" in probe.stdout, probe.stdout


@pytest.fixture
def fleet(tmp_path: Path, rendered: LiveSite, docker_client, up: str) -> Path:
    """Two servers: this machine's engine (a rendered site) and the remote host's."""
    folder = tmp_path / "fleet"
    folder.mkdir()
    (folder / "gpu-remote").symlink_to(rendered.root)
    local = LiveSite(folder / "gpu-local", "fleetlocal", docker_client, HTTPS_PORT)
    local.root.mkdir()
    spec = yaml.safe_load(rendered.spec_path.read_text())
    del spec["engine"]
    spec.update(site=local.name, domain="llm.test")
    write_spec(local.spec_path, spec)
    checked(local.kit("render"))
    return folder


def test_fleet_status_of_two_servers_is_one_table_within_5_s(
    fleet: Path, remote: RemoteHost
) -> None:
    """Within 5 s on a quiet machine; on a loaded one (the suite's parallel pass), within 1.5x
    the remote server's own `kit status` timed just before and after (the servers are asked at
    once, so the fleet costs about its slowest server, however slow the machine is now)."""
    before = timed_kit("status", str(fleet / "gpu-remote" / "site.yaml"))
    result, seconds = timed_kit("fleet", str(fleet), "status")
    after = timed_kit("status", str(fleet / "gpu-remote" / "site.yaml"))
    alone = min(before[1], after[1])
    assert before[0].returncode == 0 and after[0].returncode == 0, before[0].stdout
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {"gpu-local", "gpu-remote"}
    # the model, the door, its verifier and the usage ledger
    assert "4/4 running" in rows["gpu-remote"] and "4/4 healthy" in rows["gpu-remote"]
    assert remote.url in rows["gpu-remote"] and "passed" in rows["gpu-remote"]
    assert "0/0 running" in rows["gpu-local"]
    print(f"kit fleet status, 2 servers (local + ssh://): {seconds:.1f} s; the remote's own "
          f"kit status {before[1]:.1f} s before, {after[1]:.1f} s after")
    assert seconds <= max(5.0, 1.5 * alone), (
        f"kit fleet status took {seconds:.1f} s, the remote's own status {alone:.1f} s")


def test_a_fleet_with_the_remote_unreachable_names_it_and_reports_the_other(
    fleet: Path, remote: RemoteHost
) -> None:
    remote.stop_sshd()
    try:
        status = kit("fleet", str(fleet), "status")
        rotated = kit("fleet", str(fleet), "rotate-password", "ops", "--password-stdin",
                      stdin="fleet-wide-password-4Hn\n")
    finally:
        remote.start_sshd()
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:]}
    assert "cannot reach the SSH server" in rows["gpu-remote"]
    assert "0/0 running" in rows["gpu-local"]
    assert "1 of 2 server(s) failed: gpu-remote" in status.stderr
    changed = {line.split()[0]: line for line in rotated.stdout.splitlines()[1:3]}
    assert rotated.returncode == 1, rotated.stdout + rotated.stderr
    assert "old password still in effect" in changed["gpu-remote"]
    assert "new password in the files; live at its next `kit up`" in changed["gpu-local"]


def test_down_cleans_the_remote_host(remote: RemoteHost, rendered: LiveSite, up: str) -> None:
    down = rendered.kit("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert remote.client.containers.list(all=True) == []
    assert [v.name for v in remote.client.volumes.list()
            if v.name.startswith(f"{rendered.name}_kit-files")] == []


def test_fleet_usage_merges_this_engine_and_one_over_ssh(
    tmp_path: Path, remote: RemoteHost, docker_client, test_images, compose_project
) -> None:
    """Each server's usage ledger is read through its own engine, the remote one over ssh://
    only (docker cp of a collector that never started), and printed as one table."""
    today = datetime.now(UTC).date().isoformat()

    def ledger(who: str, requests: int) -> dict[str, bytes]:
        return ledger_files(chained({today: [record(f"{today}T00:00:0{n}.000Z", who=who)
                                             for n in range(requests)]}))

    remote_name = f"{compose_project}r"
    stopped_collector(remote.client, remote_name, test_images["nginx"], ledger("key:far", 3))
    stopped_collector(docker_client, compose_project, test_images["nginx"],
                      ledger("key:near", 2))
    fleet = tmp_path / "fleet"
    spec = yaml.safe_load(remote_spec(fleet / "gpu-remote", remote, remote_name).read_text())
    del spec["engine"]
    (fleet / "gpu-local").mkdir()
    write_spec(fleet / "gpu-local" / "site.yaml", {**spec, "site": compose_project})
    result = kit("fleet", str(fleet), "usage", "--since", today, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [(r["server"], r["who"], r["requests"]) for r in json.loads(result.stdout)["rows"]]
    assert rows == [("gpu-local", "key:near", 2), ("gpu-remote", "key:far", 3)]
    verified = kit("audit", "verify", str(fleet / "gpu-remote" / "site.yaml"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("ledger whole: 3 records in 1 segment(s)")
