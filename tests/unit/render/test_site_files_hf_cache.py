"""Each service's Hugging Face cache is its own (issue 42, item 3): a replica runs a model's code
(hostile), so nothing one service's container can write is read by another service's — not in
the compose file, not on a worker node, not in the Kubernetes export. The site's `hf_cache`
folder, where kit verifies pinned snapshots, is read-only to every container."""

from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from kit.engine.desired import DesiredState
from kit.plan.build import HF_CACHE_MOUNT, SITE_HF_CACHE_MOUNT, build_plan
from kit.plan.host import load_spec
from kit.render.k8s import CredentialFiles, export
from tests.support.fake_stack import REMOTE_ENGINE, rendered
from tests.support.sites import MULTI_NODE, base_site, write_site

CREDENTIALS = CredentialFiles(htpasswd=b"", keys_map=b"", auth_state=b"", door_policy=b"{}\n",
                          server_crt=b"", server_key=b"")


def _writable_sources(spec: Path, desired: DesiredState) -> dict[str, set[str]]:
    """{mount source any vLLM replica may write: the services whose replicas mount it}."""
    service_of = {replica.host: service.name
                  for service in build_plan(load_spec(spec)).services
                  for replica in service.replicas}
    writers: dict[str, set[str]] = defaultdict(set)
    for container in desired.services:
        service = service_of.get(container.name)
        if service is None:
            continue
        for mount in container.config.mounts:
            if not mount.read_only:
                writers[mount.source].add(service)
    return writers


def _with_host_cache(spec: Path) -> Path:
    cache = spec.parent.parent / "hf"
    cache.mkdir()
    spec.write_text(spec.read_text() + f"hf_cache: {cache}\n")
    return cache


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote-engine"])
@pytest.mark.parametrize("host_cache", [False, True], ids=["volume", "host-folder"])
def test_no_writable_mount_is_shared_between_services(tmp_path: Path, host_cache: bool,
                                                      remote: bool) -> None:
    """Through a remote engine too (kit.engine.remote_files: site folders become volumes; the
    caches stay the server's own volume and path)."""
    spec = write_site(tmp_path)
    cache = _with_host_cache(spec) if host_cache else None
    if remote:
        spec.write_text(spec.read_text() + f"engine: {REMOTE_ENGINE}\n")
    desired = rendered(spec)
    writers = _writable_sources(spec, desired)
    assert set().union(*writers.values()) == {"alpha", "beta"}
    shared = {source: names for source, names in writers.items() if len(names) > 1}
    assert not shared, f"written by several services: {shared}"
    for name in ("alpha", "beta"):
        mounts = {m.target: m for m in desired.service(name).config.mounts}
        own = mounts[HF_CACHE_MOUNT]  # HF_HOME: downloads, transformers' remote code
        assert (own.type, own.source, own.read_only) == ("volume", f"unit01_hf-cache-{name}",
                                                         False)
        if cache is None:
            assert SITE_HF_CACHE_MOUNT not in mounts
        else:  # kit's verified snapshots: read by every service, written by none
            site_cache = mounts[SITE_HF_CACHE_MOUNT]
            assert (site_cache.source, site_cache.read_only) == (str(cache), True)
    assert "unit01_hf-cache" not in {v.name for v in desired.volumes}  # the old shared one


def test_an_offline_site_reads_hub_models_from_the_read_only_cache(tmp_path: Path) -> None:
    spec = write_site(tmp_path)
    _with_host_cache(spec)
    spec.write_text(spec.read_text() + "offline: true\n")
    plan = build_plan(load_spec(spec))
    for service in plan.services:
        assert service.env["HF_HOME"] == HF_CACHE_MOUNT
        assert service.env["HF_HUB_CACHE"] == f"{SITE_HF_CACHE_MOUNT}/hub"


def test_a_worker_node_has_the_services_own_cache(tmp_path: Path) -> None:
    site = base_site(tmp_path)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE)
    rendered(spec)
    worker = yaml.safe_load((site / "compose" / "node-gpu02.yml").read_text())
    [body] = worker["services"].values()
    caches = [m for m in body["volumes"] if m["target"] == HF_CACHE_MOUNT]
    assert caches == [{"type": "volume", "source": "hf-cache-big", "target": HF_CACHE_MOUNT}]
    assert set(worker["volumes"]) == {"hf-cache-big"}


@pytest.mark.parametrize("host_cache", [False, True], ids=["emptydir", "host-folder"])
def test_k8s_pods_share_no_writable_host_folder(tmp_path: Path, host_cache: bool) -> None:
    spec = write_site(tmp_path)
    if host_cache:
        _with_host_cache(spec)
    plan = build_plan(load_spec(spec))
    files = export(plan, CREDENTIALS, namespace="unit", service_type="ClusterIP",
                   spec_name="site.yaml").files
    objects = [o for f in files for o in yaml.safe_load_all(f.content) if o]
    writers: dict[str, set[str]] = defaultdict(set)
    vllm_pods = 0
    for obj in objects:
        if obj["kind"] != "Deployment" or obj["metadata"]["name"] not in ("alpha", "beta"):
            continue
        vllm_pods += 1
        pod = obj["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in pod["containers"][0]["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "hostPath" in volume and not mount.get("readOnly"):
                writers[volume["hostPath"]["path"]].add(obj["metadata"]["name"])
            if mount["mountPath"] == HF_CACHE_MOUNT:
                assert volume.get("emptyDir") == {}, volume  # its own, per pod
    assert vllm_pods == 2
    assert not writers, f"host folders pods may write: {dict(writers)}"
