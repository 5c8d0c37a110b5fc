"""The usage-ledger collector (kit/dataplane/collector/usage_ledger.py) as the compose file runs it:
a process on a spool file and a ledger folder, asked over HTTP; spool lines as nginx writes them;
the ledger's records read back and their chain checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from kit.dataplane.collector.usage_ledger import GENESIS, record_hash
from tests.support import nginx_ns
from tests.support.docker_engine import pick_free_port
from tests.support.sites import REPO

SCRIPT = REPO / "kit" / "dataplane" / "collector" / "usage_ledger.py"
MODELS = ["tiny", "org/big-model"]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models"]


def spool_line(seq: int, boot: str = "boot-a", **fields: str) -> dict:
    """One request as nginx's kit_usage log format writes it (every value text)."""
    line = {"v": "1", "boot": boot, "seq": str(seq), "t": f"1764629000.{seq % 1000:03d}",
            "id": f"{seq:032x}", "who": "key:alice", "addr": "10.0.0.7", "model": "tiny",
            "route": "/v1/chat/completions", "method": "POST", "status": "200",
            "prompt": "12", "completion": "30", "ttft": "0.051", "duration": "1.234",
            "bytes_in": "321", "bytes_out": "4567", "end": "completed"}
    line.update(fields)
    return line


def nobody_flood(count: int, per_window: int) -> list[dict]:
    """`count` requests refused before any credential, each from an address of its own, the
    door's time one second further every `per_window` (the collector's tests aggregate over one
    second): one aggregate record each while a window has fewer than MAX_AGGREGATES keys."""
    return [spool_line(seq, who="-", addr=f"10.{seq >> 16 & 255}.{seq >> 8 & 255}.{seq & 255}",
                       t=f"{1764629000 + (seq - 1) // per_window}.{seq % 1000:03d}", model="",
                       prompt="", completion="", ttft="", status="401", end="refused_auth")
            for seq in range(1, count + 1)]


def append_spool(path: Path, lines: Sequence[dict | str | bytes]) -> None:
    """Append as nginx does (O_APPEND, whole buffers); a str or bytes item is written as is."""
    data = b"".join(
        item if isinstance(item, bytes) else
        (item if isinstance(item, str) else json.dumps(item) + "\n").encode()
        for item in lines)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def by_door_seq(records: Sequence[dict]) -> dict[int, dict]:
    """Each door seq → its record: an aggregate's (its `door_seqs` runs) or its own."""
    return {seq: record for record in records
            for first, last in record.get("door_seqs", [[record["door_seq"]] * 2])
            for seq in range(first, last + 1)}


class CollectorProcess:
    """One run of the collector; `start` again after `kill` or `stop` resumes on the same
    files. `wrap` puts a command in front (e.g. unshare)."""

    def __init__(self, spool: Path, ledger: Path, *, grace: float = 30.0,
                 retention_days: int = 400, max_bytes: int = 1 << 30,
                 state_interval: float = 0.2, extra: Sequence[str] = (),
                 wrap: Sequence[str] = (), models_file: Path | None = None) -> None:
        self.spool, self.ledger = spool, ledger
        self.port = pick_free_port()
        self.argv = [*wrap, sys.executable, str(SCRIPT), "--spool", str(spool), "--ledger",
                     str(ledger), "--retention-days", str(retention_days), "--max-bytes",
                     str(max_bytes), "--port", str(self.port), "--host", "127.0.0.1",
                     *(("--models-file", str(models_file)) if models_file else
                       ("--models", json.dumps(MODELS))), "--routes", json.dumps(ROUTES),
                     "--grace", str(grace), "--aggregate-seconds", "1",
                     "--poll-interval", "0.05", "--state-interval",
                     str(state_interval), "--retry-max", "0.2", *extra]
        self.process: subprocess.Popen | None = None

    def start(self) -> CollectorProcess:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
        self.wait_for(lambda health: not health["recovering"], "it answers")
        return self

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.port}{path}"
        return urllib.request.urlopen(url, timeout=5).read().decode()

    def health(self) -> dict:
        return json.loads(self.get("/health"))

    def wait_for(self, condition: Callable[[dict], bool], what: str,
                 timeout: float = 30.0) -> dict:
        """The first /health for which `condition` holds; fails naming `what` and the last."""
        deadline = time.monotonic() + timeout
        health: dict = {}
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode() if self.process.stdout else ""
                raise AssertionError(f"the collector exited {self.process.returncode}: {output}")
            try:
                health = self.health()
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
                continue
            if condition(health):
                return health
            time.sleep(0.05)
        raise AssertionError(f"waited {timeout} s for {what}; last health: {health}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, as docker stop sends it to PID 1: the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=10)


def run_with_a_lost_record(folder: Path) -> tuple[dict, Path]:
    """The collector run on spool lines 1, 2, 3 and 5 (4 never arrives) until it counted the
    gap, then stopped: its last /health (4 records, 1 lost) and its ledger (`folder`/ledger)."""
    spool, ledger = folder / "door.jsonl", folder / "ledger"
    append_spool(spool, [spool_line(seq) for seq in (1, 2, 3, 5)])
    collector = CollectorProcess(spool, ledger, grace=0.2).start()
    try:
        health = collector.wait_for(lambda h: h["lost"]["total"] == 1, "the gap counted")
    finally:
        assert collector.stop() == 0  # its last save on the way out
    return health, ledger


def ledger_records(ledger: Path) -> list[dict]:
    """Every record of every segment, oldest segment first."""
    return [json.loads(line) for segment in sorted((ledger / "segments").glob("*.jsonl"))
            for line in segment.read_text().splitlines()]


def chain_breaks(records: Sequence[dict], previous: str = GENESIS) -> list[int]:
    """The seqs whose hash does not follow from the record before (or whose seq skips)."""
    breaks, seq = [], records[0]["seq"] if records else 0
    for record in records:
        if record["hash"] != record_hash(previous, record) or record["seq"] != seq:
            breaks.append(record["seq"])
        previous, seq = record["hash"], record["seq"] + 1
    return breaks


def chained(records: Sequence[dict], previous: str = GENESIS) -> list[dict]:
    """Records (without seq and hash) numbered and hashed as the collector would, from
    `previous` on: for ledgers a test lays down before the collector starts."""
    out = []
    for record in records:
        record = {**record, "seq": (out[-1]["seq"] + 1) if out else record["seq"]}
        record.pop("hash", None)
        record["hash"] = previous = record_hash(previous, record)
        out.append(record)
    return out


def ledger_record(seq: int, door_seq: int, boot: str = "boot-old") -> dict:
    """A record as the collector writes it (before its hash)."""
    return {"seq": seq, "time": "2020-01-01T00:00:00.000Z", "request_id": f"{door_seq:032x}",
            "who": "user:bob", "client": "10.0.0.8", "model": "tiny",
            "route": "/v1/completions", "method": "POST", "status": 200, "prompt_tokens": 5,
            "completion_tokens": 7, "ttft_ms": None, "duration_ms": 100, "bytes_in": 10,
            "bytes_out": 20, "ended": "completed", "door_boot": boot, "door_seq": door_seq}


def write_segment(ledger: Path, day: str, records: Sequence[dict]) -> Path:
    path = ledger / "segments" / f"{day}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record, separators=(",", ":")) + "\n"
                            for record in records))
    return path


# A stand-in for the front door's spool format on a real nginx: the same keys and escaping
# (escape=json), the door's own variables (boot, seq, model, tokens) taken from the query string.
SPOOL_NGINX_CONF = """worker_processes 2;
pid /run/nginx.pid;
events {}
http {
  map $remote_user $who { "" "-"; default "user:$remote_user"; }
  log_format kit_usage escape=json '{"v":"1","boot":"real-nginx","seq":"$arg_seq","t":"$msec",'
    '"id":"$request_id","who":"$who","addr":"$remote_addr","model":"$arg_model",'
    '"route":"$uri","method":"$request_method","status":"$status","prompt":"$arg_prompt",'
    '"completion":"","ttft":"","duration":"$request_time","bytes_in":"$request_length",'
    '"bytes_out":"$bytes_sent","end":"completed"}';
  access_log /var/log/kit-usage/door.jsonl kit_usage buffer=64k flush=1s;
  server { listen 127.0.0.1:8080; location / { return 200 "ok\\n"; } }
}
"""


def real_nginx_spool(work: Path, curls: Sequence[str]) -> Path:
    """Each curl argument string run against a real nginx (tests/support/nginx_ns.py's chroot,
    in private mount and network namespaces) writing SPOOL_NGINX_CONF's spool; nginx is stopped
    gracefully (its buffer written) before this returns the spool's path."""
    conf, spool = work / "nginx-conf", work / "spool"
    conf.mkdir()
    spool.mkdir()
    (conf / "nginx.conf").write_text(SPOOL_NGINX_CONF)
    root = nginx_ns.nginx_root()
    clients = "".join(f"curl -s -o /dev/null {arguments}\n" for arguments in curls)
    after = (f"set +e\n{clients}pid=$(cat {root}/run/nginx.pid)\nkill -QUIT $pid\n"
             "while kill -0 $pid 2>/dev/null; do sleep 0.05; done\n")
    script = nginx_ns.namespace_script(
        {"/etc/nginx/kit": conf, "/var/log/kit-usage": spool}, [], "ip link set lo up",
        "-c /etc/nginx/kit/nginx.conf", work, after)
    done = subprocess.run(["unshare", "-m", "-n", "sh", "-c", script], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return spool / "door.jsonl"
