"""`kit pull` against the Hub stand-in: the model lands in <models_root>/<org>/<name>@<rev>,
verified, and vLLM is told to serve that folder; an interrupted pull resumes with a Range
request; a damaged folder is repaired file by file (through a remote engine:
tests/unit/supply/test_remote_pull.py)."""

import hashlib
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kit.dataplane.fetcher import weights_hashes
from kit.plan.build import build_plan
from kit.plan.host import load_spec
from kit.weights.hub import resolve
from kit.weights.lock import read_lock, write_lock
from tests.support.cli import run_kit
from tests.support.hub_standin import HubStandin, small_model
from tests.support.pinned_site import (
    MODEL,
    kit_process,
    locked_and_pulled,
    pinned_spec,
    pulled_folder,
)

SHARD1 = "model-00001-of-00002.safetensors"
BIG = "acme/big"


def test_lock_then_pull_serves_the_pulled_folder(tmp_path: Path, hub: HubStandin) -> None:
    spec = pinned_spec(tmp_path)
    locked = run_kit("lock", spec)
    assert locked.exit_code == 0, locked.output
    commit = hub.repos[MODEL].refs["main"]
    assert f"{MODEL}@main: commit {commit}, 9 file(s)" in locked.output
    assert f"commit: {commit}" in (spec.parent / "site.lock").read_text()
    assert run_kit("validate", spec).exit_code == 2  # locked, not pulled yet
    pulled = run_kit("pull", spec)
    assert pulled.exit_code == 0, pulled.output
    folder = pulled_folder(tmp_path)
    assert f"{MODEL}@main: {folder} verified against the lock file: 9 file(s) fetched" in \
        pulled.output
    assert "(100 %)" in pulled.output and "/s, ETA" in pulled.output  # the progress line
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny@main"]  # no staging left
    assert run_kit("validate", spec).exit_code == 0
    command = build_plan(load_spec(spec)).services[0].command
    assert command[0] == f"/models/{MODEL}@main"
    again = run_kit("pull", spec)
    assert "0 file(s) fetched, 9 kept" in again.output and "0 B downloaded" in again.output


def test_an_interrupted_pull_resumes(tmp_path: Path, hub: HubStandin) -> None:
    """Killed mid-shard past half-way: the re-run asks for the rest with a Range request.
    huggingface_hub writes a response in pieces of megabytes, so the shards are 12 MB and the
    stand-in's storage host sends 2 MB/s: the kill lands inside the second shard."""
    hub.add(BIG, small_model(12 << 20))
    spec = pinned_spec(tmp_path, model=BIG)
    assert run_kit("lock", spec).exit_code == 0
    files = resolve(BIG, "main").files
    total, shard = sum(f.size for f in files), max(f.size for f in files)
    hub.bytes_per_second = 2 << 20
    staging = tmp_path / "models" / "acme" / ".big@main.partial"
    process = kit_process("pull", spec, env={"HF_ENDPOINT": hub.endpoint})
    deadline = time.monotonic() + 120
    done, partial = 0, 0
    while not (0 < partial < shard and done >= total // 2) and time.monotonic() < deadline \
            and process.poll() is None:
        time.sleep(0.01)
        sizes = [p.stat().st_size for p in (staging / ".kit-partial").rglob("*") if p.is_file()]
        partial = max(sizes or [0])
        done = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
    process.send_signal(signal.SIGKILL)  # a crash or a lost session, mid-file
    _, stderr = process.communicate()
    assert 0 < partial < shard and done >= total // 2, \
        f"not caught mid-file ({done} of {total} bytes): {stderr}"
    assert not pulled_folder(tmp_path, model=BIG).exists()  # nothing half-made is served
    kept = max(p.stat().st_size for p in (staging / ".kit-partial").rglob("*") if p.is_file())
    assert 0 < kept < shard  # what the killed process left (it may have written on a little)
    hub.bytes_per_second = None
    hub.requests.clear()
    resumed = run_kit("pull", spec)
    assert resumed.exit_code == 0, resumed.output
    ranges = [r.headers["range"] for r in hub.requests if "range" in r.headers]
    assert ranges == [f"bytes={kept}-"]
    assert run_kit("validate", spec).exit_code == 0
    print(f"interrupted at {done} of {total} bytes ({100 * done / total:.0f} %, {partial} "
          f"bytes of a shard); the re-run asked for {ranges[0]}")


def test_a_damaged_folder_is_repaired_file_by_file(tmp_path: Path, hub: HubStandin,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = locked_and_pulled(tmp_path)
    folder = pulled_folder(tmp_path)
    (folder / SHARD1).write_bytes(b"garbage")
    (folder / "stale.safetensors").write_bytes(b"old")
    assert run_kit("validate", spec).exit_code == 2
    monkeypatch.chdir(spec.parent)
    repaired = run_kit("pull", "tiny")  # SERVICE alone: the spec is ./site.yaml
    assert repaired.exit_code == 0, repaired.output
    assert "1 file(s) fetched, 8 kept, removed 1 extra" in repaired.output
    assert run_kit("validate", spec).exit_code == 0


def test_a_repair_reads_again_only_the_file_that_changed(tmp_path: Path, hub: HubStandin,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """kit pull here runs the fetcher's own staging, resume, check and rename (the remote pull's
    code): the folder goes to staging with its hash-cache entries, so of the 9 files only the
    damaged one is read, once, by the check that found it (before, kit pull's copy of those
    mechanics read all 9 again under the staging path)."""
    spec = locked_and_pulled(tmp_path)
    damaged = pulled_folder(tmp_path) / SHARD1
    damaged.write_bytes(b"x" * damaged.stat().st_size)  # the same size: only its hash tells
    reads: list[str] = []
    real = weights_hashes.file_sha256
    monkeypatch.setattr(weights_hashes, "file_sha256",
                        lambda path: reads.append(Path(path).name) or real(path))
    repaired = run_kit("pull", spec)
    assert repaired.exit_code == 0, repaired.output
    assert "1 file(s) fetched, 8 kept" in repaired.output
    assert reads == [SHARD1]


def test_the_fetchers_refusals_in_kit_pulls_words(tmp_path: Path, hub: HubStandin) -> None:
    """What the fetcher refuses (run in process) is said as kit pull always said it: a file
    the Hub serves with another sha256 than site.lock's, a folder and its staging both there."""
    spec = locked_and_pulled(tmp_path)
    folder = pulled_folder(tmp_path)
    (folder / SHARD1).write_bytes(b"garbage")
    staging = folder.with_name(f".{folder.name}.partial")
    staging.mkdir()
    both = run_kit("pull", spec)
    assert both.exit_code == 1, both.output
    assert f"both {folder} and {staging} exist" in both.output
    assert f"rm -r {staging}" in both.output
    staging.rmdir()
    lock_path = spec.parent / "site.lock"
    locked = read_lock(lock_path)[f"{MODEL}@main"]
    served = {f.path: f.sha256 for f in locked.files}[SHARD1]
    other = hashlib.sha256(b"another shard").hexdigest()
    write_lock(lock_path, [replace(locked, files=tuple(
        replace(f, sha256=other) if f.path == SHARD1 else f for f in locked.files))])
    mismatch = run_kit("pull", spec)
    assert mismatch.exit_code == 1, mismatch.output
    assert (f"{MODEL}@main: the Hub served {SHARD1} with sha256 {served[:12]}…, the lock file "
            f"says {other[:12]}…") in mismatch.output
    assert not folder.exists()  # nothing half-made where vLLM reads


def test_refusals(tmp_path: Path, hub: HubStandin) -> None:
    spec = pinned_spec(tmp_path)
    unlocked = run_kit("pull", spec)
    assert unlocked.exit_code == 2 and "has no entry for acme/tiny@main" in unlocked.output
    assert run_kit("lock", spec).exit_code == 0
    wrong = run_kit("pull", spec, "nope")
    assert wrong.exit_code == 2 and "no service 'nope'" in wrong.output
    online = spec.read_text()
    spec.write_text(online + "offline: true\n")
    offline = run_kit("pull", spec)
    assert offline.exit_code == 2, offline.output
    assert "offline: true: kit pull would download from the Hub" in offline.output
    assert not (tmp_path / "models" / "acme").exists()


def test_a_revision_on_a_local_folder_is_a_spec_error(tmp_path: Path) -> None:
    spec = pinned_spec(tmp_path, model="tiny")
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and "revision pins a Hugging Face id" in result.output
    spec = pinned_spec(tmp_path, model=f"{MODEL}@main")
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and "pin its revision with the service's `revision:`" in \
        result.output
    spec = pinned_spec(tmp_path, revision="refs/pr/1")
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and "services[0].revision" in result.output


def test_fleet_pull_pulls_each_servers_own_models(tmp_path: Path, hub: HubStandin) -> None:
    """`kit fleet DIR pull`: each server's `kit pull` (a process per server, at most
    FLEET_PARALLEL at once), one row each; a server that cannot pull is named, the others
    pulled."""
    fleet = tmp_path / "fleet"
    for server in ("gpu1", "gpu2", "gpu3"):
        spec = pinned_spec(tmp_path / server)
        assert run_kit("lock", spec).exit_code == 0
        (fleet / server).mkdir(parents=True)
        (fleet / server / "site.lock").write_bytes((spec.parent / "site.lock").read_bytes())
        (fleet / server / "site.yaml").write_text(  # one stack per server: its own name
            spec.read_text().replace("site: pin01", f"site: pin{server}"))
    broken = fleet / "gpu3" / "site.yaml"
    broken.write_text(broken.read_text() + "offline: true\n")
    result = run_kit("fleet", fleet, "pull")
    assert result.exit_code == 1, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()
            if line.startswith("gpu")}
    for server in ("gpu1", "gpu2"):
        assert "verified against the lock file: 9 file(s) fetched" in rows[server]
        assert pulled_folder(tmp_path / server).is_dir()
    assert "FAILED (exit 2)" in rows["gpu3"] and "offline: true" in rows["gpu3"]
    assert not pulled_folder(tmp_path / "gpu3").exists()
    assert "1 of 3 server(s) failed: gpu3" in result.output
