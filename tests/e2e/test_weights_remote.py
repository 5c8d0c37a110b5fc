"""`kit pull` through a remote engine, for real: the second host (tests/support/remote_host.py:
its own network namespace, dockerd and sshd, reached over ssh:// only) downloads the model
itself from the Hub stand-in, which listens on this namespace's end of the veth pair (the only
route the second host has), in a throwaway container of the vLLM stand-in image (which carries
huggingface_hub as vLLM's image does) running kit's fetcher.

One walk through: no route to the Hub and a full disk are named; a pull stopped with Ctrl-C at
about half-way leaves no container and resumes (the bytes not sent twice, counted by the Hub
stand-in) and verifies; the token sits only in a 0400 file of the container, never in its
`docker inspect` environment; `kit fleet DIR pull` with this machine's engine and the remote one
is green; then `kit up` there serves the pulled folder through its front door. The server's
hash cache (the site's volume there): after the pull, `kit up`'s check there reads no file;
without the cache (`kit down --volumes`) it reads every file, with it (`kit down`, `kit up`)
none, timed (the fetcher's own time there and the whole check's); a byte flipped with the
mtime set back (`touch -d`) is read again (the ctime moved) and refused, naming the file.
"""

from __future__ import annotations

import io
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.supply.remote_pull import helper_name
from kit.weights.lock import read_lock
from tests.support.hub_standin import HubStandin, small_model
from tests.support.live_stack import SERVICE, LiveSite, checked, kit, write_spec
from tests.support.pinned_site import MODEL, hashed_on_server, kit_process
from tests.support.remote_host import LOCAL_IP, REMOTE_IP, RemoteHost, operated_host

pytestmark = pytest.mark.e2e

HTTPS_PORT, HTTP_PORT = 8443, 8080
SECRET = "hf_e2eRemotePullSecret42"
# The client writes a response in 10 MiB pieces: with 12 MiB shards the first piece is 42 % of
# the model, and at 1 MiB/s the rest of that shard takes 2 s, time for Ctrl-C to land mid-file.
SHARD_BYTES = 12 << 20
PIECE = 10 << 20  # huggingface_hub's DOWNLOAD_CHUNK_SIZE (a write may be seen half-done)
SLOW = 1 << 20
NO_ROUTE = "http://192.0.2.1:8080"  # TEST-NET-1: the second host has no route to it
HASHES = "rpull1_kit-weights-hashes"  # the site's hash cache volume on the second host


@pytest.fixture(scope="module")
def remote(tmp_path_factory, docker_client, test_images) -> Iterator[RemoteHost]:
    with operated_host(tmp_path_factory.mktemp("remote"), docker_client, test_images) as host:
        yield host


@pytest.fixture(scope="module")
def hub() -> Iterator[HubStandin]:
    """The Hub and its storage host on this namespace's address, the one the second host
    routes to; the model at a commit; a token required."""
    standin = HubStandin(token=SECRET)
    standin.commit = standin.add(MODEL, small_model(SHARD_BYTES))  # type: ignore[attr-defined]
    standin.start(LOCAL_IP, LOCAL_IP)
    yield standin
    standin.stop()


def pinned_site(root: Path, name: str, commit: str, models: Path, engine: str | None) -> Path:
    root.mkdir(parents=True)
    models.mkdir(parents=True, exist_ok=True)
    spec = {"site": name, "domain": REMOTE_IP if engine else "llm.test",
            "models_root": str(models), "healthcheck_interval": 1, "auth": {"users": ["ops"]},
            "proxy": {"bind": "0.0.0.0", "https_port": HTTPS_PORT, "http_port": HTTP_PORT},
            "services": [{"name": SERVICE, "model": MODEL, "revision": commit, "gpus": [0],
                          "max_model_len": 4096, "env": {"STANDIN_LOAD_SECONDS": "1"}}]}
    if engine:
        spec["engine"] = engine
    write_spec(root / "site.yaml", spec)
    return root / "site.yaml"


def pulling(spec: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return kit("pull", str(spec), env=env)


def helpers_left(remote: RemoteHost) -> list[str]:
    return [c.name for c in remote.client.containers.list(all=True) if c.name.endswith("kit-pull")]


def test_the_remote_host_pulls_resumes_verifies_and_serves(
        tmp_path: Path, remote: RemoteHost, hub: HubStandin, docker_client) -> None:
    commit = hub.commit  # type: ignore[attr-defined]
    env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": SECRET, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    models = remote.root / "models"
    spec = pinned_site(tmp_path / "remote-site", "rpull1", commit, models, remote.url)
    checked(kit("lock", str(spec), env=env))  # the lock: metadata and small files, reviewed here
    locked = read_lock(spec.parent / "site.lock")[f"{MODEL}@{commit}"]
    total = locked.total_bytes
    folder = models / f"{MODEL}@{commit}"
    staging = models / "acme" / f".tiny@{commit}.partial"

    # no route from the server to the Hub: named, exit 1, nothing left behind
    unrouted = pulling(spec, {**env, "HF_ENDPOINT": NO_ROUTE})
    assert unrouted.returncode == 1, unrouted.stderr
    assert f"cannot reach {NO_ROUTE} on the engine's host {remote.url}" in unrouted.stderr
    assert helpers_left(remote) == []

    # a full disk on the server: named with the folder, exit 1
    small = remote.root / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        full_spec = pinned_site(tmp_path / "full-site", "rpull2", commit, small, remote.url)
        (full_spec.parent / "site.lock").write_bytes((spec.parent / "site.lock").read_bytes())
        full = pulling(full_spec, env)
        assert full.returncode == 1, full.stderr
        assert f"models_root {small} on the engine's host {remote.url} is full" in full.stderr
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert helpers_left(remote) == []

    # Ctrl-C at about half-way; meanwhile the running container is inspected
    hub.bytes_per_second = SLOW
    process = kit_process("pull", spec, env=env)
    deadline = time.monotonic() + 120
    env_seen, token_mode = None, None
    while _size(staging / ".kit-partial") < PIECE and time.monotonic() < deadline \
            and process.poll() is None:
        if env_seen is None and helper_name("rpull1") in helpers_left(remote):
            container = remote.client.containers.get(helper_name("rpull1"))
            env_seen = container.attrs["Config"]["Env"]
            stream, _ = container.get_archive("/kit-pull/token")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.getmember("token")
                token_mode = (member.mode & 0o7777, member.uid, member.gid)
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0, stderr
    kept, partial = _size(staging), _size(staging / ".kit-partial")
    assert partial > 0, f"Ctrl-C did not land mid-file: {stderr}"
    assert 0.4 * total <= kept < 0.6 * total, f"stopped at {kept} of {total}: {stderr}"
    assert not folder.exists() and helpers_left(remote) == []  # Ctrl-C removed the container
    assert env_seen is not None and not any(SECRET in item for item in env_seen), env_seen
    assert f"HF_ENDPOINT={hub.endpoint}" in env_seen
    assert token_mode == (0o400, 0, 0)

    # the re-run resumes: only the missing bytes cross the network, then everything is checked
    hub.bytes_per_second = None
    hub.requests.clear()
    hub.served_bytes = 0
    resumed = checked(pulling(spec, env))
    ranges = [r.headers["range"] for r in hub.requests if "range" in r.headers]
    assert ranges == [f"bytes={partial}-"], ranges
    assert hub.served_bytes == total - kept
    assert f"{MODEL}@{commit}: {folder} verified against the lock file" in resumed.stdout
    assert "(100 %)" in resumed.stderr and "/s, ETA" in resumed.stderr
    assert helpers_left(remote) == []
    assert not _holds(tmp_path, SECRET) and not _holds(models, SECRET)
    print(f"interrupted at {kept} of {total} bytes ({100 * kept / total:.0f} %); the re-run "
          f"asked for {ranges[0]} and was sent {hub.served_bytes} bytes "
          f"({100 * hub.served_bytes / total:.0f} %): {resumed.stdout.strip()}")

    # a fleet: this machine's engine and the remote one, each pulling its own
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "gpu-remote").symlink_to(spec.parent)
    local_models = tmp_path / "local-models"
    local = pinned_site(fleet / "gpu-local", "rpull3", commit, local_models, None)
    (local.parent / "site.lock").write_bytes((spec.parent / "site.lock").read_bytes())
    both = kit("fleet", str(fleet), "pull", env=env)
    assert both.returncode == 0, both.stdout + both.stderr
    rows = {line.split()[0]: line for line in both.stdout.splitlines()
            if line.startswith("gpu-")}
    assert "verified against the lock file: 0 file(s) fetched, 9 kept" in rows["gpu-remote"]
    assert "verified against the lock file: 9 file(s) fetched" in rows["gpu-local"]
    assert (local_models / f"{MODEL}@{commit}").is_dir()
    print(both.stdout)

    # kit up there serves the pulled folder through its front door
    site = LiveSite(spec.parent, "rpull1", remote.client, HTTPS_PORT)
    output = checked(site.kit("render")).stdout
    site.passwords = {"ops": output.split("password for ops: ")[1].split()[0]}
    try:
        up = checked(site.kit("up")).stdout
        assert "all checks passed" in up, up
        assert hashed_on_server(up) == (0, 0, 9), up  # the pulls left their hashes there
        served = remote.client.containers.get(f"rpull1-{SERVICE}-1")
        assert served.attrs["Config"]["Cmd"][0] == f"/models/{MODEL}@{commit}"
        assert HASHES not in {m.get("Name") for m in served.attrs["Mounts"]}  # kit's alone
        assert site.status(credentials=site.basic("ops")) == 200
        # the check's cost without the server's cache (kit down --volumes removes it), then
        # with it
        checked(site.kit("down", "--volumes"))
        assert HASHES not in {v.name for v in remote.client.volumes.list()}
        cold = checked(site.kit("up")).stdout
        assert hashed_on_server(cold) == (9, total, 0), cold
        checked(site.kit("down"))
        cached = checked(site.kit("up")).stdout
        assert hashed_on_server(cached) == (0, 0, 9), cached
        print(f"cold: {_check_line(cold)}\ncached: {_check_line(cached)}")
        # a flipped byte there, the mtime set back with touch -d: the ctime moved, so the file
        # is read again and the next start is refused on that host's evidence, by name
        checked(site.kit("down"))
        shard = folder / "model-00002-of-00002.safetensors"
        before = shard.stat()
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))
        stamp = f"@{before.st_mtime_ns // 10**9}.{before.st_mtime_ns % 10**9:09d}"
        subprocess.run(["touch", "-m", "-d", stamp, str(shard)], check=True)
        assert (shard.stat().st_size, shard.stat().st_mtime_ns) == (
            before.st_size, before.st_mtime_ns)
        refused = site.kit("up")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"service {SERVICE}: {shard} has sha256" in refused.stderr, refused.stderr
        assert hashed_on_server(refused.stdout) == (1, before.st_size, 8), refused.stdout
        assert f"rpull1-{SERVICE}-1" not in {c.name for c in remote.client.containers.list()}
        print(_check_line(refused.stdout))
    finally:
        site.kit("down")


def _check_line(output: str) -> str:
    return next(line for line in output.splitlines() if " checked on " in line)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _holds(folder: Path, text: str) -> bool:
    return any(text.encode() in p.read_bytes() for p in folder.rglob("*")
               if p.is_file() and not p.is_symlink())

