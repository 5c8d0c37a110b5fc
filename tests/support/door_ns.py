"""The rendered front door serving for real without Docker: the chrooted nginx (nginx_ns.py)
and the vLLM stand-in as a process, both in a private network namespace where the service
names resolve to loopback, as they reach each other on the compose network.

The test reaches them from inside that namespace: `Door.inside()` moves the calling thread
there (setns; sockets made meanwhile stay in it) and back. nginx's stdout access log and the
usage spool are files under the work folder, so a test reads what nginx wrote.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kit.engine.desired import VERIFIER_SERVICE
from kit.layout import NGINX_MOUNT
from kit.plan.build import VLLM_PORT
from tests.support import nginx_ns
from tests.support.standin_process import STANDIN, standin_env

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


@dataclass
class Door:
    """A running front door: its namespace, its files, the stand-in behind it."""

    work: Path
    nginx: subprocess.Popen
    standin: subprocess.Popen
    netns: int  # an open fd of the namespace
    server_name: str
    ca_file: Path

    @property
    def spool(self) -> Path:
        return self.work / "spool" / "door.jsonl"

    @property
    def access_log(self) -> Path:
        return self.work / "nginx.out"

    @contextmanager
    def inside(self) -> Iterator[None]:
        """The calling thread in the door's network namespace (127.0.0.1:443 is nginx,
        127.0.0.1:8000 the stand-in) for the block."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(self.netns)
            yield
        finally:
            _setns(home)
            os.close(home)

    def tls_context(self) -> ssl.SSLContext:
        """The site CA trusted, the name not checked: the door is reached at 127.0.0.1."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.check_hostname = False
        return context

    def connect(self) -> ssl.SSLSocket:
        """A TLS connection to the door (call inside())."""
        raw = socket.create_connection(("127.0.0.1", 443), timeout=30)
        return self.tls_context().wrap_socket(raw, server_hostname=self.server_name)

    def records(self, request_ids: list[str], timeout: float = 5) -> dict[str, list[dict]]:
        """The spool lines of these requests (nginx writes its buffer out within a second)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [json.loads(line) for line in self.spool.read_text().splitlines()]
            found = {rid: [line for line in lines if line["id"] == rid] for rid in request_ids}
            if all(found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _wait_port(door: Door, port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    with door.inside():
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} in time")


@contextmanager
def serving_door(nginx_dir: Path, work: Path, hostnames: list[str], model: Path,
                 served_name: str, server_name: str, **standin: str) -> Iterator[Door]:
    """nginx on the rendered `nginx_dir` and a stand-in serving `model` as `served_name`,
    in a namespace of their own, until the block ends."""
    root = nginx_ns.nginx_root()
    assert root is not None, nginx_ns.available()
    (work / "spool").mkdir()
    script = nginx_ns.namespace_script(
        {NGINX_MOUNT: nginx_dir.resolve(), nginx_ns.USAGE_SPOOL_DIR: (work / "spool").resolve()},
        [VERIFIER_SERVICE, *hostnames], "ip link set lo up",
        f"-c {NGINX_MOUNT}/nginx.conf -g 'daemon off;'", work)
    with open(work / "nginx.out", "wb") as out, open(work / "nginx.err", "wb") as err:
        nginx = subprocess.Popen(["unshare", "-m", "-n", "sh", "-c", script], stdout=out,
                                 stderr=err, start_new_session=True)
    time.sleep(0.2)
    netns = os.open(f"/proc/{nginx.pid}/ns/net", os.O_RDONLY)
    log = open(work / "standin.out", "wb")  # noqa: SIM115 (closed below)
    standin_proc = subprocess.Popen(
        [sys.executable, str(STANDIN / "vllm"), "serve", str(model), "--served-model-name",
         served_name, "--host", "127.0.0.1", "--port", str(VLLM_PORT),
         "--disable-uvicorn-access-log"],
        env=standin_env(**standin), stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=lambda: _setns(netns))
    door = Door(work, nginx, standin_proc, netns, server_name, nginx_dir / "tls" / "ca.crt")
    try:
        _wait_port(door, 443, nginx)
        _wait_port(door, VLLM_PORT, standin_proc)
        yield door
    finally:
        for proc in (standin_proc, nginx):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM) if proc is nginx else proc.terminate()
                proc.wait(timeout=10)
        log.close()
        os.close(netns)
