"""An air-gapped server brought up from one bundle: `kit bundle` on the connected machine (the
stand-in's images from this engine, the pinned model verified against site.lock), then on a
second host — its own network namespace and engine, whose only link leads to the operator's end
of a veth pair — `kit load` and `kit up` with `offline: true`, the gate passing through the
front door. Every frame the server sends over its one link is recorded
(tests/support/egress.py): none may leave while it loads and serves.

kit's own wheels (which need the package index to gather) are installed from a bundle with no
network in their own test."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.egress import EgressRecorder, attempt, seal
from tests.support.live_stack import SERVICE, LiveSite, checked, kit, write_spec
from tests.support.pinned_site import MODEL, pinned_on_disk
from tests.support.remote_host import LOCAL_IP, host_namespace
from tests.support.sites import REPO

pytestmark = pytest.mark.e2e


def in_namespace(namespace: str, *argv: str, env: dict[str, str],
                 timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", f"--net=/run/netns/{namespace}", *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"),
                               **env})


def test_bundle_load_and_serve_offline_with_no_outbound_attempt(
        tmp_path: Path, docker_client, test_images, free_port) -> None:
    connected = tmp_path / "connected"
    pinned_on_disk(connected / "models", connected)
    site = LiveSite.create(connected, docker_client, free_port(), free_port(),
                           overrides={SERVICE: {"model": MODEL, "revision": "main"}})
    spec = yaml.safe_load(site.spec_path.read_text())
    write_spec(site.spec_path, {**spec, "offline": True})
    bundle = tmp_path / "site-bundle.tar"
    started = time.monotonic()
    made = checked(kit("bundle", str(site.spec_path), "--out", str(bundle), "--without-kit",
                       timeout=600))
    manifest_sha = made.stdout.split("manifest sha256 ")[1].split()[0]
    timings = {"bundle": time.monotonic() - started}

    # the server's folder: the same spec (its credentials made there), its own empty
    # models_root; no site.lock yet
    server = tmp_path / "server"
    (server / "models").mkdir(parents=True)
    write_spec(server / "site.yaml", {**spec, "offline": True,
                                      "models_root": str(server / "models")})
    with host_namespace(images=[]) as host:
        seal(host.namespace, LOCAL_IP)
        recorder = EgressRecorder(host.veth)
        try:
            server_env = {"DOCKER_HOST": f"unix://{host.socket}", "PYTHONPATH": str(REPO)}
            offline_kit = [sys.executable, "-m", "kit"]
            started = time.monotonic()
            loaded = in_namespace(host.namespace, *offline_kit, "load", str(bundle),
                                  str(server / "site.yaml"), "--manifest-sha256", manifest_sha,
                                  env=server_env)
            assert loaded.returncode == 0, loaded.stdout + loaded.stderr
            assert f"placed {MODEL}@main (verified against site.lock)" in loaded.stdout
            timings["load"] = time.monotonic() - started
            started = time.monotonic()
            up = in_namespace(host.namespace, *offline_kit, "up", str(server / "site.yaml"),
                              env=server_env, timeout=600)
            assert up.returncode == 0, up.stdout + up.stderr
            assert "all checks passed" in up.stdout
            timings["up"] = time.monotonic() - started
            quiet = list(recorder.frames)
            attempt(host.namespace)  # the positive control: one attempt is seen
        finally:
            recorder.close()
        assert quiet == [], f"the air-gapped server sent: {quiet}"
        assert recorder.frames, "the recorder saw no frame of a deliberate connection attempt"
        print(f"bundle of {bundle.stat().st_size / 1e6:.0f} MB; " + ", ".join(
            f"{verb} {seconds:.1f} s" for verb, seconds in timings.items()) +
            f"; frames sent while loading and serving: {len(quiet)}; by one deliberate "
            f"attempt: {len(recorder.frames)} ({', '.join(recorder.frames[:3])})")
        vllm = [c for c in host.client.containers.list()
                if c.labels.get("com.docker.compose.service") == SERVICE]
        assert vllm, [c.name for c in host.client.containers.list()]
        env = vllm[0].attrs["Config"]["Env"]
        assert "HF_HUB_OFFLINE=1" in env and "VLLM_NO_USAGE_STATS=1" in env
        assert vllm[0].attrs["Config"]["Cmd"][0] == f"/models/{MODEL}@main"
