"""A second host for the remote-engine tests: its own network namespace, Docker engine and sshd,
reached only over ssh:// with a generated key and a known_hosts entry.

Built from nothing (CI: a clean Debian machine, root): openssh-server is installed when sshd is
missing; `ip netns` + a veth pair give the host an address (REMOTE_IP) that only this test's
namespace routes to; dockerd runs inside it (`nsenter --net`, its own data-root, exec-root,
pidfile and socket, iptables off) with the GPU hook stub of `scripts/dockerd.sh hook` on its
PATH (written here, whoever started the engine that answers); the test images reach it by
`docker save | docker load`; sshd runs inside it too, and its ForceCommand points
`docker system dial-stdio` (what docker-py's SSH transport runs) at that engine. Both "hosts"
share one filesystem, so the tests assert that no remote container mounts anything under the
local site folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import requests

from tests.support.docker_engine import DOCKERD
from tests.support.workers import worker_index

# The veth pair's /24 in the engine's namespace: one per pytest-xdist worker, so second hosts of
# tests running at once never share a route.
REMOTE_IP = f"10.213.{100 + worker_index()}.2"
LOCAL_IP = f"10.213.{100 + worker_index()}.1"
SSH_PORT = 2222
READY_S = 30


@dataclass
class RemoteHost:
    namespace: str
    root: Path  # config, keys, the engine's state
    home: Path  # HOME for kit: .ssh/id_ed25519 and .ssh/known_hosts
    client: docker.DockerClient  # the remote engine, straight to its socket (tests only)
    sshd: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ssh://root@{REMOTE_IP}:{SSH_PORT}"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def known_hosts(self) -> Path:
        return self.home / ".ssh" / "known_hosts"

    @property
    def host_key_line(self) -> str:
        key = (self.root / "host_ed25519.pub").read_text().split()
        return f"[{REMOTE_IP}]:{SSH_PORT} {key[0]} {key[1]}\n"

    def start_sshd(self) -> None:
        log = (self.root / "sshd.log").open("ab")
        self.sshd = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.namespace}", shutil.which("sshd") or
             "/usr/sbin/sshd", "-D", "-e", "-f", str(self.root / "sshd_config")],
            stdout=log, stderr=log, start_new_session=True,
        )
        _wait(lambda: _answers(self.namespace, REMOTE_IP, SSH_PORT), "sshd")

    def stop_sshd(self) -> None:
        if self.sshd is not None:
            self.sshd.terminate()
            self.sshd.wait(10)
            self.sshd = None

    def mounts_under(self, folder: Path) -> list[str]:
        """Every mount source of a remote container that lies under `folder` (must be none)."""
        return [m["Source"] for c in self.client.containers.list(all=True)
                for m in c.attrs["Mounts"] if Path(m["Source"]).is_relative_to(folder)]


def _run(*argv: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **options)


def nvidia_hook_dir() -> str:
    """The folder of scripts/dockerd.sh's NVIDIA hook stub, written now: the engine that answers
    may have been started by someone else, and dockerd.sh writes it only when it starts one."""
    return _run("bash", str(DOCKERD), "hook").stdout.strip()


def _answers(namespace: str, host: str, port: int) -> bool:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{namespace}", "bash", "-c",
         f"exec 3<>/dev/tcp/{host}/{port}"], capture_output=True).returncode == 0


def _wait(ready, what: str) -> None:
    deadline = time.monotonic() + READY_S
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {READY_S} s")
        time.sleep(0.2)


def ensure_sshd() -> None:
    """openssh-server from Debian when sshd is missing; a host sshd its package may have
    started is stopped again (the tests start their own, in the second host's namespace)."""
    if shutil.which("sshd") or Path("/usr/sbin/sshd").exists():
        return
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=env)
    _run("apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server", env=env)
    subprocess.run(["service", "ssh", "stop"], capture_output=True, env=env)


def write_sshd_config(root: Path, docker_cli: str | None = None) -> None:
    """sshd's config; `docker_cli`: what the forced command runs (a missing one: no docker)."""
    docker_cli = docker_cli or shutil.which("docker") or "/usr/bin/docker"
    (root / "sshd_config").write_text(
        f"ListenAddress {REMOTE_IP}\nPort {SSH_PORT}\n"
        f"HostKey {root / 'host_ed25519'}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxSessions 8\n"  # kit's bound: a ninth session at once would be refused
        f"ForceCommand /usr/bin/env DOCKER_HOST=unix://{root / 'docker.sock'} "
        f"{docker_cli} system dial-stdio\n"
    )


@dataclass
class HostNamespace:
    """A second host without sshd: its network namespace (a veth pair to this one, LOCAL_IP
    here and REMOTE_IP there, and no other route) and its own Docker engine."""

    namespace: str
    veth: str  # this end's name (the host's side of the pair)
    root: Path  # the engine's state, its socket
    client: docker.DockerClient  # the engine, straight to its socket

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"


@contextlib.contextmanager
def host_namespace(images: list[str]) -> Iterator[HostNamespace]:
    """The namespace and its engine up, `images` loaded from this engine (`docker save |
    docker load`); torn down (engine, processes, namespace, veth, state) afterwards."""
    tag = secrets.token_hex(3)
    namespace, veth = f"kitr-{tag}", f"kr{tag}"
    root = Path(f"/var/lib/kitr-{tag}")  # short: containerd's socket path must fit
    root.mkdir(parents=True)
    dockerd = None
    try:
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", f"{veth}a", "type", "veth", "peer", "name", f"{veth}b",
             "netns", namespace)
        _run("ip", "addr", "add", f"{LOCAL_IP}/24", "dev", f"{veth}a")
        _run("ip", "link", "set", f"{veth}a", "up")
        for command in (["ip", "addr", "add", f"{REMOTE_IP}/24", "dev", f"{veth}b"],
                        ["ip", "link", "set", f"{veth}b", "up"], ["ip", "link", "set", "lo", "up"]):
            _run("ip", "-n", namespace, *command[1:])
        env = {"PATH": f"{nvidia_hook_dir()}:"
                       "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        dockerd = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{namespace}", "dockerd", "--iptables=false",
             "--ip6tables=false", "--data-root", str(root / "data"), "--exec-root",
             str(root / "exec"), "--pidfile", str(root / "dockerd.pid"),
             "-H", f"unix://{root / 'docker.sock'}"],
            stdout=(root / "dockerd.log").open("wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
        # a pinned API version: the client asks nothing before the socket exists
        client = docker.DockerClient(base_url=f"unix://{root / 'docker.sock'}", version="1.41")
        _wait(lambda: _pings(client), "the second host's dockerd")
        if images:
            saved = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
            _run("docker", "-H", f"unix://{root / 'docker.sock'}", "load", stdin=saved.stdout)
            assert saved.wait() == 0, "docker save failed"
        host = HostNamespace(namespace, f"{veth}a", root, client)
        try:
            yield host
        finally:
            host.client.close()
    finally:
        if dockerd is not None:
            with contextlib.suppress(Exception):
                for container in docker.DockerClient(base_url=f"unix://{root / 'docker.sock'}",
                                                     version="1.41").containers.list(all=True):
                    container.remove(force=True)
            dockerd.terminate()
            dockerd.wait(30)
        _kill_processes_in(namespace)  # sshd's per-connection children outlive the listener
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{veth}a"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def remote_host(base: Path, local_client: docker.DockerClient,
                images: list[str]) -> Iterator[RemoteHost]:
    """The second host, up, with sshd; torn down (engine, sshd, namespace, veth, state)
    afterwards."""
    ensure_sshd()
    home = base / "home"
    (home / ".ssh").mkdir(parents=True)
    with host_namespace(images) as second:
        root = second.root
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_ed25519"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
             str(home / ".ssh" / "id_ed25519"))
        shutil.copy(home / ".ssh" / "id_ed25519.pub", root / "authorized_keys")
        write_sshd_config(root)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        host = RemoteHost(second.namespace, root, home, second.client)
        host.known_hosts.write_text(host.host_key_line)
        try:
            host.start_sshd()
            yield host
        finally:
            host.stop_sshd()


@contextlib.contextmanager
def operated_host(base: Path, local_client: docker.DockerClient,
                  test_images: dict[str, str]) -> Iterator[RemoteHost]:
    """The second host with the test vLLM and nginx images, kit run as its operator: HOME
    holding the key and known_hosts, no ssh-agent."""
    import pytest

    with remote_host(base, local_client, [test_images["vllm"], test_images["nginx"]]) as host, \
            pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(host.home))
        patch.delenv("SSH_AUTH_SOCK", raising=False)
        yield host


def _kill_processes_in(namespace: str) -> None:
    """SIGKILL every process still in the namespace (all of them started by this fixture)."""
    try:
        ours = os.stat(f"/run/netns/{namespace}").st_ino
    except FileNotFoundError:
        return
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and os.stat(entry / "ns" / "net").st_ino == ours:
                os.kill(int(entry.name), signal.SIGKILL)


def _pings(client: docker.DockerClient) -> bool:
    try:
        return client.ping()
    except (docker.errors.DockerException, requests.exceptions.ConnectionError):
        return False
