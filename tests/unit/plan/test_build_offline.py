"""`offline: true` (docs/offline.md): an air-gapped server where nothing kit starts reaches the
Internet. vLLM gets HF_HUB_OFFLINE and no usage statistics, its network no egress even for a Hub
id (served from hf_cache), no public ACME CA, no image pull; each refused with the fix."""

from pathlib import Path

import pytest
import yaml

from kit.errors import KitError
from kit.site import Site
from kit.stack.up import up_site
from tests.support.cli import run_kit
from tests.support.fake_engine import engine_with_images
from tests.support.sites import tree, write_site

HUB_MODEL = "org/chat-model"


def offline_site(root: Path, extra: str = "", beta_model: str = "qwen") -> Path:
    """The two-service unit site, offline, beta's model given as `beta_model`."""
    spec = write_site(root)
    text = spec.read_text().replace("services:\n", f"offline: true\n{extra}services:\n")
    spec.write_text(text.replace("    model: qwen\n    gpus: [1, 2]",
                                 f"    model: {beta_model}\n    gpus: [1, 2]"))
    return spec


def test_every_vllm_gets_the_offline_env_and_no_egress_even_for_a_hub_id(tmp_path: Path) -> None:
    spec = offline_site(tmp_path, beta_model=HUB_MODEL)
    result = run_kit("render", str(spec))
    assert result.exit_code == 0, result.output
    assert "DOWNLOAD" not in result.output  # nothing downloads: vLLM reads hf_cache
    assert f"OFFLINE: services[1] (beta) model '{HUB_MODEL}' is a Hub id" in result.output
    compose = yaml.safe_load((spec.parent / "compose" / "docker-compose.yml").read_text())
    for name in ("alpha", "beta"):
        env = (spec.parent / "compose" / f"{name}.env").read_text().splitlines()
        assert {'HF_HUB_OFFLINE="1"', 'VLLM_NO_USAGE_STATS="1"'} <= set(env), env
    assert compose["networks"]["backend-beta"]["internal"] is True


def test_online_the_hub_id_opens_the_backend_network(tmp_path: Path) -> None:
    """The same site without `offline`: as before (the contrast the test above relies on)."""
    spec = offline_site(tmp_path, beta_model=HUB_MODEL)
    spec.write_text(spec.read_text().replace("offline: true\n", ""))
    assert run_kit("render", str(spec)).exit_code == 0
    compose = yaml.safe_load((spec.parent / "compose" / "docker-compose.yml").read_text())
    assert compose["networks"]["backend-beta"]["internal"] is False
    assert compose["networks"]["backend"]["internal"] is True  # kit's own parts: never out
    assert "HF_HUB_OFFLINE" not in (spec.parent / "compose" / "beta.env").read_text()


@pytest.mark.parametrize(("extra", "where", "says"), [
    ("tls: {mode: acme, email: ops@example.com}\n", "tls.mode",
     "tls.mode acme asks Let's Encrypt for certificates over the Internet"),
])
def test_what_would_reach_the_internet_is_refused(tmp_path: Path, extra: str, where: str,
                                                  says: str) -> None:
    spec = offline_site(tmp_path, extra)
    before = tree(tmp_path)
    for command in ("validate", "render"):
        result = run_kit(command, str(spec))
        assert result.exit_code == 2, result.output
        assert where in result.output and says in result.output, result.output
    assert tree(tmp_path) == before


def test_a_service_env_cannot_undo_offline(tmp_path: Path) -> None:
    spec = offline_site(tmp_path)
    spec.write_text(spec.read_text().replace('env: {STANDIN_LOAD_SECONDS: "2"}',
                                             'env: {HF_HUB_OFFLINE: "0"}'))
    result = run_kit("validate", str(spec))
    assert result.exit_code == 2, result.output
    assert "services[0].env.HF_HUB_OFFLINE" in result.output
    assert "offline: true sets HF_HUB_OFFLINE=1 for vLLM; '0' would let it reach" in result.output


def test_a_private_acme_ca_is_allowed_offline(tmp_path: Path) -> None:
    spec = offline_site(tmp_path, "tls: {mode: acme, email: ops@example.com, "
                                  "acme_server: 'https://ca.internal:9000/acme/acme/directory'}\n")
    result = run_kit("validate", str(spec))
    assert result.exit_code == 0, result.output


def test_a_hub_id_must_be_in_a_host_hf_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    spec = offline_site(tmp_path, f"hf_cache: {cache}\n", beta_model=HUB_MODEL)
    result = run_kit("validate", str(spec))
    assert result.exit_code == 2, result.output
    assert "services[1].model" in result.output
    assert f"{HUB_MODEL!r} is neither a folder under" in result.output
    assert "models--org--chat-model" in result.output
    snapshot = cache / "hub" / "models--org--chat-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    result = run_kit("validate", str(spec))
    assert result.exit_code == 0, result.output


def test_kit_up_pulls_nothing_offline(tmp_path: Path) -> None:
    site = Site.load(offline_site(tmp_path))
    engine = engine_with_images()
    missing = site.spec.images.vllm
    del engine.images[missing]
    with pytest.raises(KitError) as refused:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    assert f"offline: true, and the engine lacks {missing}" in refused.value.message
    assert f"docker save {missing} > images.tar" in str(refused.value.fix)
    assert not [call for call in engine.calls if call[0] in ("pull", "create_container")]


def test_no_container_of_an_offline_site_pulls_its_image(tmp_path: Path) -> None:
    """compose: `pull_policy: never` on every service (a hand-run `docker compose up` fails
    on a missing image instead of asking a registry), accepted by both compose versions;
    `kit export k8s`: imagePullPolicy IfNotPresent on every container; online: neither."""
    import subprocess

    from tests.support.compose import compose_binaries, pod_containers

    spec = offline_site(tmp_path)
    assert run_kit("render", str(spec)).exit_code == 0
    compose_file = spec.parent / "compose" / "docker-compose.yml"
    services = yaml.safe_load(compose_file.read_text())["services"]
    assert {name: s.get("pull_policy") for name, s in services.items()} == dict.fromkeys(
        services, "never")
    for binary in compose_binaries():
        checked = subprocess.run([*binary, "-f", str(compose_file), "config", "-q"],
                                 capture_output=True, text=True)
        assert checked.returncode == 0, (binary, checked.stderr)
    out = tmp_path / "k8s"
    assert run_kit("export", "k8s", str(spec), "--out", str(out)).exit_code == 0
    containers = [c for path in sorted(out.glob("*.yaml"))
                  for document in yaml.safe_load_all(path.read_text()) if document
                  for c in pod_containers(document)]
    assert containers and {c["imagePullPolicy"] for c in containers} == {"IfNotPresent"}
    spec.write_text(spec.read_text().replace("offline: true\n", ""))
    assert run_kit("render", str(spec)).exit_code == 0
    assert "pull_policy" not in compose_file.read_text()

