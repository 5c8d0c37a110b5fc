"""`kit lock`, `kit pull`, then `kit up` serving the pulled model: the Hub stand-in
(tests/support/hub_standin.py, on loopback, through HF_ENDPOINT) serves a small model at a
commit; the vLLM stand-in is started on the pulled folder (never a Hub id), and the gate
passes through the front door. Then a flipped byte: `kit up` refuses before touching the
running stack."""

from pathlib import Path

import pytest

from tests.support.docker_engine import remove_project
from tests.support.hub_standin import HubStandin, small_model
from tests.support.live_stack import SERVICE, LiveSite, checked, kit
from tests.support.pinned_site import MODEL, PINNED_SPEC

pytestmark = pytest.mark.e2e


def test_pull_then_up_serves_the_pulled_model(tmp_path: Path, docker_client, test_images,
                                              free_port) -> None:
    hub = HubStandin()
    commit = hub.add(MODEL, small_model(1 << 20))
    hub.start()
    env = {"HF_ENDPOINT": hub.endpoint}
    root = tmp_path / "site"
    root.mkdir()
    spec = root / "site.yaml"
    spec.write_text(PINNED_SPEC.format(models=root / "models", model=MODEL, revision=commit))
    (root / "models").mkdir()
    site = None
    try:
        checked(kit("lock", str(spec), env=env))
        pulled = checked(kit("pull", str(spec), env=env))
        assert "verified against the lock file: 9 file(s) fetched" in pulled.stdout
        site = LiveSite.create(root, docker_client, free_port(), free_port(), overrides={
            SERVICE: {"model": MODEL, "revision": commit}})
        site.up()  # the gate: TLS, auth, models, a streamed completion through the door
        container = site.container(SERVICE)
        assert container.attrs["Config"]["Cmd"][0] == f"/models/{MODEL}@{commit}"
        shard = root / "models" / f"{MODEL}@{commit}" / "model-00002-of-00002.safetensors"
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))
        refused = kit("up", str(spec))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "model-00002-of-00002.safetensors has sha256" in refused.stderr
        assert container.id == site.container(SERVICE).id  # the running stack untouched
    finally:
        hub.stop()
        if site is not None:
            remove_project(docker_client, site.name)
