"""The rendered front door serving for real without Docker: the chrooted nginx (nginx_ns.py)
and the vLLM stand-in as a process, both in a private network namespace where the service
names resolve to loopback, as they reach each other on the compose network.

The test reaches them from inside that namespace: `Door.inside()` moves the calling thread
there (setns; sockets made meanwhile stay in it) and back. nginx's stdout access log and the
usage spool are files under the work folder, so a test reads what nginx wrote.
"""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events

from kit.engine.desired import VERIFIER_SERVICE
from kit.layout import NGINX_MOUNT, VERIFIER_AUTH_MOUNT, VERIFIER_MOUNT
from kit.plan.build import VLLM_PORT
from tests.support import nginx_ns
from tests.support.raw_http import RawReply, parse_reply
from tests.support.raw_http import request as raw_request
from tests.support.sites import REPO
from tests.support.standin_process import STANDIN, standin_env

CLONE_NEWNET = 0x40000000
LOADGEN = REPO / "scripts" / "loadgen.py"
VERIFIER_ADDRESS = "127.0.0.2"  # kit-auth's name resolves here when the verifier runs
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
    new_standin: Callable[[], subprocess.Popen]
    verifier: subprocess.Popen | None = None  # serving_door(verifier=True): its nginx's shell
    replicas: dict[str, subprocess.Popen] | None = None  # serving_door(replicas=…): by address
    clock_offset_s: int = 0  # serving_door(clock_offset_s=…): how far nginx's clock is ahead

    def now(self) -> float:
        """nginx's wall clock now (time.time() unless its clock was shifted)."""
        return time.time() + self.clock_offset_s

    def restart_standin(self) -> None:
        """A new stand-in after the last one was killed."""
        self.standin.wait(timeout=10)
        self.standin = self.new_standin()
        _wait_port(self, VLLM_PORT, self.standin)

    @contextmanager
    def upstream_bodies(self) -> Iterator[list[bytes]]:
        """The stand-in replaced, for the block, by a server that records each body nginx sends
        upstream (what vLLM would read) and answers 200 `{}`; the stand-in back afterwards."""
        bodies: list[bytes] = []

        class Recorder(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_: object) -> None:
                pass

        self.standin.terminate()
        self.standin.wait(timeout=10)
        with self.inside():
            recorder = http.server.ThreadingHTTPServer(("127.0.0.1", VLLM_PORT), Recorder)
        thread = threading.Thread(target=recorder.serve_forever, daemon=True)
        thread.start()
        try:
            yield bodies
        finally:
            recorder.shutdown()
            recorder.server_close()
            self.restart_standin()

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

    def exchange(self, request: bytes, *, direct: bool = False, wait_s: float = 0) -> RawReply:
        """`request` on a fresh connection to the door (or straight to the stand-in), read
        until closed (after `wait_s`: a slow reader, whose stream piles up in nginx's buffer)."""
        with self.inside():
            sock = (socket.create_connection(("127.0.0.1", VLLM_PORT), timeout=30) if direct
                    else self.connect())
        with sock:
            sock.sendall(request)
            time.sleep(wait_s)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return parse_reply(data)

    def abort_after(self, request: bytes, events: int) -> bytes:
        """Send `request`, read until `events` SSE events came, then close the connection."""
        with self.inside():
            sock = self.connect()
        with sock:
            sock.sendall(request)
            return read_events(sock, events)

    def h2_cancel_after(self, path: str, headers: list[tuple[str, str]], body: bytes,
                        events: int) -> None:
        """One HTTP/2 stream: read until `events` SSE events came, then RST_STREAM (CANCEL),
        the connection kept open a moment after (an h2 client leaving one stream)."""
        context = self.tls_context()
        context.set_alpn_protocols(["h2"])
        with self.inside():
            raw = socket.create_connection(("127.0.0.1", 443), timeout=30)
        with context.wrap_socket(raw, server_hostname=self.server_name) as sock:
            assert sock.selected_alpn_protocol() == "h2"
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            conn.send_headers(1, [(":method", "POST"), (":path", path), (":scheme", "https"),
                                  (":authority", self.server_name),
                                  ("content-length", str(len(body))), *headers])
            conn.send_data(1, body, end_stream=True)
            sock.sendall(conn.data_to_send())
            seen = 0
            while seen < events:
                for event in conn.receive_data(sock.recv(65536)):
                    if isinstance(event, h2.events.DataReceived):
                        seen += event.data.count(b"data: ")
                        conn.acknowledge_received_data(event.flow_controlled_length, 1)
                sock.sendall(conn.data_to_send())
            conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
            sock.sendall(conn.data_to_send())
            time.sleep(0.5)

    def loadgen(self, *options: str, timeout: float = 120) -> subprocess.Popen:
        """scripts/loadgen.py started in the door's namespace against nginx (TLS verified
        against the site CA, the site's name in SNI) with `options`; its JSON line on stdout,
        --announce's lines on stderr."""
        return subprocess.Popen(
            ["nsenter", f"--net=/proc/{self.nginx.pid}/ns/net", sys.executable, str(LOADGEN),
             "--url", "https://127.0.0.1:443", "--host", self.server_name, "--ca",
             str(self.ca_file), "--timeout", str(timeout), *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def load(self, *options: str, timeout: float = 120) -> dict:
        """loadgen.py's figures of one run with `options` (see `loadgen`)."""
        proc = self.loadgen(*options, timeout=timeout)
        stdout, stderr = proc.communicate(timeout=timeout + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"loadgen exited {proc.returncode}: {stderr}")
        return json.loads(stdout)

    def counters(self) -> tuple[int, int]:
        """The stand-in's vllm:prompt_tokens_total and vllm:generation_tokens_total."""
        reply = self.exchange(raw_request("GET", "/metrics", "vllm"), direct=True)
        values = dict(re.findall(rb"^vllm:(prompt|generation)_tokens_total\{[^}]*\} (\S+)$",
                                 reply.body, re.MULTILINE))
        return int(float(values[b"prompt"])), int(float(values[b"generation"]))

    def settled_counters(self) -> tuple[int, int]:
        """The counters once nothing runs any more (an aborted stream's last step done)."""
        last = self.counters()
        while True:
            time.sleep(0.2)
            now = self.counters()
            if now == last:
                return now
            last = now

    def master(self) -> int:
        """nginx's master process (the child of the namespace's shell)."""
        sh = self.nginx.pid
        return int(Path(f"/proc/{sh}/task/{sh}/children").read_text().split()[0])

    def workers(self) -> set[int]:
        return _children(self.master())

    def nginx_processes(self) -> set[int]:
        """Every process of the door's nginx and of its verifier: masters and workers."""
        shells = [self.nginx.pid] + ([self.verifier.pid] if self.verifier else [])
        masters = {master for shell in shells for master in _children(shell)}
        return masters | {worker for master in masters for worker in _children(master)}

    def flush_logs(self) -> None:
        """nginx's log buffers written out now (SIGUSR1: reopen, which flushes them first),
        not within the second `flush=1s` allows."""
        os.kill(self.master(), signal.SIGUSR1)

    def reload(self, conf: Path, text: str, timeout: float = 30) -> None:
        """`text` as nginx.conf (in the bound folder), then SIGHUP; returns once every old
        worker has gone."""
        old = self.workers()
        conf.write_text(text)
        os.kill(self.master(), signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self.workers() & old:
            assert time.monotonic() < deadline, "nginx kept its old workers"
            time.sleep(0.05)

    def record_of(self, agent: str, timeout: float = 5) -> dict:
        """The spool line of the one request sent with User-Agent `agent` (its id from the
        stdout access log)."""
        self.flush_logs()
        deadline = time.monotonic() + timeout
        while True:
            ids = re.findall(rf'"{re.escape(agent)}" id=(\w+)', self.access_log.read_text())
            if ids or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(ids) == 1, f"{agent}: {ids}"
        found = self.records(ids, timeout)[ids[0]]
        assert len(found) == 1, found
        return found[0]

    def records(self, request_ids: list[str], timeout: float = 5) -> dict[str, list[dict]]:
        """The spool lines of these requests (nginx writes its buffer out within a second)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [json.loads(line) for line in self.spool.read_text().splitlines()]
            found = {rid: [line for line in lines if line["id"] == rid] for rid in request_ids}
            if all(found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def read_events(sock: socket.socket, events: int) -> bytes:
    """What came on `sock` until `events` SSE events did (or the connection closed)."""
    data = b""
    while data.count(b"data: ") < events and (chunk := sock.recv(65536)):
        data += chunk
    return data


def _wait_port(door: Door, port: int, proc: subprocess.Popen, address: str = "127.0.0.1",
               timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    with door.inside():
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}"
            try:
                socket.create_connection((address, port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} in time")


def _own_namespace(proc: subprocess.Popen, timeout: float = 10) -> int:
    """An fd of the network namespace `proc` made for itself (once unshare has run)."""
    ours = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + timeout
    while os.stat(f"/proc/{proc.pid}/ns/net").st_ino == ours:
        assert proc.poll() is None and time.monotonic() < deadline, "unshare did not run"
        time.sleep(0.01)
    return os.open(f"/proc/{proc.pid}/ns/net", os.O_RDONLY)


def _standin(netns: int, work: Path, model: Path, served_name: str,
             env: dict[str, str], args: tuple[str, ...] = (),
             address: str = "127.0.0.1") -> subprocess.Popen:
    with open(work / "standin.out", "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(STANDIN / "vllm"), "serve", str(model), "--served-model-name",
             served_name, "--host", address, "--port", str(VLLM_PORT),
             "--disable-uvicorn-access-log", *args],
            env=standin_env(**env), stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=lambda: _setns(netns))


def _verifier(netns_pid: int, nginx_dir: Path, work: Path) -> subprocess.Popen:
    """The rendered verifier (kit-auth: the Basic password checks) served by the chrooted nginx
    in the door's network namespace, at VERIFIER_ADDRESS: its `listen 8081` (every address in
    its own container) narrowed to that address, as the door's own healthcheck listens at
    127.0.0.1:8081 here; the rest of its config as rendered."""
    folder = work / "verifier"
    shutil.copytree(nginx_dir / "verifier", folder / "conf")
    folder = folder.resolve()
    conf = folder / "conf" / "nginx.conf"
    text = conf.read_text()
    assert text.count("listen 8081;") == 1, "the verifier's listener moved: update door_ns"
    conf.write_text(text.replace("listen 8081;", f"listen {VERIFIER_ADDRESS}:8081;"))
    script = nginx_ns.namespace_script(
        {VERIFIER_MOUNT: folder / "conf", VERIFIER_AUTH_MOUNT: (nginx_dir / "auth").resolve()},
        [], "", f"-c {VERIFIER_MOUNT}/nginx.conf -g 'daemon off;'", folder)
    with open(folder / "out", "wb") as out:
        return subprocess.Popen(["nsenter", f"--net=/proc/{netns_pid}/ns/net", "unshare", "-m",
                                 "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@contextmanager
def serving_door(nginx_dir: Path, work: Path, hostnames: list[str], model: Path,
                 served_name: str, server_name: str, *, verifier: bool = False,
                 clock_offset_s: int = 0, standin_args: tuple[str, ...] = (),
                 addresses: tuple[str, ...] = (), replicas: dict[str, str] | None = None,
                 **standin: str) -> Iterator[Door]:
    """nginx on the rendered `nginx_dir` and a stand-in serving `model` as `served_name`
    (with `standin_args`, e.g. ("--runner", "pooling")), in a namespace of their own, until
    the block ends; with `verifier`, the rendered verifier too (Basic passwords are checked;
    without it a credential that is not a Bearer key of the site gets a 500); with
    `clock_offset_s`, nginx's wall clock that far ahead (a window's end comes sooner); with
    `addresses`, those IPv4 addresses on its loopback too (the metrics listener's, a client's);
    with `replicas` (hostname → loopback address), each of those names resolves to its address
    and has a stand-in of its own there (`Door.replicas`, by address)."""
    root = nginx_ns.nginx_root()
    assert root is not None, nginx_ns.available()
    (work / "spool").mkdir(exist_ok=True)  # kept: a restart of nginx on the same volume
    setup, prefix, keep_env = (nginx_ns.shifted_clock(clock_offset_s) if clock_offset_s
                               else ("", "", ""))
    script = nginx_ns.namespace_script(
        {NGINX_MOUNT: nginx_dir.resolve(), nginx_ns.USAGE_SPOOL_DIR: (work / "spool").resolve()},
        hostnames if verifier else [VERIFIER_SERVICE, *hostnames],
        "ip link set lo up\n" + "".join(f"ip addr add {a}/32 dev lo\n" for a in addresses) + setup,
        f"-c {NGINX_MOUNT}/nginx.conf -g 'daemon off; {keep_env}'", work, prefix=prefix,
        addresses=replicas)
    if verifier:
        with open(work / "hosts", "a") as hosts:
            hosts.write(f"{VERIFIER_ADDRESS} {VERIFIER_SERVICE}\n")
    with open(work / "nginx.out", "wb") as out, open(work / "nginx.err", "wb") as err:
        nginx = subprocess.Popen(["unshare", "-m", "-n", "sh", "-c", script], stdout=out,
                                 stderr=err, start_new_session=True)
    netns = _own_namespace(nginx)
    standin_proc = _standin(netns, work, model, served_name, standin, standin_args)
    door = Door(work, nginx, standin_proc, netns, server_name, nginx_dir / "tls" / "ca.crt",
                lambda: _standin(netns, work, model, served_name, standin, standin_args),
                clock_offset_s=clock_offset_s)
    checker = door.verifier = _verifier(nginx.pid, nginx_dir, work) if verifier else None
    door.replicas = {address: _standin(netns, work, model, served_name, standin, standin_args,
                                       address) for address in (replicas or {}).values()}
    try:
        _wait_port(door, 443, nginx)
        _wait_port(door, VLLM_PORT, standin_proc)
        for address, proc in door.replicas.items():
            _wait_port(door, VLLM_PORT, proc, address)
        if checker:
            _wait_port(door, 8081, checker, VERIFIER_ADDRESS)
        yield door
    finally:
        if checker and checker.poll() is None:
            os.killpg(checker.pid, signal.SIGTERM)
            checker.wait(timeout=10)
        for proc in (door.standin, *door.replicas.values(), nginx):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM) if proc is nginx else proc.terminate()
                proc.wait(timeout=10)
        os.close(netns)
