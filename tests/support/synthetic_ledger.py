"""Synthetic usage ledgers for the reader's tests: records chained with the collector's own
`record_hash`, laid out as the collector's volume holds them (segments/, pruned.jsonl,
state.json), tampered with as an attacker would, and served by the fake engine's `archive` from
a usage-ledger container of a site."""

import io
import json
import tarfile
from pathlib import Path

from kit.dataplane.collector.usage_ledger import GENESIS, record_hash
from kit.engine.desired import ONEOFF_LABEL, PROJECT_LABEL, SERVICE_LABEL, ContainerConfig
from kit.plan.usage import USAGE_SERVICE
from kit.usage.ledger import LEDGER_DIR
from tests.support.fake_engine import FakeEngine
from tests.support.sites import write_site

COLLECTOR_IMAGE = "vllm/vllm-openai:v0.33.0"
SERVED = ("alpha", "beta")  # write_site's two services: 1 GPU and 2 GPUs


def record(time: str, *, who: str = "key:ci", model: str | None = "alpha", prompt: int | None = 10,
           completion: int | None = 20, ended: str = "completed", status: int = 200) -> dict:
    """A record's fields as the collector writes them (seq, request_id and hash come later)."""
    return {"time": time, "who": who, "client": "10.0.0.7", "model": model,
            "route": "/v1/chat/completions", "method": "POST", "status": status,
            "prompt_tokens": prompt, "completion_tokens": completion, "ttft_ms": 12,
            "duration_ms": 340, "bytes_in": 210, "bytes_out": 900, "ended": ended,
            "door_boot": "b00t", "door_seq": 0}


def chained(segments: dict[str, list[dict]], *, first_seq: int = 1, previous: str = GENESIS
            ) -> dict[str, list[dict]]:
    """Each day's records given seq, request id, door_seq and hash, in day order, one chain."""
    seq, out = first_seq, {}
    for day in sorted(segments):
        out[day] = []
        for fields in segments[day]:
            linked = {**fields, "seq": seq, "door_seq": seq, "request_id": f"req{seq:06d}"}
            previous = record_hash(previous, linked)
            out[day].append({**linked, "hash": previous})
            seq += 1
    return out


def jsonl(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def ledger_files(segments: dict[str, list[dict]], *, pruned: tuple[str, ...] = ()
                 ) -> dict[str, bytes]:
    """The collector's volume (paths inside its container) for chained segments; the days in
    `pruned` removed with their pruned.jsonl entry, as retention does."""
    files: dict[str, bytes] = {}
    entries = []
    last = {"seq": 0, "hash": GENESIS}
    for day, records in sorted(segments.items()):
        if day in pruned:
            entries.append({"segment": f"{day}.jsonl", "first_seq": records[0]["seq"],
                            "last_seq": records[-1]["seq"], "last_hash": records[-1]["hash"],
                            "reason": "retention", "at": f"{day}T23:59:59.000Z"})
        else:
            files[f"{LEDGER_DIR}/segments/{day}.jsonl"] = jsonl(records)
        if records:
            last = {"seq": records[-1]["seq"], "hash": records[-1]["hash"]}
    if entries:
        files[f"{LEDGER_DIR}/pruned.jsonl"] = jsonl(entries)
    files[f"{LEDGER_DIR}/state.json"] = json.dumps(  # the collector's head, among its health
        {"version": 1, "ok": True, "last_seq": last["seq"], "last_hash": last["hash"]}).encode()
    return files


def folder_files(folder: Path) -> dict[str, bytes]:
    """A ledger folder on this host (the collector run as a process) as the collector's volume
    holds it: the files `archive` copies out."""
    return {f"{LEDGER_DIR}/{path.relative_to(folder)}": path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def segment_lines(files: dict[str, bytes], day: str) -> list[bytes]:
    return files[f"{LEDGER_DIR}/segments/{day}.jsonl"].splitlines(keepends=True)


def set_segment_lines(files: dict[str, bytes], day: str, lines: list[bytes]) -> None:
    files[f"{LEDGER_DIR}/segments/{day}.jsonl"] = b"".join(lines)


def ledger_container(engine: FakeEngine, project: str, files: dict[str, bytes] | None, *,
                     running: bool = True) -> str:
    """A usage-ledger container of `project` on the fake engine holding `files` (None: none)."""
    engine.images.setdefault(COLLECTOR_IMAGE, "sha256:collector")
    config = ContainerConfig(
        image=COLLECTOR_IMAGE, entrypoint=("python3",), command=("/opt/kit-usage/x.py",),
        environment=(), mounts=(), tmpfs=(), read_only=True, security_opt=(), ulimits=(),
        ipc_mode=None, gpus=(), healthcheck=None, restart="unless-stopped", stop_signal=None,
        stop_timeout=None, log_driver="json-file", log_options=(), networks=(), ports=())
    labels = {PROJECT_LABEL: project, SERVICE_LABEL: USAGE_SERVICE, ONEOFF_LABEL: "False"}
    container_id = engine.create_container(f"{project}-{USAGE_SERVICE}-1", config, labels, [])
    if running:
        engine.start(container_id)
    if files is not None:
        engine.container_files[container_id] = files
    return container_id


def ledger_site(root: Path, engine: FakeEngine, files: dict[str, bytes] | None) -> Path:
    """write_site's site (project unit01) with a usage-ledger container holding `files`."""
    spec = write_site(root)
    ledger_container(engine, "unit01", files)
    return spec


def tar_of(files: dict[str, bytes]) -> bytes:
    """Files by absolute path as a tar to unpack at / (the engine's archive API)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def stopped_collector(client, project: str, image: str, files: dict[str, bytes]):
    """On a real engine (a docker-py client): project's usage-ledger container, created and
    never started, its ledger volume filled with `files` through the archive API."""
    volume = client.volumes.create(f"{project}_usage-ledger", labels={PROJECT_LABEL: project})
    collector = client.containers.create(
        image, name=f"{project}-{USAGE_SERVICE}-1", entrypoint=["true"],
        labels={PROJECT_LABEL: project, SERVICE_LABEL: USAGE_SERVICE, ONEOFF_LABEL: "False"},
        volumes={volume.name: {"bind": LEDGER_DIR, "mode": "rw"}})
    assert collector.put_archive("/", tar_of(files))
    return collector
