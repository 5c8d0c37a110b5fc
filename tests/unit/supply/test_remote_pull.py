"""`kit pull` through a remote engine, without Docker: the fake engine (tests/support/
fake_engine.py) runs the helper's argv on this host with the bind and the copied-in files
rebased, so kit's own fetcher (kit/dataplane/fetcher/weights_fetch.py) really downloads from the Hub
stand-in. What kit asks of the engine is checked: the vLLM image, the server's own network,
models_root writable at /models, the token only in a 0400 file, the container removed
whatever happens; and each failure is named with the local pull's exit codes. `kit up`
through a remote engine checks a pinned folder there with the same fetcher."""

import errno
import hashlib
import io
import json
import os
import threading
import time
from importlib import import_module
from pathlib import Path

import pytest

from kit.errors import BadInput
from kit.site import Site
from kit.stack.down import down_site
from kit.supply.remote_pull import _Events, _failure, check_pinned_remote, helper_name
from kit.supply.remote_pull import token as hub_token
from kit.weights.lock import LockedFile, LockedModel, read_lock, write_lock
from kit.weights.verify import HashCache
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine, engine_with_images
from tests.support.fake_stack import REMOTE_ENGINE, up
from tests.support.hub_standin import HubStandin, small_model
from tests.support.pinned_site import (
    MODEL,
    hashed_on_server,
    pinned_on_disk,
    pinned_spec,
    pulled_folder,
)

IMAGE = "vllm/vllm-openai:v0.33.0"
HELPER = helper_name("pin01")
HASHES = "pin01_kit-weights-hashes"  # the site's hash cache volume on the server
BIG = "acme/big"
SECRET = "hf_remotePullSecret123"
SHARD_BYTES = 21 << 19  # 10.5 MiB
PIECE = 10 << 20  # what the client writes at once (huggingface_hub's DOWNLOAD_CHUNK_SIZE)


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """A remote engine `kit pull` connects to, its helpers run here."""
    engine = FakeEngine({IMAGE: "sha256:vllm"}, local=False)
    engine.run_helpers = True
    monkeypatch.setattr("kit.supply.pull.connect", lambda url: engine)
    return engine


def remote_spec(root: Path, model: str = MODEL) -> Path:
    spec = pinned_spec(root, model=model)
    assert run_kit("lock", spec).exit_code == 0
    spec.write_text(spec.read_text() + "engine: ssh://ops@gpu1.example\n")
    return spec


def test_the_server_downloads_verifies_and_the_helper_is_gone(
        tmp_path: Path, hub: HubStandin, remote: FakeEngine,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = remote_spec(tmp_path)
    hub.token = SECRET
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.requests.clear()
    pulled = run_kit("pull", spec)
    assert pulled.exit_code == 0, pulled.output
    folder = pulled_folder(tmp_path)
    assert f"{MODEL}@main: {folder} verified against the lock file: 9 file(s) fetched, 0 kept" \
        in pulled.output
    assert "(100 %)" in pulled.output and "/s, ETA" in pulled.output  # the same progress line
    assert run_kit("validate", _local(spec)).exit_code == 0  # the folder matches the lock
    argv, binds, host_network = _started(remote)
    assert argv == ["python3", "/kit-pull/weights_fetch.py", "/kit-pull/job.json", "/models",
                    "/kit-hashes/weights-hashes.json"]
    assert host_network  # the server's own network: its route to the Hub, not this machine's
    assert [(b.type, b.source, b.target, b.read_only) for b in binds] == [
        ("bind", str(tmp_path / "models"), "/models", False),
        ("volume", HASHES, "/kit-hashes", False)]
    files = remote.helper_files[HELPER]
    assert files["kit-pull/weights_hashes.py"][0] == 0o444  # the cache's rules, beside it
    assert files["kit-pull/token"] == (0o400, SECRET.encode())
    job = json.loads(files["kit-pull/job.json"][1])
    assert job["folder"] == f"{MODEL}@main" and job["staging"] == "acme/.tiny@main.partial"
    assert SECRET not in json.dumps([job, remote.helper_env[HELPER], argv])
    assert remote.helper_env[HELPER]["HF_ENDPOINT"] == hub.endpoint
    assert remote.helpers == {} and remote.calls[-1] == ("remove", HELPER)
    # the token reached the Hub (it answers 401 without it), never the storage host
    assert any(r.headers.get("authorization") == f"Bearer {SECRET}" for r in hub.requests)
    assert not any("authorization" in r.headers for r in hub.requests
                   if r.host == hub.storage_url.split("//")[1])
    again = run_kit("pull", spec)
    assert "0 file(s) fetched, 9 kept" in again.output and "0 B downloaded" in again.output


def _local(spec: Path) -> Path:
    """The same site with its engine local, so `kit validate` checks the folder here."""
    local = spec.with_name("local.yaml")
    local.write_text(spec.read_text().replace("engine: ssh://ops@gpu1.example\n", ""))
    return local


def _started(engine: FakeEngine) -> tuple:
    starts = [about for method, about in engine.calls if method == "helper_start"]
    assert starts and set(starts) == {HELPER}
    return engine.last_helper[HELPER]


def test_an_interrupted_remote_pull_resumes_with_a_range(tmp_path: Path, hub: HubStandin,
                                                        remote: FakeEngine) -> None:
    """Stopped mid-shard near half-way (the container removed, as Ctrl-C does): the partial
    bytes stay on the server and the re-run asks the Hub for the rest only. The client writes
    a response in 10 MiB pieces, so the shards are 10.5 MiB: the first piece is 48 %."""
    hub.add(BIG, small_model(SHARD_BYTES))
    spec = remote_spec(tmp_path, BIG)
    total = sum(f.size for f in read_lock(spec.parent / "site.lock")[f"{BIG}@main"].files)
    hub.bytes_per_second = 4 << 20
    staging = tmp_path / "models" / "acme" / ".big@main.partial"
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(run_kit("pull", spec)))
    runner.start()
    deadline = time.monotonic() + 60
    while _bytes(staging / ".kit-partial") < PIECE and time.monotonic() < deadline:
        time.sleep(0.02)
    remote.remove(HELPER)  # what kit's `finally` does on Ctrl-C: the fetcher is killed
    runner.join(30)
    stopped = outcome[0]
    assert stopped.exit_code == 1 and "the fetcher on the engine's host" in stopped.output
    kept = _bytes(staging)
    assert 0.4 * total <= kept < 0.6 * total and not pulled_folder(tmp_path, model=BIG).exists()
    hub.bytes_per_second = None
    hub.requests.clear()
    hub.served_bytes = 0
    resumed = run_kit("pull", spec)
    assert resumed.exit_code == 0, resumed.output
    ranges = [r.headers["range"] for r in hub.requests if "range" in r.headers]
    assert len(ranges) == 1 and ranges[0].startswith("bytes=")
    assert hub.served_bytes == total - kept  # not one byte fetched twice
    assert run_kit("validate", _local(spec)).exit_code == 0
    print(f"stopped at {kept} of {total} bytes ({100 * kept / total:.0f} %); the re-run asked "
          f"for {ranges[0]} and was sent {hub.served_bytes} bytes")


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_failures_are_named_and_the_helper_removed(tmp_path: Path, hub: HubStandin,
                                                   remote: FakeEngine,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = remote_spec(tmp_path)
    hub.token = SECRET
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    refused = run_kit("pull", spec)
    assert refused.exit_code == 2, refused.output
    assert "refused access on the engine's host ssh://ops@fake-host: HF_TOKEN is wrong" \
        in refused.output, refused.output
    assert "hf_wrong" not in refused.output
    monkeypatch.setenv("HF_TOKEN", SECRET)
    lock_path = spec.parent / "site.lock"
    locked = read_lock(lock_path)[f"{MODEL}@main"]
    shard = max(locked.files, key=lambda f: f.size)
    other = hashlib.sha256(b"another shard").hexdigest()
    write_lock(lock_path, [locked.__class__(locked.model, locked.revision, locked.commit, tuple(
        f.__class__(f.path, f.size, other) if f == shard else f for f in locked.files))])
    mismatch = run_kit("pull", spec)
    assert mismatch.exit_code == 1, mismatch.output
    assert f"{MODEL}@main: {shard.path}: the Hub served sha256" in mismatch.output
    assert "the lock file says " + other[:12] in mismatch.output
    assert not pulled_folder(tmp_path).exists()  # nothing half-made where vLLM reads
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    unreachable = run_kit("pull", spec)
    assert unreachable.exit_code == 1, unreachable.output
    assert "cannot reach http://127.0.0.1:9 on the engine's host" in unreachable.output
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.example/$(reboot)")
    hostile = run_kit("pull", spec)
    assert hostile.exit_code == 2 and "HF_ENDPOINT" in hostile.output
    assert remote.helpers == {} and remote.helper_runs == {}
    assert [m for m, _ in remote.calls].count("helper_start") == 3  # the hostile one never ran


def test_a_bad_token_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_x\nrm -rf /")
    with pytest.raises(Exception, match="HF_TOKEN is not a Hugging Face token") as raised:
        hub_token()
    assert "rm -rf" not in str(raised.value)


def test_disk_full_is_named(tmp_path: Path) -> None:
    """The fetcher names ENOSPC as disk_full; kit says which folder on which host is full."""
    fetcher = import_module("kit.dataplane.fetcher.weights_fetch")
    assert fetcher.kind_of(OSError(errno.ENOSPC, "No space left on device")) == "disk_full"
    events = _Events("acme/tiny@main", io.StringIO())
    events.feed(b'KIT-PULL {"event": "error", "kind": "disk_full", "detail": "OSError: [Errno '
                b'28] No space left on device", "path": ""}\n')
    locked = LockedModel(MODEL, "main", "c" * 40, (LockedFile("a", 2_000_000_000, "0" * 64),))
    error = _failure(events, 3, locked, Path("/srv/models"), "ssh://ops@gpu1", IMAGE, "x")
    assert error.exit_code == 1
    assert error.message.startswith("acme/tiny@main: models_root /srv/models on the engine's "
                                    "host ssh://ops@gpu1 is full")
    assert "needs 2.00 GB" in str(error.fix)


def test_up_through_a_remote_engine_checks_the_pinned_folder_there(tmp_path: Path) -> None:
    """`kit up` runs the fetcher in check mode on the engine's host (no network, read-only):
    a matching folder starts; a flipped byte is refused naming the file, nothing created."""
    spec = pinned_spec(tmp_path)
    pinned_on_disk(tmp_path / "models", spec.parent)
    spec.write_text(spec.read_text() + f"engine: {REMOTE_ENGINE}\n")
    engine = engine_with_images()
    engine.run_helpers = True
    up(Site.load(spec), engine)
    check = helper_name("pin01")
    argv, binds, host_network = engine.last_helper[check]
    assert not host_network and [(b.target, b.read_only) for b in binds] == [
        ("/models", True), ("/kit-hashes", False)]
    assert "kit-pull/token" not in engine.helper_files[check]
    assert json.loads(engine.helper_files[check]["kit-pull/job.json"][1])["check"] is True
    shard = pulled_folder(tmp_path) / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    engine = engine_with_images()
    engine.run_helpers = True
    with pytest.raises(BadInput) as refused:
        up(Site.load(spec), engine)
    assert f"service tiny: {pulled_folder(tmp_path)}/model-00002-of-00002.safetensors has " \
        "sha256" in refused.value.message
    assert "run `kit pull`" in str(refused.value.fix)
    assert [n for n in engine.names() if not n.endswith("kit-pull")] == []  # nothing created


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """One remote engine for kit pull, kit up and kit down, its helpers run here: the hash
    cache volume it keeps outlives each throwaway container."""
    engine = engine_with_images()
    engine.run_helpers = True
    monkeypatch.setattr("kit.supply.pull.connect", lambda url: engine)
    monkeypatch.setattr("kit.stack.down.connect", lambda url: engine)
    return engine


def _recheck(spec: Path, engine: FakeEngine, reported: list[str]) -> tuple[int, int, int]:
    """kit up's check of the pinned folder on the server once more (as after `kit down`):
    (files hashed, their bytes, files the server's cache vouched for)."""
    site = Site.load(spec)
    check_pinned_remote(engine, site, list(site.desired.services), reported.append)
    return hashed_on_server(reported[-1])


def _flip_keeping_mtime(shard: Path) -> None:
    """One byte flipped, the size kept and the mtime set back (`touch -d`): only the ctime
    (and a hash) can tell."""
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_the_servers_hash_cache_spares_a_recheck_and_sees_a_rewritten_file(
        tmp_path: Path, hub: HubStandin, server: FakeEngine) -> None:
    """kit pull on the server leaves the hashes of what it fetched in the site's cache volume
    there, by the rules kit's own check reads; kit up's check then reads no file again, only
    one whose stat changed, and a byte flipped with the mtime set back is read and refused."""
    spec = remote_spec(tmp_path)
    assert run_kit("pull", spec).exit_code == 0
    locked = read_lock(spec.parent / "site.lock")[f"{MODEL}@main"]
    folder = pulled_folder(tmp_path)
    cache_file = server.volume_path(HASHES) / "weights-hashes.json"
    cache = HashCache(cache_file)  # kit.weights.verify's reading of what the fetcher wrote
    assert {f.path: cache.get(folder / f.path, (folder / f.path).stat())
            for f in locked.files} == {f.path: f.sha256 for f in locked.files}
    assert oct(cache_file.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in cache_file.parent.iterdir()] == [cache_file.name]  # no staged file
    reported = up(Site.load(spec), server)
    assert hashed_on_server("\n".join(reported)) == (0, 0, 9)  # the pull's hashes: none read
    touched = folder / "model-00001-of-00002.safetensors"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 1))
    assert _recheck(spec, server, reported) == (1, touched.stat().st_size, 8)
    assert _recheck(spec, server, reported) == (0, 0, 9)
    flipped = folder / "model-00002-of-00002.safetensors"
    time.sleep(0.05)  # a later clock tick than the pull's: the write moves the ctime
    _flip_keeping_mtime(flipped)
    with pytest.raises(BadInput) as refused:
        _recheck(spec, server, reported)
    assert hashed_on_server(reported[-1]) == (1, flipped.stat().st_size, 8)
    assert f"service tiny: {flipped} has sha256" in refused.value.message


def test_a_server_cache_kit_cannot_trust_costs_a_rehash_and_is_kits_alone(
        tmp_path: Path, hub: HubStandin, server: FakeEngine) -> None:
    """A cache that is not JSON, of another version or with entries of the wrong shape is read
    as empty: every file hashed again, the check still right, the cache rewritten whole. The
    volume is the site's (kit down keeps it, --volumes removes it) and no service mounts it."""
    spec = remote_spec(tmp_path)
    assert run_kit("pull", spec).exit_code == 0
    reported = up(Site.load(spec), server)
    cache_file = server.volume_path(HASHES) / "weights-hashes.json"
    good = json.loads(cache_file.read_text())
    total = read_lock(spec.parent / "site.lock")[f"{MODEL}@main"].total_bytes
    wrong_shapes = {path: [*entry[:-1], "Z" * 64] if n % 3 == 0 else
                    entry[1:] if n % 3 == 1 else [str(v) for v in entry]
                    for n, (path, entry) in enumerate(good["files"].items())}
    for broken in (b"{not json", b"[]", json.dumps({**good, "version": 2}).encode(),
                   json.dumps({"version": 1, "files": list(good["files"])}).encode(),
                   json.dumps({"version": 1, "files": wrong_shapes}).encode()):
        cache_file.write_bytes(broken)
        assert _recheck(spec, server, reported) == (9, total, 0), broken
        assert json.loads(cache_file.read_text()) == good  # rewritten whole, as it was
    site = Site.load(spec)
    assert not [m for s in site.desired.services for m in s.config.mounts if m.source == HASHES]
    assert [v["Name"] for v in server.volumes(["com.docker.compose.project=pin01"])
            if v["Name"] == HASHES] == [HASHES]
    down_site(site, False, reported.append)
    assert HASHES in [v["Name"] for v in server.volumes([])]
    down_site(site, True, reported.append)
    assert HASHES not in [v["Name"] for v in server.volumes([])]
