"""kit export k8s: golden manifests, strict schema validation for Kubernetes 1.33-1.37, the
LeaderWorkerSet against its published layout, the front door's config under real nginx, names,
and the command's writes. Regenerate the golden files with
`python3 -m tests.unit.render.test_k8s`."""

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from kit.errors import BadInput
from kit.layout import SiteLayout
from kit.plan.build import Plan, build_plan
from kit.plan.host import load_spec
from kit.plan.usage import HEALTH_ARGV, USAGE_PORT, UsagePlan
from kit.render.k8s import (
    USAGE_DRAIN,
    CredentialFiles,
    cannot_do,
    export,
    ledger_claim_size,
    replica_count,
    shutdown_timeout,
)
from kit.render.usage import usage_facts
from kit.spec.model import Alerts, Receiver, Webhook
from kit.spec.vllm_flags import flag_table
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.sites import REPO, tree
from tests.support.usage_collector import (
    SCRIPT,
    CollectorProcess,
    append_spool,
    chain_breaks,
    ledger_records,
    spool_line,
)

DATA = REPO / "tests" / "data" / "k8s"
VERSIONS = ["1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]
# Fixed credential files, so the golden Secrets do not change from run to run.
CREDENTIALS = CredentialFiles(
    htpasswd=b"ops:$2b$12$abcdefghijklmnopqrstuu5l9GQ5LkZ2WbZLc3Ed8bYqv7jA0nBS6\n",
    keys_map=b'    "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0" "ci";\n',
    auth_state=b"map $host $kit_auth_epoch { default \"1\"; }\n",
    door_policy=b'{"batch": false, "credentials": {}}\n',
    server_crt=b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    server_key=b"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
)


def _plan(spec: Path) -> Plan:
    return build_plan(load_spec(spec))


CASES = {
    "example": lambda: _plan(REPO / "site.yaml"),
    "multi-replica": lambda: _plan(DATA / "multi-replica" / "site.yaml"),
    "multi-model": lambda: _plan(DATA / "multi-model" / "site.yaml"),
    "multi-node": lambda: _plan(DATA / "multi-node" / "site.yaml"),
    "idle-sleep": lambda: _plan(DATA / "idle-sleep" / "site.yaml"),
}


def _export(case: str) -> dict[str, bytes]:
    plan = CASES[case]()
    namespace = "llm" if case == "multi-node" else plan.site
    result = export(plan, CREDENTIALS, namespace=namespace, service_type=_service_type(case),
                    spec_name="site.yaml")
    return {str(output.path): output.content for output in result.files}


def _service_type(case: str) -> str:
    spec = REPO / "site.yaml" if case == "example" else DATA / case / "site.yaml"
    return load_spec(spec).kubernetes.service_type


def _objects(files: dict[str, bytes]) -> list[dict]:
    return [obj for content in files.values() for obj in yaml.safe_load_all(content) if obj]


def _pod(objects: list[dict], name: str) -> dict:
    """The pod template of the Deployment or StatefulSet `name` (the door with a usage ledger
    is a StatefulSet)."""
    return next(o for o in objects if o["kind"] in ("Deployment", "StatefulSet")
                and o["metadata"]["name"] == name)["spec"]["template"]["spec"]


@pytest.mark.parametrize("case", CASES)
def test_golden_manifests(case: str) -> None:
    files = _export(case)
    folder = DATA / case / "expected"
    assert sorted(files) == sorted(p.name for p in folder.iterdir())
    for name, content in files.items():
        assert content == (folder / name).read_bytes(), (
            f"{case}/{name} drifted: check the change, then "
            "`python3 -m tests.unit.render.test_k8s`")


def test_the_installed_validator_bundles_kubernetes_1_33_to_1_37() -> None:
    from kubernetes_validate.utils import all_versions

    assert set(VERSIONS) <= set(all_versions())


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_passes_strict_validation(tmp_path: Path, version: str) -> None:
    paths = []
    for case in CASES:
        for name, content in _export(case).items():
            path = tmp_path / f"{case}-{name}"
            path.write_bytes(content)
            paths.append(str(path))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, *paths],
        capture_output=True, text=True, check=False,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and not [line for line in lines if "ERROR" in line], result.stdout
    passed = [line for line in lines if line.startswith("INFO")]
    skipped = [line for line in lines if line.startswith("WARN")]
    assert len(passed) >= 60
    # The one kind without a bundled schema: checked by test_leader_worker_set_layout.
    assert skipped and all("LeaderWorkerSet" in line for line in skipped), skipped


def test_strict_validation_catches_a_field_kubernetes_does_not_know(tmp_path: Path) -> None:
    """The check above can fail: the same validator refuses an unknown key."""
    content = _export("example")["service-llama8b.yaml"]
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content.replace(b"maxSurge: 0", b"maxSurge: 0\n      maxSurplus: 1"))
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                             VERSIONS[0], str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "maxSurplus" in result.stdout


# LeaderWorkerSet leaderworkerset.x-k8s.io/v1, as published in kubernetes-sigs/lws
# (config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml): the spec's fields, types
# and enums; its two pod templates are core PodTemplateSpecs (checked with the bundled schema).
POD_TEMPLATE = {"$ref": "https://kubernetes.io/api/podtemplatespec/v1"}
LWS_SPEC = {
    "type": "object", "additionalProperties": False, "required": ["leaderWorkerTemplate"],
    "properties": {
        "replicas": {"type": "integer"},
        "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
        "networkConfig": {"type": "object", "additionalProperties": False,
                          "required": ["subdomainPolicy"],
                          "properties": {"subdomainPolicy": {"enum": ["Shared",
                                                                      "UniquePerReplica"]}}},
        "rolloutStrategy": {
            "type": "object", "additionalProperties": False, "required": ["type"],
            "properties": {
                "type": {"enum": ["RollingUpdate"]},
                "rollingUpdateConfiguration": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"maxSurge": {"type": ["integer", "string"]},
                                   "maxUnavailable": {"type": ["integer", "string"]},
                                   "partition": {"type": "integer"}}},
            },
        },
        "leaderWorkerTemplate": {
            "type": "object", "additionalProperties": False, "required": ["workerTemplate"],
            "properties": {
                "size": {"type": "integer", "minimum": 1},
                "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart",
                                           "RecreateGroupAfterStart", "None"]},
                "leaderTemplate": POD_TEMPLATE,
                "workerTemplate": POD_TEMPLATE,
                "subGroupPolicy": {"type": "object"},
                "volumeClaimTemplates": {"type": "array"},
                "persistentVolumeClaimRetentionPolicy": {"type": "object"},
            },
        },
    },
}


def _lws_validator() -> jsonschema.Draft202012Validator:
    """The layout above, with PodTemplateSpec from kubernetes-validate's strict 1.33 schemas."""
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    folder = "kubernetes-json-schema/v1.33.0-local-strict"
    pod_template = schema_contents(f"{folder}/podtemplatespec-v1.json", "1.33.0")
    definitions = schema_contents(f"{folder}/_definitions.json", "1.33.0")
    registry = Resource.from_contents(pod_template) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    schema = {
        "$id": "https://kubernetes.io/api/leaderworkerset/v1",
        "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
                       "kind": {"const": "LeaderWorkerSet"}, "metadata": {"type": "object"},
                       "spec": LWS_SPEC},
    }
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _lws() -> dict:
    return next(obj for obj in _objects(_export("multi-node")) if obj["kind"] == "LeaderWorkerSet")


def test_leader_worker_set_layout() -> None:
    validator = _lws_validator()
    lws = _lws()
    assert list(validator.iter_errors(lws)) == []
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and lws["spec"]["replicas"] == 1
    # The check can fail: a misplaced field and a wrong container field are both caught.
    broken = yaml.safe_load(yaml.safe_dump(lws))
    broken["spec"]["leaderWorkerTemplate"]["startupPolicy"] = "LeaderCreated"
    broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 8
    messages = [error.message for error in validator.iter_errors(broken)]
    assert any("startupPolicy" in m for m in messages) and any("gpus" in m for m in messages)


def test_multi_node_pods_run_vllm_native_multi_node_with_known_flags() -> None:
    lws = _lws()["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    worker = lws["workerTemplate"]["spec"]["containers"][0]
    table = flag_table()
    for args in (leader["args"], worker["args"]):
        unknown = [a for a in args if a.startswith("-") and table.lookup(a) is None]
        assert unknown == []
        pairs = dict(zip(args, args[1:], strict=False))
        assert pairs["--nnodes"] == "2" and pairs["--master-addr"] == "$(LWS_LEADER_ADDRESS)"
        assert pairs["--tensor-parallel-size"] == "8" and pairs["--pipeline-parallel-size"] == "2"
        assert pairs["--distributed-executor-backend"] == "mp"
    assert "--headless" in worker["args"] and "--headless" not in leader["args"]
    assert dict(zip(leader["args"], leader["args"][1:], strict=False))["--node-rank"] == "0"
    assert "$(LWS_WORKER_INDEX)" in worker["args"]
    assert "startupProbe" in leader and "startupProbe" not in worker  # headless: no API
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert leader["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_the_api_service_of_a_multi_node_service_selects_the_head() -> None:
    objects = _objects(_export("multi-node"))
    api = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "big")
    assert api["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    policy = next(o for o in objects if o["metadata"]["name"] == "big-nodes"
                  and o["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": policy["spec"]["podSelector"]}]}]


def test_vllm_deployments_fit_scarce_gpus_and_model_loading() -> None:
    objects = _objects(_export("multi-model"))
    chat = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "chat")
    assert chat["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    pod = chat["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # 1800 s engine-ready timeout + 300 s load allowance, probed every 15 s
    assert container["startupProbe"]["failureThreshold"] * 15 == 2100
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] == 30
    embed = next(o for o in objects if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == "embed")
    assert embed["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45


def test_only_the_front_door_reaches_vllm_and_the_verifier() -> None:
    policies = [o for o in _objects(_export("example")) if o["kind"] == "NetworkPolicy"]
    by_name = {p["metadata"]["name"]: p["spec"] for p in policies}
    for name, component, port in (("vllm-from-front-door", "vllm", 8000),
                                  ("verifier-from-front-door", "verifier", 8081)):
        spec = by_name[name]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        [rule] = spec["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": port}]
        assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
            "front-door")
    # as compose's network per service (docs/sleep.md): no vLLM pod admits another service's
    # pods; a multi-node group admits its own group alone
    for case in CASES:
        for policy in _objects(_export(case)):
            if policy["kind"] != "NetworkPolicy" or "Ingress" not in policy["spec"]["policyTypes"]:
                continue
            selected = policy["spec"]["podSelector"]["matchLabels"]
            if selected.get("app.kubernetes.io/component") != "vllm":
                continue
            for rule in policy["spec"]["ingress"]:
                for source in rule["from"]:
                    labels = source["podSelector"]["matchLabels"]
                    assert (labels.get("app.kubernetes.io/component") == "front-door"
                            or labels == selected), (case, policy["metadata"]["name"])


def test_vllm_has_no_internet_when_every_model_is_local() -> None:
    """As compose's internal backend network: only other vLLM pods and DNS; a site that
    downloads a model from the Hub keeps its egress."""
    policies = {o["metadata"]["name"]: o["spec"] for o in _objects(_export("example"))
                if o["kind"] == "NetworkPolicy"}
    egress = policies["vllm-no-egress"]
    assert egress["policyTypes"] == ["Egress"]
    assert egress["egress"][0]["to"] == [{"podSelector": egress["podSelector"]}]
    assert {p["port"] for p in egress["egress"][1]["ports"]} == {53}
    downloads = [o["metadata"]["name"] for o in _objects(_export("multi-model"))
                 if o["kind"] == "NetworkPolicy"]
    assert "vllm-no-egress" not in downloads


def test_front_door_service_type_and_ports_follow_the_spec() -> None:
    objects = _objects(_export("multi-model"))
    nginx = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "nginx")
    assert nginx["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in nginx["spec"]["ports"]] == [(8443, 443),
                                                                             (8080, 80)]


def test_the_nginx_pods_stop_gracefully_as_compose_stops_them() -> None:
    """Compose stops nginx with SIGQUIT (requests finish); Kubernetes' SIGTERM comes after a
    hook that asks the same, well within the pod's grace period."""
    objects = _objects(_export("example"))
    for name, config in (("nginx", "/etc/nginx/kit/nginx.conf"),
                         ("kit-auth", "/etc/nginx/kit-verifier/nginx.conf")):
        pod = _pod(objects, name)
        hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1]
        assert hook.startswith(f"nginx -c {config} -s quit; sleep ")
        assert int(hook.rsplit(" ", 1)[1]) < pod["terminationGracePeriodSeconds"]


def test_replica_count_is_the_gpus_over_one_copy() -> None:
    assert [replica_count(s) for s in CASES["multi-replica"]().services] == [2]
    assert [replica_count(s) for s in CASES["multi-model"]().services] == [1, 1, 1]
    assert [replica_count(s) for s in CASES["multi-node"]().services] == [1]


def test_termination_grace_follows_the_last_shutdown_timeout() -> None:
    service = CASES["example"]().services[0]
    assert shutdown_timeout(service) == 0
    longer = dataclasses.replace(service, command=[*service.command, "--shutdown-timeout", "5",
                                                   "--shutdown-timeout=120"])
    assert shutdown_timeout(longer) == 120


def test_what_kubernetes_cannot_do_is_said() -> None:
    example = " ".join(cannot_do(CASES["example"]()))
    assert "GPU index pinning" in example and "GPU sharing" not in example
    assert "GPU sharing: GPU(s) 2 serve" in " ".join(cannot_do(CASES["multi-model"]()))
    assert "LeaderWorkerSet" in " ".join(cannot_do(CASES["multi-node"]()))


def _front_door_folders(files: dict[str, bytes], root: Path) -> tuple[Path, Path]:
    """The front door's and the verifier's projected volumes as their containers see them."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in _objects(files)}
    folders = []
    for deployment in ("nginx", "kit-auth"):
        pod = _pod(list(objects.values()), deployment)
        base = root / deployment
        for volume in pod["volumes"]:
            for source in volume.get("projected", {}).get("sources", []):
                kind, ref = next(iter(source.items()))
                obj = objects[("ConfigMap" if kind == "configMap" else "Secret", ref["name"])]
                for item in ref["items"]:
                    if kind == "configMap":
                        content = obj["data"][item["key"]].encode()
                    else:
                        content = base64.b64decode(obj["data"][item["key"]])
                    path = base / volume["name"] / item["path"]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content)
        folders.append(base)
    return folders[0] / "kit", folders[1]


@pytest.mark.skipif(nginx_ns.available() is not None, reason=str(nginx_ns.available()))
def test_front_door_config_passes_nginx_t(site: Path) -> None:
    """The exported nginx.conf and verifier config, laid out as the projected volumes present
    them, with the site's real credentials: nginx -t accepts both."""
    assert run_kit("render", site / "site.yaml").exit_code == 0
    plan = build_plan(load_spec(site / "site.yaml"))
    result = export(plan, CredentialFiles.read(SiteLayout(site)), namespace="llm",
                    service_type="LoadBalancer", spec_name="site.yaml")
    files = {str(o.path): o.content for o in result.files}
    nginx_dir, verifier = _front_door_folders(files, site.parent / "pods")
    # the site's usage ledger is on: the door's config writes the spool the collector reads
    assert "access_log /var/log/kit-usage/door.jsonl kit_usage" in (
        nginx_dir / "nginx.conf").read_text()
    checked = nginx_ns.nginx_t(nginx_dir, ["llama8b.llm.svc", "kit-auth.llm.svc"])
    assert checked.returncode == 0, checked.stderr
    checked = nginx_ns.verifier_t(_verifier_view(verifier, site.parent / "verifier-view"))
    assert checked.returncode == 0, checked.stderr


def _verifier_view(verifier: Path, view: Path) -> Path:
    """nginx_ns.verifier_t reads <dir>/verifier and <dir>/auth: the two volumes there."""
    shutil.copytree(verifier / "config", view / "verifier")
    shutil.copytree(verifier / "auth", view / "auth")
    return view


def test_export_writes_manifests_then_changes_nothing(site: Path) -> None:
    assert run_kit("render", site / "site.yaml").exit_code == 0
    out = site / "k8s"
    first = run_kit("export", "k8s", site / "site.yaml", "--out", out)
    assert first.exit_code == 0, first.output
    assert "created" in first.output and "GPU index pinning" in first.output
    assert (out / "secrets.yaml").stat().st_mode & 0o777 == 0o600
    assert (out / "front-door.yaml").stat().st_mode & 0o777 == 0o644
    before = tree(out)
    again = run_kit("export", "k8s", site / "site.yaml", "--out", out)
    assert again.exit_code == 0 and "no change" in again.output and tree(out) == before


def test_a_manifest_of_a_removed_service_is_named(site: Path) -> None:
    """kubectl apply -f DIR would bring a removed service back: the export says so."""
    assert run_kit("render", site / "site.yaml").exit_code == 0
    out = site / "k8s"
    assert run_kit("export", "k8s", site / "site.yaml", "--out", out).exit_code == 0
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("name: llama8b", "name: llama"))
    result = run_kit("export", "k8s", spec, "--out", out)
    assert result.exit_code == 0
    assert f"warning: {out / 'service-llama8b.yaml'} is from an earlier export" in result.output
    assert (out / "service-llama.yaml").is_file()


def test_a_hand_edited_manifest_is_kept_unless_forced(site: Path) -> None:
    assert run_kit("render", site / "site.yaml").exit_code == 0
    out = site / "k8s"
    assert run_kit("export", "k8s", site / "site.yaml", "--out", out).exit_code == 0
    (out / "service-llama8b.yaml").write_text("# mine\n")
    (site / "site.yaml").write_text((site / "site.yaml").read_text().replace("max_num_seqs: 64",
                                                                              "max_num_seqs: 32"))
    refused = run_kit("export", "k8s", site / "site.yaml", "--out", out)
    assert refused.exit_code == 2 and "edited by hand" in refused.output
    assert (out / "service-llama8b.yaml").read_text() == "# mine\n"
    forced = run_kit("export", "k8s", site / "site.yaml", "--out", out, "--force")
    assert forced.exit_code == 0 and b"'32'" in (out / "service-llama8b.yaml").read_bytes()


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda t: t, "run `kit render SPEC` first"),  # no credentials yet
    (lambda t: t.replace("name: llama8b", "name: llama8b-"), "DNS-1035"),
    (lambda t: t.replace("site: test01", "site: test-"), "namespace 'test-'"),
    (lambda t: t.replace("tls: {mode: self-signed}", "tls: {mode: acme, email: a@b.example}")
     .replace("domain: llm.test.internal", "domain: llm.example.com"), "tls.mode acme"),
])
def test_bad_input_exits_2_and_writes_nothing(site: Path, change, fragment: str) -> None:
    spec = site / "site.yaml"
    spec.write_text(change(spec.read_text()))
    if "first" not in fragment:
        (site / "nginx" / "auth").mkdir(parents=True)
        (site / "nginx" / "tls").mkdir()
        layout = SiteLayout(site)
        for path in (layout.htpasswd, layout.keys_map, layout.auth_state, layout.server_cert,
                     layout.server_key):
            path.write_bytes(b"x\n")
    before = tree(site)
    result = run_kit("export", "k8s", spec, "--out", site / "k8s")
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert tree(site) == before


def test_a_bad_namespace_option_is_refused(site: Path) -> None:
    assert run_kit("render", site / "site.yaml").exit_code == 0
    result = run_kit("export", "k8s", site / "site.yaml", "--out", site / "k8s",
                     "--namespace", "Prod_1")
    assert result.exit_code == 2 and "namespace 'Prod_1'" in result.output
    assert not (site / "k8s").exists()


def test_two_objects_of_one_name_are_refused() -> None:
    plan = CASES["multi-node"]()
    clash = dataclasses.replace(plan.services[0], name="big-nodes", multinode=None,
                                tensor_parallel=8, pipeline_parallel=1)
    plan = dataclasses.replace(plan, services=[*plan.services, clash])
    with pytest.raises(BadInput, match="two Service objects would be named 'big-nodes'"):
        export(plan, CREDENTIALS, namespace="llm", service_type="NodePort", spec_name="s")


def regenerate() -> None:
    for case in CASES:
        folder = DATA / case / "expected"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, content in _export(case).items():
            (folder / name).write_bytes(content)


if __name__ == "__main__":
    regenerate()


def test_idle_sleep_services_are_named_and_exported_awake_without_dev_routes() -> None:
    """No waker in the cluster (docs/sleep.md): the output names the services and the swap
    group, and their pods start without sleep mode nor vLLM's development routes."""
    plan = CASES["idle-sleep"]()
    assert plan.waker is not None
    result = export(plan, CREDENTIALS, namespace=plan.site, service_type="LoadBalancer",
                    spec_name="site.yaml")
    note = next(note for note in result.notes if note.startswith("idle_sleep: "))
    assert "chat, coder, embed run awake for good" in note
    assert "docs/sleep.md" in note and "swap group(s) gpu0" in note
    files = {str(output.path): output.content for output in result.files}
    objects = _objects(files)
    for name in ("chat", "coder", "embed"):
        assert "--enable-sleep-mode" not in _pod(objects, name)["containers"][0]["args"]
        env = next(o for o in objects if o["kind"] == "Secret"
                   and o["metadata"]["name"] == f"{name}-env")
        assert "VLLM_SERVER_DEV_MODE" not in env.get("data", {})
    for hook in (b"location = /_kit/wake/", b"$kit_wake_services", b"upstream kit_waker"):
        assert hook not in files["front-door.yaml"]
    # a site without idle_sleep says nothing of it
    assert not [n for n in cannot_do(CASES["example"]()) if n.startswith("idle_sleep")]


def test_observability_is_named_and_left_out_of_the_front_door() -> None:
    """The cluster has none of kit's Prometheus/Grafana/door-figures: nginx must neither log to
    the figures socket nor route /grafana/, and the output says so."""
    plan = CASES["example"]()
    spec = load_spec(REPO / "site.yaml")
    observed = build_plan(spec.model_copy(update={
        "observability": spec.observability.model_copy(update={"enabled": True})}))
    assert observed.observability is not None
    result = export(observed, CREDENTIALS, namespace=plan.site, service_type="LoadBalancer",
                    spec_name="site.yaml")
    assert any(note.startswith("observability: ") for note in result.notes)
    front_door = next(o for o in result.files if str(o.path) == "front-door.yaml").content
    assert b"/grafana/" not in front_door and b"access.sock" not in front_door
    plain = export(plan, CREDENTIALS, namespace=plan.site, service_type="LoadBalancer",
                   spec_name="site.yaml")
    assert not any(note.startswith("observability: ") for note in plain.notes)
    assert not any(note.startswith("observability.alerts: ") for note in result.notes)
    alerted = build_plan(spec.model_copy(update={
        "observability": spec.observability.model_copy(update={
            "enabled": True,
            "alerts": Alerts(receivers=[Receiver(webhook=Webhook(url_file=Path("hook")))])})}))
    result = export(alerted, CREDENTIALS, namespace=plan.site, service_type="LoadBalancer",
                    spec_name="site.yaml")
    assert any(note.startswith("observability.alerts: Alertmanager and kit's alert rules are "
                               "not exported") for note in result.notes)


# --------------------------------------------------------------------------- the usage ledger


def _door(case: str) -> tuple[dict, dict, dict]:
    """(the door's workload, its pod, its collector) of a case's export."""
    objects = _objects(_export(case))
    door = next(o for o in objects if o["metadata"]["name"] == "nginx"
                and o["kind"] in ("Deployment", "StatefulSet"))
    pod = door["spec"]["template"]["spec"]
    collectors = pod.get("initContainers", [])
    return door, pod, collectors[0] if collectors else {}


def test_the_usage_ledger_rides_in_the_door_pod() -> None:
    """A StatefulSet (pod N never runs twice: one writer per ledger), the collector a native
    sidecar (starts before nginx, stops after it) sharing the spool through an emptyDir, its
    own claim for the ledger, nginx never mounting the ledger."""
    door, pod, collector = _door("example")
    assert door["kind"] == "StatefulSet" and door["spec"]["replicas"] == 1
    [claim] = door["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "usage-ledger"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "25Gi"}}}  # 20g + 25 %
    assert door["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Retain"}
    assert collector["name"] == "usage-ledger" and collector["restartPolicy"] == "Always"
    facts = usage_facts(CASES["example"]())
    assert facts is not None
    assert collector["image"] == facts["image"] == "vllm/vllm-openai:v0.33.0"
    assert collector["command"] == ["python3", *facts["pod_command"]]
    assert facts["pod_command"][-2:] == ["--host", "127.0.0.1"] and "--door" not in collector[
        "command"]
    nginx = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in nginx["volumeMounts"]}
    theirs = {m["name"]: m["mountPath"] for m in collector["volumeMounts"]}
    assert mounts["usage-spool"] == "/var/log/kit-usage"
    assert theirs == {"usage-script": "/opt/kit-usage", "usage-spool": "/var/lib/kit-usage/spool",
                      "usage-ledger": "/var/lib/kit-usage/ledger",
                      "usage-models": "/etc/kit/usage-models"}
    assert "usage-ledger" not in mounts and "usage-script" not in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["usage-spool"] == {"name": "usage-spool", "emptyDir": {}}
    assert "usage-ledger" not in volumes  # the claim, per pod
    script = next(o for o in _objects(_export("example")) if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "usage-ledger")["data"]["usage_ledger.py"]
    assert script.encode() == SCRIPT.read_bytes()
    assert pod["terminationGracePeriodSeconds"] == 60 + USAGE_DRAIN


def test_the_collector_is_hardened_and_probed_as_in_compose() -> None:
    _, pod, collector = _door("example")
    assert collector["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
        "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    probe = collector["livenessProbe"]
    assert probe["exec"]["command"] == HEALTH_ARGV  # compose's healthcheck, kit status's ask
    assert probe["initialDelaySeconds"] == 10 and probe["failureThreshold"] == 3
    # a sidecar's readiness is the pod's: a lost collector must not take the door away
    assert "readinessProbe" not in collector and "startupProbe" not in collector


def test_the_collector_is_reachable_from_nowhere_but_its_pod() -> None:
    """It listens on the pod's loopback; the door's pods admit only 443 and 80, so no vLLM
    pod (whose model code may be hostile) reaches its port even past the loopback."""
    _, _, collector = _door("example")
    assert collector["command"][-2:] == ["--host", "127.0.0.1"]
    assert "ports" not in collector
    policies = {o["metadata"]["name"]: o["spec"] for o in _objects(_export("example"))
                if o["kind"] == "NetworkPolicy"}
    door = policies["front-door-ports-only"]
    assert door["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "front-door"
    assert door["policyTypes"] == ["Ingress"]
    assert door["ingress"] == [{"ports": [{"protocol": "TCP", "port": 443},
                                          {"protocol": "TCP", "port": 80}]}]
    admitted = {port["port"] for spec in policies.values() for rule in spec.get("ingress", [])
                for port in rule.get("ports", [])}
    assert USAGE_PORT not in admitted


def test_without_the_ledger_the_door_is_a_deployment_as_before() -> None:
    door, pod, collector = _door("multi-node")  # usage: {enabled: false}
    assert door["kind"] == "Deployment" and collector == {}
    assert "usage" not in str(pod["volumes"]).replace("usage.js", "")  # the door's njs module
    content = _export("multi-node")
    assert b"kit-usage" not in content["front-door.yaml"]
    assert b"front-door-ports-only" not in content["network-policy.yaml"]
    assert not any("usage ledger" in note for note in cannot_do(CASES["multi-node"]()))


def test_the_ledger_claim_holds_max_disk_and_a_quarter() -> None:
    sizes = {size: ledger_claim_size(UsagePlan(400, size, None))
             for size in (64 << 20, 20 << 30, 100 << 30, (7 << 30) + 1)}
    assert sizes == {64 << 20: "1Gi", 20 << 30: "25Gi", 100 << 30: "125Gi", (7 << 30) + 1: "9Gi"}
    door, _, collector = _door("multi-model")  # usage: {retention_days: 90, max_disk: 100g}
    assert door["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "125Gi"}
    pairs = dict(zip(collector["command"], collector["command"][1:], strict=False))
    assert pairs["--retention-days"] == "90" and pairs["--max-bytes"] == str(100 << 30)
    notes = " ".join(cannot_do(CASES["multi-model"]()))
    assert "usage-ledger-nginx-N (125Gi" in notes and "StatefulSet" in notes


def _hook(collector: dict, hook: str) -> str:
    command = collector["lifecycle"][hook]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    return command[2]


def _as_collector(*argv: str) -> subprocess.CompletedProcess:
    """Run as the pod runs the collector: its own user and group, the pod's fsGroup (101)."""
    return subprocess.run(["setpriv", "--reuid=10001", "--regid=10001", "--groups=101",
                           *argv], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs the hooks as the collector's user: needs root and setpriv")
def test_the_hooks_let_a_non_root_collector_read_and_give_back_the_spool() -> None:
    """The exported hooks on real files, as the pod's users: postStart creates the spool for
    nginx (root) to append to, the collector (10001, group 101) appends every line to its
    ledger and punches the spool's holes; preStop returns once the spool is read and fails,
    naming what is left, when it cannot be."""
    _, _, collector = _door("example")
    with tempfile.TemporaryDirectory() as work:  # pytest's tmp_path is root's alone (0700)
        Path(work).chmod(0o755)
        _hooks_as_the_pod_runs_them(collector, Path(work))


def _hooks_as_the_pod_runs_them(collector: dict, tmp_path: Path) -> None:
    spool_dir, ledger = tmp_path / "spool", tmp_path / "ledger"
    for folder in (spool_dir, ledger):  # as kubelet leaves volumes of a pod with fsGroup 101
        folder.mkdir()
        os.chown(folder, 0, 101)
        folder.chmod(0o2775)
    spool = spool_dir / "door.jsonl"
    create = _hook(collector, "postStart").replace("/var/lib/kit-usage/spool", str(spool_dir))
    locked = tmp_path / "locked"  # a spool folder it cannot write: the hook must not fail, or
    locked.mkdir(mode=0o755)      # nginx would never start
    done = _as_collector(sys.executable, "-c", create.replace(str(spool_dir), str(locked)))
    assert done.returncode == 0 and not list(locked.iterdir()), done.stderr
    for _ in range(2):  # a restarted collector finds the spool and leaves it
        done = _as_collector(sys.executable, "-c", create)
        assert done.returncode == 0, done.stderr
        info = spool.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (10001, 101, 0o660)
    append_spool(spool, [spool_line(seq) for seq in range(1, 101)])  # nginx's master: root
    process = CollectorProcess(spool, ledger, wrap=["setpriv", "--reuid=10001",
                                                    "--regid=10001", "--groups=101"]).start()
    drain = _hook(collector, "preStop")
    assert drain.count(f"127.0.0.1:{USAGE_PORT}") == 1
    drain = drain.replace(f"127.0.0.1:{USAGE_PORT}", f"127.0.0.1:{process.port}")
    try:
        health = process.wait_for(lambda h: h["records"] == 100
                                  and h["hole_punching"]["supported"] is True, "100 records")
        assert health["hole_punching"]["error"] is None and health["ok"], health
        done = _as_collector(sys.executable, "-c", drain)
        assert done.returncode == 0, done.stderr
    finally:
        assert process.stop() == 0
    records = ledger_records(ledger)
    assert [r["door_seq"] for r in records] == list(range(1, 101)) and not chain_breaks(records)
    assert {path.stat().st_uid for path in ledger.rglob("*")} == {10001}
    append_spool(spool, [spool_line(101)])  # the collector is gone: the hook says so
    quick = drain.replace(f"+ {USAGE_DRAIN - 2}\n", "+ 1\n")
    assert quick != drain
    done = _as_collector(sys.executable, "-c", quick)
    assert done.returncode == 1
    assert "usage ledger: the spool was not read to its end" in done.stderr
    assert "those records go with this pod" in done.stderr


def test_an_object_an_earlier_export_held_is_named(site: Path) -> None:
    """Turning the ledger on makes the door a StatefulSet: `kubectl apply` would leave the old
    Deployment serving beside it, without a ledger; the export names it and the command."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text() + "usage: {enabled: false}\n")
    assert run_kit("render", spec).exit_code == 0
    out = site / "k8s"
    assert run_kit("export", "k8s", spec, "--out", out).exit_code == 0
    spec.write_text(spec.read_text().replace("usage: {enabled: false}\n", ""))
    result = run_kit("export", "k8s", spec, "--out", out)
    assert result.exit_code == 0, result.output
    assert ("warning: Deployment nginx of the earlier export is no longer part of it and "
            "`kubectl apply` leaves it running: after applying, `kubectl delete -n test01 "
            "deployment nginx`") in result.output
    assert b"kind: StatefulSet" in (out / "front-door.yaml").read_bytes()
    again = run_kit("export", "k8s", spec, "--out", out)
    assert again.exit_code == 0 and "no change" in again.output and "warning" not in again.output


@pytest.fixture
def on_the_disk() -> Iterator[Path]:
    """A folder on the root filesystem's disk (/var/tmp), not the tests' tmpfs (scripts/test.sh):
    what is tested is how a disk's filesystem hands inode numbers out."""
    folder = Path(tempfile.mkdtemp(prefix="kit-inodes-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder)


def test_a_new_spool_never_takes_the_inode_the_checkpoint_names(on_the_disk: Path) -> None:
    """A new door pod's spool that got the old one's inode number back (ext4 often hands a
    freed number out again at once) would be read from the old checkpoint's offset: the
    postStart hook gives it another number."""
    _, _, collector = _door("example")
    spool_dir, ledger = on_the_disk / "spool", on_the_disk / "ledger"
    spool_dir.mkdir()
    ledger.mkdir()
    create = (_hook(collector, "postStart").replace("/var/lib/kit-usage/spool", str(spool_dir))
              .replace("/var/lib/kit-usage/ledger", str(ledger)))
    spool = spool_dir / "door.jsonl"
    state = ledger / "state.json"
    state.write_text("{}")  # rewritten below in place: no inode taken between unlink and hook
    reused = 0
    for _ in range(10):
        spool.touch()
        number = spool.stat().st_ino
        spool.unlink()
        spool.touch()
        reused += spool.stat().st_ino == number
        spool.unlink()
    if not reused:
        pytest.skip("this filesystem does not hand a freed inode number out again soon")
    for _ in range(40):  # ext4 hands it out again often, not always: the hook must every time
        spool.touch()  # the number this folder's filesystem hands out next, named by the state
        taken = spool.stat().st_ino
        spool.unlink()
        state.write_text(json.dumps({"checkpoint": {
            "offset": 4096, "inode": taken, "punched_to": 0}}))
        done = subprocess.run([sys.executable, "-c", create], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert spool.stat().st_ino != taken
        assert not (spool_dir / "door.jsonl.new").exists()
        spool.unlink()


def test_a_services_adapters_file_is_a_config_map_and_a_change_rolls_its_pods() -> None:
    """vLLM's --config file of a service's adapters (compose: lora/<service>/adapters.yaml)
    becomes a ConfigMap mounted where the command reads it; kit hot-loads adapters on Docker
    only, so here its sha256 on the pod template rolls the pods when the list changes."""
    plan = CASES["example"]()

    def exported(modules: list[str]) -> list[dict]:
        service = dataclasses.replace(plan.services[0], lora_config={
            "max-loras": str(len(modules)), "lora-modules": modules})
        with_adapters = dataclasses.replace(plan, services=[service, *plan.services[1:]])
        return _objects({str(o.path): o.content for o in export(
            with_adapters, CREDENTIALS, namespace=plan.site, service_type="ClusterIP",
            spec_name="site.yaml").files})

    name = plan.services[0].name
    objects = exported(["support=/models/adapters/support"])
    config = next(o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == f"{name}-lora")
    assert yaml.safe_load(config["data"]["adapters.yaml"]) == {
        "max-loras": "1", "lora-modules": ["support=/models/adapters/support"]}
    pod = _pod(objects, name)
    assert {"name": "lora", "mountPath": "/etc/kit/lora", "readOnly": True} in pod[
        "containers"][0]["volumeMounts"]
    assert {"configMap": {"name": f"{name}-lora", "items": [
        {"key": "adapters.yaml", "path": "adapters.yaml"}]}} in next(
        v for v in pod["volumes"] if v["name"] == "lora")["projected"]["sources"]

    def checksum(objects: list[dict]) -> str:
        deployment = next(o for o in objects if o["kind"] == "Deployment"
                          and o["metadata"]["name"] == name)
        return deployment["spec"]["template"]["metadata"]["annotations"][
            "kit.io/adapters-sha256"]

    assert checksum(objects) != checksum(exported(["support=/models/adapters/support",
                                                   "legal=/models/adapters/legal"]))
