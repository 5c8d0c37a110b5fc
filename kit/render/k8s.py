"""Plan → Kubernetes manifests: the site as `kit export k8s` writes it.

Every decision is made here, in Python, on plain data (dicts and lists); PyYAML's safe dumper
writes them, so no value can change the structure of a manifest. Every object name is checked
against Kubernetes' DNS-1035 label rule (kit.names.K8S_NAME) and refused whole (BadInput).
The front door's nginx.conf is kit's own template rendered with the cluster's service DNS names.
"""

import base64
import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from kit.credentials.material import NGINX_GID
from kit.credentials.policy import door_policy
from kit.engine.desired import PROXY_SERVICE as NGINX_SERVICE
from kit.engine.desired import VERIFIER_SERVICE
from kit.errors import BadInput
from kit.files import (
    Change,
    Output,
    commit,
    digest,
    generated_yaml,
    hand_edits,
    manifest_content,
    pending_changes,
    read_existing,
    read_manifest,
    recover,
    write_failure,
)
from kit.layout import (
    LORA_CONFIG,
    LORA_MOUNT,
    NGINX_MOUNT,
    USAGE_MODELS_MOUNT,
    VERIFIER_AUTH_MOUNT,
    VERIFIER_MOUNT,
    SiteLayout,
)
from kit.names import K8S_NAME, is_name
from kit.plan import usage as ledger
from kit.plan.build import (
    HEALTHZ_PORT,
    HF_CACHE_MOUNT,
    MODELS_MOUNT,
    NGINX_CONF,
    SITE_HF_CACHE_MOUNT,
    VLLM_ENTRYPOINT,
    VLLM_PORT,
    Plan,
    ServicePlan,
    build_plan,
)
from kit.plan.multinode import HEAD_RANK, MultiNodePlan, node_flags
from kit.render.site_files import (
    DOOR_MODULES,
    generated_files,
    render_template,
    template_context,
)
from kit.render.usage import collector_script, ledger_models, usage_facts
from kit.site import Site
from kit.spec.vllm_flags import DEV_MODE_ENV, SLEEP_MODE_FLAG, flag_table, flag_uses

GPU_RESOURCE = "nvidia.com/gpu"
STOP_GRACE = 30  # seconds a stopped vLLM gets beyond its --shutdown-timeout (compose's grace)
NGINX_STOP_GRACE = 30  # seconds nginx finishes running requests in when its pod stops
PROBE_TIMEOUT = 5  # seconds, as the compose healthcheck's timeout
PROBE_FAILURES = 3  # as the compose healthcheck's retries
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# What LeaderWorkerSet gives every container of a group (its API's environment variables).
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
LWS_SUFFIX = "-nodes"  # the LeaderWorkerSet (and the headless Service it creates) of a service
NGINX_HEALTH_COMMAND = (
    f"wget -q -O /dev/null http://127.0.0.1:{HEALTHZ_PORT}/kit-healthz || "
    f"curl -fsS -o /dev/null http://127.0.0.1:{HEALTHZ_PORT}/kit-healthz"
)
ADAPTERS_ANNOTATION = "kit.io/adapters-sha256"  # a vLLM pod template: its adapters file's
PART_OF = "app.kubernetes.io/part-of"
NAME = "app.kubernetes.io/name"
COMPONENT = "app.kubernetes.io/component"
FRONT_DOOR, VLLM, VERIFIER = "front-door", "vllm", "verifier"
USAGE_UID = 10001  # the collector's own user and group: neither root nor nginx's
USAGE_DRAIN = 20  # seconds the collector may take to read the spool's last lines after nginx
USAGE_START_PERIOD = 10  # as the compose healthcheck's start_period
LEDGER_HEADROOM = 1.25  # the ledger's claim over max_disk (see ledger_claim_size)
SECRETS_FILE = "secrets.yaml"  # 0600: htpasswd, key digests, the TLS key, services' env


@dataclass(frozen=True)
class CredentialFiles:
    """The site's credential files as `kit render` and the credential commands left them."""

    htpasswd: bytes
    keys_map: bytes
    auth_state: bytes
    door_policy: bytes
    server_crt: bytes
    server_key: bytes

    @classmethod
    def read(cls, layout: SiteLayout) -> "CredentialFiles":
        paths = {
            "htpasswd": layout.htpasswd, "keys_map": layout.keys_map,
            "auth_state": layout.auth_state, "server_crt": layout.server_cert,
            "server_key": layout.server_key,
        }
        missing = [path for path in paths.values() if not path.is_file()]
        if missing:
            raise BadInput(
                f"the site has no credentials yet: {', '.join(map(str, missing))} missing",
                fix="run `kit render SPEC` first (it creates them and shows new passwords once); "
                "the export carries the same credentials into the cluster",
            )
        try:
            files = {key: path.read_bytes() for key, path in paths.items()}
            # none before kit had policies (the next credential change or render writes it)
            policy = read_existing(layout.door_policy) or door_policy({}, set())
            return cls(**files, door_policy=policy)
        except OSError as error:
            raise BadInput(f"cannot read {error.filename}: {error.strerror}",
                           fix="run kit as the user that owns the site folder") from None


@dataclass(frozen=True)
class Export:
    files: list[Output]  # relative to the output folder
    notes: list[str]  # what the compose stack does that these manifests cannot


def replica_count(service: ServicePlan) -> int:
    """How many copies of the service run: its replicas (one LeaderWorkerSet group for a
    multi-node service, which is one replica over all its nodes)."""
    return len(service.replicas)


def k8s_name(name: str, what: str) -> str:
    """`name` when Kubernetes accepts it for every kind kit writes, BadInput naming `what`."""
    if not is_name(K8S_NAME, name):
        raise BadInput(
            f"{what} {name!r} is not a Kubernetes object name (DNS-1035 label: lower-case "
            "letters, digits and '-', starting with a letter, ending with a letter or digit, "
            "at most 63)",
            fix="rename it in the spec (services[].name, site) or pass another --namespace",
        )
    return name


def service_host(name: str, namespace: str) -> str:
    """A Service's cluster DNS name, independent of the cluster's domain suffix."""
    return f"{name}.{namespace}.svc"


# --------------------------------------------------------------------------- small builders


def _labels(plan: Plan, name: str, component: str) -> dict[str, str]:
    return {PART_OF: plan.site, NAME: name, COMPONENT: component,
            "app.kubernetes.io/managed-by": "kit"}


def _selector(plan: Plan, name: str) -> dict[str, str]:
    return {PART_OF: plan.site, NAME: name}


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels}


def _secret(name: str, namespace: str, labels: dict, data: dict[str, bytes],
            kind: str = "Opaque") -> dict:
    return {
        "apiVersion": "v1", "kind": "Secret", "metadata": _meta(name, namespace, labels),
        "type": kind,
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }


def _config_map(name: str, namespace: str, labels: dict, data: dict[str, bytes]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace, labels),
            "data": {key: value.decode() for key, value in data.items()}}


def _service(name: str, namespace: str, labels: dict, selector: dict, ports: list[dict],
             kind: str = "ClusterIP") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace, labels),
            "spec": {"type": kind, "selector": selector, "ports": ports}}


def _port(name: str, port: int, target: int | None = None) -> dict:
    return {"name": name, "port": port, "targetPort": target or port, "protocol": "TCP"}


def _exec_probe(command: str, period: int, failures: int) -> dict:
    return {"exec": {"command": ["/bin/sh", "-c", command]}, "periodSeconds": period,
            "timeoutSeconds": PROBE_TIMEOUT, "failureThreshold": failures}


def _http_probe(period: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": VLLM_PORT}, "periodSeconds": period,
            "timeoutSeconds": PROBE_TIMEOUT, "failureThreshold": failures}


def _projected(name: str, sources: list[tuple[str, str, dict[str, str]]]) -> dict:
    """One read-only folder from ConfigMaps and Secrets: (kind, object, {key: path}) each.

    One volume, not nested mounts: a mount point inside a read-only ConfigMap volume fails."""
    projected = []
    for kind, obj, items in sources:
        field = "configMap" if kind == "ConfigMap" else "secret"
        projected.append({field: {"name": obj, "items": [
            {"key": key, "path": path} for key, path in items.items()
        ]}})
    return {"name": name, "projected": {"sources": projected, "defaultMode": 0o440}}


def _nginx_container(name: str, image: str, command: list[str], config: str, mounts: list[dict],
                     ports: list[dict], period: int) -> dict:
    """An nginx container as compose runs it: read-only root, writable scratch folders only,
    and a graceful stop (compose's SIGQUIT: running requests finish; Kubernetes sends SIGTERM,
    nginx's fast stop, only after the hook)."""
    scratch = [{"name": f"scratch-{i}", "mountPath": path}
               for i, path in enumerate(("/var/cache/nginx", "/run", "/tmp"))]
    graceful = f"nginx -c {config} -s quit; sleep {NGINX_STOP_GRACE}"
    return {
        "name": name, "image": image, "command": command, "ports": ports,
        "volumeMounts": mounts + scratch,
        "readinessProbe": _exec_probe(NGINX_HEALTH_COMMAND, period, PROBE_FAILURES),
        "livenessProbe": _exec_probe(NGINX_HEALTH_COMMAND, period, PROBE_FAILURES),
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", graceful]}}},
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    }


def _scratch_volumes() -> list[dict]:
    return [{"name": f"scratch-{i}", "emptyDir": {}} for i in range(3)]


def _deployment(plan: Plan, namespace: str, name: str, component: str, pod: dict,
                replicas: int = 1, strategy: dict | None = None) -> dict:
    spec: dict = {
        "replicas": replicas,
        "selector": {"matchLabels": _selector(plan, name)},
        "template": {"metadata": {"labels": _labels(plan, name, component)}, "spec": pod},
    }
    if strategy:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(name, namespace, _labels(plan, name, component)), "spec": spec}


# --------------------------------------------------------------------------- vLLM services


def shutdown_timeout(service: ServicePlan) -> int:
    """vLLM's --shutdown-timeout as the service runs it (the last use wins, default 0)."""
    seconds = 0
    for use in flag_uses(service.command, flag_table()):
        name = use.option.canonical if use.option else None
        if name == "--shutdown-timeout" and use.values and use.values[-1].isdigit():
            seconds = int(use.values[-1])
    return seconds


def _vllm_pod(plan: Plan, service: ServicePlan, args: list[str], gpus: int, *,
              serves: bool, extra_env: list[dict]) -> dict:
    """One vLLM pod: its GPUs, the models, shared memory, and (when it serves the API) probes
    sized for model loading; stopping waits for vLLM's own shutdown timeout."""
    interval = plan.healthcheck_interval
    container: dict = {
        "name": "vllm", "image": service.image, "command": list(VLLM_ENTRYPOINT), "args": args,
        "envFrom": [{"secretRef": {"name": f"{service.name}-env"}}],
        "resources": {"limits": {GPU_RESOURCE: gpus}},
        "volumeMounts": [
            {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
            {"name": "hf-cache", "mountPath": HF_CACHE_MOUNT},  # its own: an emptyDir
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    site_cache = []
    if plan.hf_cache:  # kit's verified snapshots, written by no pod
        container["volumeMounts"].insert(2, {"name": "site-hf-cache",
                                             "mountPath": SITE_HF_CACHE_MOUNT, "readOnly": True})
        site_cache = [{"name": "site-hf-cache",
                       "hostPath": {"path": plan.hf_cache, "type": "DirectoryOrCreate"}}]
    if extra_env:
        container["env"] = extra_env
    if serves:
        container["ports"] = [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}]
        container["startupProbe"] = _http_probe(
            interval, max(1, math.ceil(service.start_period / interval)))
        container["readinessProbe"] = _http_probe(interval, PROBE_FAILURES)
        container["livenessProbe"] = _http_probe(interval, PROBE_FAILURES)
    return {
        "terminationGracePeriodSeconds": shutdown_timeout(service) + STOP_GRACE,
        "containers": [container],
        "volumes": [
            {"name": "models", "hostPath": {"path": plan.models_root, "type": "Directory"}},
            {"name": "hf-cache", "emptyDir": {}},
            *site_cache,
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }


def _single_node(plan: Plan, service: ServicePlan, namespace: str) -> dict:
    pod = _vllm_pod(plan, service, service.command,
                    service.tensor_parallel * service.pipeline_parallel,
                    serves=True, extra_env=[])
    # GPUs are scarce: a rolling update stops an old copy before it starts a new one.
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    deployment = _deployment(plan, namespace, service.name, VLLM, pod, replica_count(service),
                             strategy)
    if service.lora_config is not None:  # its adapters: vLLM's --config file, a ConfigMap
        pod["containers"][0]["volumeMounts"].append(
            {"name": "lora", "mountPath": LORA_MOUNT, "readOnly": True})
        pod["volumes"].append(_projected("lora", [("ConfigMap", _lora_map(service.name),
                                                   {LORA_CONFIG: LORA_CONFIG})]))
        # kit hot-loads adapters on Docker only: here a changed adapter list rolls the pods
        # (each loads the new file at its start), as a changed command would
        deployment["spec"]["template"]["metadata"]["annotations"] = {
            ADAPTERS_ANNOTATION: hashlib.sha256(_lora_file(service)).hexdigest()}
    return deployment


def _lora_map(service: str) -> str:
    return k8s_name(service + "-lora", "the adapters ConfigMap of service")


def _lora_file(service: ServicePlan) -> bytes:
    return generated_yaml(service.lora_config or {}).encode()


def _leader_worker_set(plan: Plan, service: ServicePlan, nodes: MultiNodePlan,
                       namespace: str) -> dict:
    """A multi-node service: one LeaderWorkerSet group per copy, the leader is vLLM's head."""
    name = k8s_name(service.name + LWS_SUFFIX, "the LeaderWorkerSet of service")
    size = len(nodes.nodes)
    pod_ip = [{"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    leader_args = nodes.serve_args + node_flags(size, str(HEAD_RANK), LWS_LEADER_ADDRESS,
                                                nodes.master_port)
    worker_args = nodes.serve_args + node_flags(size, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS,
                                                nodes.master_port)
    gpus = len(service.gpus)
    labels = _labels(plan, service.name, VLLM)
    template = {
        "size": size,
        "restartPolicy": "RecreateGroupOnPodRestart",  # NCCL cannot take a node back in
        "leaderTemplate": {"metadata": {"labels": labels}, "spec": _vllm_pod(
            plan, service, leader_args, gpus, serves=True, extra_env=pod_ip)},
        "workerTemplate": {"metadata": {"labels": labels}, "spec": _vllm_pod(
            plan, service, worker_args, gpus, serves=False, extra_env=pod_ip)},
    }
    return {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "replicas": replica_count(service),
            "leaderWorkerTemplate": template,
            "startupPolicy": "LeaderCreated",  # workers join the head's --master-addr
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxSurge": 0, "maxUnavailable": 1}},
        },
    }


def _vllm_objects(plan: Plan, service: ServicePlan, namespace: str) -> tuple[list, list]:
    """(objects, secrets) of one vLLM service: its copies, its Service, its environment."""
    labels = _labels(plan, service.name, VLLM)
    selector = _selector(plan, service.name)
    nodes = service.multinode
    if nodes is None:
        workload = _single_node(plan, service, namespace)
    else:
        workload = _leader_worker_set(plan, service, nodes, namespace)
        selector = {**selector, LWS_WORKER_INDEX_LABEL: str(HEAD_RANK)}  # the API: head only
    api = _service(service.name, namespace, labels, selector, [_port("http", VLLM_PORT)])
    objects = [workload, api]
    if service.lora_config is not None:
        objects.append(_config_map(_lora_map(service.name), namespace, labels,
                                   {LORA_CONFIG: _lora_file(service)}))
    shared_env = nodes.serve_env if nodes else service.env  # addresses: the pod's own
    env = _secret(f"{service.name}-env", namespace, labels,
                  {key: value.encode() for key, value in shared_env.items()})
    return objects, [env]


# --------------------------------------------------------------------------- front door


def _front_door(plan: Plan, namespace: str, credentials: CredentialFiles, spec_name: str,
                service_type: str) -> tuple[list, list]:
    """nginx and the password verifier, configured as on the server but for the cluster."""
    # Each service is one Kubernetes Service whatever its replicas: nginx has one address per
    # service, the Service spreads the connections over the pods.
    one_address = replace(plan, services=[
        replace(svc, replicas=svc.replicas[:1], affinity="none", affinity_key=None)
        for svc in plan.services])
    context = {
        **template_context(one_address, spec_name),
        "service_hosts": {svc.name: service_host(svc.name, namespace) for svc in plan.services},
        "verifier_service": service_host(VERIFIER_SERVICE, namespace),
        "dns_resolver": None,  # the cluster's DNS address is the cluster's own: no stapling
        "waker": None,  # the compose stack's (docs/sleep.md): here idle_sleep services stay awake
    }
    compose_files = {str(output.path): output.content
                     for output in generated_files(plan, spec_name)}
    nginx_labels = _labels(plan, NGINX_SERVICE, FRONT_DOOR)
    verifier_labels = _labels(plan, VERIFIER_SERVICE, VERIFIER)
    config = _config_map(FRONT_DOOR, namespace, nginx_labels, {
        "nginx.conf": render_template("nginx.conf.j2", context),
        **{name: compose_files[f"nginx/{name}"] for name in DOOR_MODULES},
        "kit-routes.json": compose_files["nginx/kit-routes.json"],
    })
    keys = _secret(f"{FRONT_DOOR}-keys", namespace, nginx_labels, {
        "keys.map": credentials.keys_map, "auth-state.conf": credentials.auth_state,
        "door-policy.json": credentials.door_policy})
    tls = _secret(f"{FRONT_DOOR}-tls", namespace, nginx_labels, {
        "tls.crt": credentials.server_crt, "tls.key": credentials.server_key},
        "kubernetes.io/tls")
    nginx_volume = _projected("kit", [
        ("ConfigMap", FRONT_DOOR, {"nginx.conf": "nginx.conf",
                                   **{name: name for name in DOOR_MODULES},
                                   "kit-routes.json": "kit-routes.json"}),
        ("Secret", f"{FRONT_DOOR}-keys", {"keys.map": "auth/keys.map",
                                          "auth-state.conf": "auth/auth-state.conf",
                                          "door-policy.json": "auth/door-policy.json"}),
        ("Secret", f"{FRONT_DOOR}-tls", {"tls.crt": "tls/server.crt",
                                         "tls.key": "tls/server.key"}),
    ])
    interval = plan.healthcheck_interval
    nginx_mounts = [{"name": "kit", "mountPath": NGINX_MOUNT, "readOnly": True}]
    if plan.usage is not None:
        nginx_mounts.append({"name": ledger.SPOOL_VOLUME,
                             "mountPath": ledger.DOOR_SPOOL_MOUNT})
    nginx = _nginx_container(
        "nginx", plan.nginx_image, plan.nginx_command, NGINX_CONF, nginx_mounts,
        [{"name": "https", "containerPort": 443, "protocol": "TCP"},
         {"name": "http", "containerPort": 80, "protocol": "TCP"}], interval)
    nginx_pod = {"terminationGracePeriodSeconds": NGINX_STOP_GRACE + STOP_GRACE,
                 "automountServiceAccountToken": False,  # nothing in the door talks to the API
                 "securityContext": {"fsGroup": NGINX_GID}, "containers": [nginx],
                 "volumes": [nginx_volume, *_scratch_volumes()]}
    verifier_files = ("nginx.conf", "verifier.js", "unknown-user.htpasswd")
    verifier_config = _config_map(VERIFIER_SERVICE, namespace, verifier_labels, {
        name: compose_files[f"nginx/verifier/{name}"] for name in verifier_files})
    htpasswd = _secret(f"{VERIFIER_SERVICE}-htpasswd", namespace, verifier_labels,
                       {"htpasswd": credentials.htpasswd})
    port = plan.nginx.verifier_port
    verifier_conf = f"{VERIFIER_MOUNT}/nginx.conf"
    verifier = _nginx_container(
        "verifier", plan.nginx_image, ["nginx", "-c", verifier_conf, "-g", "daemon off;"],
        verifier_conf,
        [{"name": "config", "mountPath": VERIFIER_MOUNT, "readOnly": True},
         {"name": "auth", "mountPath": VERIFIER_AUTH_MOUNT, "readOnly": True}],
        [{"name": "verify", "containerPort": port, "protocol": "TCP"}], interval)
    verifier_pod = {
        "terminationGracePeriodSeconds": NGINX_STOP_GRACE + STOP_GRACE,
        "securityContext": {"fsGroup": NGINX_GID}, "containers": [verifier],
        "volumes": [
            _projected("config", [("ConfigMap", VERIFIER_SERVICE,
                                    {name: name for name in verifier_files})]),
            _projected("auth", [("Secret", f"{VERIFIER_SERVICE}-htpasswd",
                                 {"htpasswd": "htpasswd"})]),
            *_scratch_volumes(),
        ],
    }
    if plan.usage is None:
        door = [_deployment(plan, namespace, NGINX_SERVICE, FRONT_DOOR, nginx_pod)]
    else:
        door = _with_ledger(plan, plan.usage, namespace, nginx_pod, nginx_labels)
    objects = [
        config,
        *door,
        _service(NGINX_SERVICE, namespace, nginx_labels, _selector(plan, NGINX_SERVICE),
                 [_port("https", plan.nginx.https_port, 443),
                  _port("http", plan.nginx.http_port, 80)], service_type),
        verifier_config,
        _deployment(plan, namespace, VERIFIER_SERVICE, VERIFIER, verifier_pod),
        _service(VERIFIER_SERVICE, namespace, verifier_labels,
                 _selector(plan, VERIFIER_SERVICE), [_port("verify", port)]),
    ]
    return objects, [keys, tls, htpasswd]


# --------------------------------------------------------------------------- usage ledger


def ledger_claim_size(usage: ledger.UsagePlan) -> str:
    """The ledger's PersistentVolumeClaim: max_disk + 25 %, whole GiB. The collector prunes by
    the size of its files, so the filesystem must hold more than that: its own overhead, the
    blocks it reserves for root (the collector is not root) and the day being appended, which
    is never pruned."""
    return f"{math.ceil(usage.max_bytes * LEDGER_HEADROOM / (1 << 30))}Gi"


# Runs as the collector's postStart hook, before nginx starts (the kubelet holds the pod's other
# containers until it completes): the spool is created by its reader, writable by nginx's group,
# so that the collector, which is not root, may give its disk back (fallocate needs the file
# open for writing). nginx's master opens the file it finds and keeps its owner and mode.
# A new spool must not carry the inode number the ledger's checkpoint names (ext4 hands a freed
# number out again, often at once): the collector would take it for the old pod's spool and skip
# its start. It never fails: a failed hook would keep nginx from starting; the collector's /health
# names a spool it cannot write ("the spool's disk is not given back").
_SPOOL_PATH = f"{ledger.COLLECTOR_SPOOL_MOUNT}/{ledger.SPOOL_FILE}"
SPOOL_CREATE = (
    "import contextlib, json, os\n"
    f"spool = {_SPOOL_PATH!r}\n"
    "try:\n"
    "    fd = os.open(spool, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)\n"
    "except OSError:  # there already: a restarted collector\n"
    "    raise SystemExit(0)\n"
    "with contextlib.suppress(OSError, ValueError, KeyError, TypeError):\n"
    f"    with open({ledger.LEDGER_MOUNT + '/' + ledger.STATE_FILE!r}) as state:\n"
    "        taken = json.load(state)['checkpoint']['inode']\n"
    "    if os.fstat(fd).st_ino == taken:  # another number: made while this one is held\n"
    "        fresh = os.open(spool + '.new', os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o660)\n"
    "        os.rename(spool + '.new', spool)\n"
    "        os.close(fd)\n"
    "        fd = fresh\n"
    "with contextlib.suppress(OSError):\n"
    f"    os.fchown(fd, -1, {NGINX_GID})\n"
    "with contextlib.suppress(OSError):\n"
    "    os.fchmod(fd, 0o660)\n"
    "os.close(fd)\n"
)
# Runs as the collector's preStop hook, after nginx has stopped (a sidecar stops after the
# pod's containers): waits until every line nginx flushed is in the ledger, since the spool's
# emptyDir goes with the pod. What it cannot wait for is named in the pod's events
# (FailedPreStopHook), not lost silently.
SPOOL_DRAIN = (
    "import json, sys, time, urllib.request\n"
    f"deadline = time.monotonic() + {USAGE_DRAIN - 2}\n"
    "while True:\n"
    "    try:\n"
    "        health = json.load(urllib.request.urlopen("
    f"{ledger.HEALTH_URL!r}, timeout=2))\n"
    "        pending = health['spool_pending_bytes']\n"
    "    except (OSError, ValueError) as error:\n"
    "        pending = str(error)\n"
    "    if pending == 0:\n"
    "        break\n"
    "    if time.monotonic() > deadline:\n"
    "        sys.exit(f'usage ledger: the spool was not read to its end ({pending} bytes left):"
    " those records go with this pod')\n"
    "    time.sleep(0.5)\n"
)


def _collector(plan: Plan, usage: dict) -> dict:
    """The collector as a native sidecar (an init container that keeps running): it starts
    before nginx and stops after it, so it reads every line nginx wrote. Hardened as the
    compose service and more: its own non-root user, read-only root, no capabilities, no
    privilege escalation; its port only on the pod's loopback."""
    return {
        "name": ledger.USAGE_SERVICE, "image": usage["image"], "restartPolicy": "Always",
        "command": ["python3", *usage["pod_command"]],
        "volumeMounts": [
            {"name": "usage-script", "mountPath": ledger.SCRIPT_MOUNT, "readOnly": True},
            {"name": "usage-models", "mountPath": USAGE_MODELS_MOUNT, "readOnly": True},
            {"name": ledger.SPOOL_VOLUME, "mountPath": ledger.COLLECTOR_SPOOL_MOUNT},
            {"name": ledger.LEDGER_VOLUME, "mountPath": ledger.LEDGER_MOUNT},
        ],
        # No readinessProbe: a sidecar's readiness is the pod's, and losing the collector must
        # not take the door out of its Service (records wait in the spool meanwhile).
        "livenessProbe": {"exec": {"command": ledger.HEALTH_ARGV},
                          "initialDelaySeconds": USAGE_START_PERIOD,
                          "periodSeconds": plan.healthcheck_interval,
                          "timeoutSeconds": PROBE_TIMEOUT, "failureThreshold": PROBE_FAILURES},
        "lifecycle": {"postStart": {"exec": {"command": ["python3", "-c", SPOOL_CREATE]}},
                      "preStop": {"exec": {"command": ["python3", "-c", SPOOL_DRAIN]}}},
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": USAGE_UID, "runAsGroup": USAGE_UID,
            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _with_ledger(plan: Plan, usage_plan: ledger.UsagePlan, namespace: str, pod: dict,
                 labels: dict) -> list[dict]:
    """The door with its ledger (docs/kubernetes.md): a StatefulSet, whose pod N is never
    started while the old pod N still runs, so each ledger has one writer; pod N's collector
    writes only to its own claim usage-ledger-nginx-N, which outlives the pod. The spool is
    an emptyDir the two containers share (it survives the collector's restarts)."""
    usage = usage_facts(plan)
    assert usage is not None
    script = {ledger.SCRIPT: ledger.SCRIPT}
    config = _config_map(ledger.USAGE_SERVICE, namespace, labels,
                         {ledger.SCRIPT: collector_script(),
                          ledger.MODELS_FILE: ledger_models(plan)})
    pod = {
        **pod,
        "terminationGracePeriodSeconds": pod["terminationGracePeriodSeconds"] + USAGE_DRAIN,
        "initContainers": [_collector(plan, usage)],
        "volumes": [*pod["volumes"], {"name": ledger.SPOOL_VOLUME, "emptyDir": {}},
                    _projected("usage-script", [("ConfigMap", ledger.USAGE_SERVICE, script)]),
                    _projected("usage-models", [("ConfigMap", ledger.USAGE_SERVICE,
                                                 {ledger.MODELS_FILE: ledger.MODELS_FILE})])],
    }
    door = _deployment(plan, namespace, NGINX_SERVICE, FRONT_DOOR, pod)
    door["kind"] = "StatefulSet"
    door["spec"]["volumeClaimTemplates"] = [{
        "metadata": {"name": ledger.LEDGER_VOLUME, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": ledger_claim_size(usage_plan)}}},
    }]
    # A ledger is an audit record: it stays when the StatefulSet is deleted or scaled down.
    door["spec"]["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain",
                                                            "whenScaled": "Retain"}
    return [config, door]


def _network_policies(plan: Plan, namespace: str) -> list[dict]:
    """Only the front door reaches vLLM and the verifier (the compose stack's private
    networks); a multi-node service's pods also reach each other (NCCL uses dynamic ports)."""

    def pods(component: str) -> dict:
        return {"podSelector": {"matchLabels": {PART_OF: plan.site, COMPONENT: component}}}

    def only_front_door(name: str, component: str, port: int) -> dict:
        return {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(name, namespace, _labels(plan, name, component)),
            "spec": {**pods(component), "policyTypes": ["Ingress"], "ingress": [{
                "from": [pods(FRONT_DOOR)], "ports": [{"protocol": "TCP", "port": port}]}]},
        }

    policies = [only_front_door("vllm-from-front-door", VLLM, VLLM_PORT),
                only_front_door("verifier-from-front-door", VERIFIER, plan.nginx.verifier_port)]
    if plan.usage is not None:  # the collector listens on the pod's loopback; this is the wall
        policies.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta("front-door-ports-only", namespace,
                              _labels(plan, "front-door-ports-only", FRONT_DOOR)),
            "spec": {**pods(FRONT_DOOR), "policyTypes": ["Ingress"], "ingress": [{
                "ports": [{"protocol": "TCP", "port": port} for port in (443, 80)]}]},
        })
    if plan.backend_internal:  # every model is local: no internet, as compose's backend network
        dns = [{"protocol": protocol, "port": 53} for protocol in ("UDP", "TCP")]
        policies.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta("vllm-no-egress", namespace, _labels(plan, "vllm-no-egress", VLLM)),
            "spec": {**pods(VLLM), "policyTypes": ["Egress"],
                     # other vLLM pods (a multi-node group's peers) and the names of the group
                     "egress": [{"to": [pods(VLLM)]}, {"ports": dns}]},
        })
    for service in plan.services:
        if service.multinode is not None:
            group = {"podSelector": {"matchLabels": _selector(plan, service.name)}}
            name = k8s_name(f"{service.name}{LWS_SUFFIX}", "the node policy of service")
            policies.append({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(name, namespace, _labels(plan, service.name, VLLM)),
                "spec": {**group, "policyTypes": ["Ingress"], "ingress": [{"from": [group]}]},
            })
    return policies


# --------------------------------------------------------------------------- the whole export


def cannot_do(plan: Plan) -> list[str]:
    """What the compose stack does that these manifests do not (printed by the command)."""
    notes = [
        "GPU index pinning: the device plugin hands out any free GPUs of a node "
        f"({GPU_RESOURCE} counts only), not the spec's gpus indices",
        f"models_root {plan.models_root} is a hostPath: every GPU node needs the models there",
        "proxy.bind is not applied: the front door's Service type decides where it listens",
        "start order: nginx does not wait for vLLM (compose's depends_on healthy); /health "
        "answers 503 and requests 502 until the services are ready",
        "credential changes (kit users/keys/rotate-password) reach the cluster only by "
        "exporting again, applying, and restarting the nginx and kit-auth workloads "
        "(`kubectl rollout restart`)",
        "NetworkPolicy needs a network plugin that enforces it; without one vLLM is reachable "
        "from every pod",
        "nginx's nofile ulimit and the json-file log rotation (50m x 5): the node's runtime "
        "and kubelet settings apply",
    ]
    shared = {gpu for s in plan.services for gpu in s.gpus
              if sum(gpu in other.gpus for other in plan.services) > 1}
    if shared:
        notes.append(f"GPU sharing: GPU(s) {', '.join(sorted(shared))} serve several services "
                     "here; in the cluster each service gets whole GPUs of its own")
    if plan.tls_mode == "files":
        notes.append("OCSP stapling is off: nginx would need the cluster DNS service's address")
    if any(len(s.replicas) > 1 for s in plan.services):
        notes.append("replicas: nginx reaches each service through its Service, which spreads "
                     "connections itself; least-connections across replicas, routing affinity "
                     "and kit up's drain-first rolling update do not apply (the Deployment "
                     "replaces one pod at a time)")
    if plan.observability is not None:
        notes.append("observability: Prometheus, Grafana and the front door's figures are not "
                     "exported (nor /grafana/); scrape the vLLM pods' /metrics on port "
                     f"{VLLM_PORT} with the cluster's own monitoring")
        if plan.observability.alerts is not None:
            notes.append("observability.alerts: Alertmanager and kit's alert rules are not "
                         "exported either; route the cluster's own Prometheus alerts to your "
                         "receivers (docs/observability.md lists each alert and what to do)")
    if plan.usage is not None:
        notes.append(
            "usage ledger: one per front-door pod, in its claim usage-ledger-nginx-N "
            f"({ledger_claim_size(plan.usage)}, the cluster's default StorageClass: without one "
            "the door stays Pending); the door is a StatefulSet, so an update replaces its pod "
            "instead of starting the new one first (a ledger has one writer): a short outage "
            "unless scaled to 2; `kit usage` and `kit audit` read a Docker engine, not the "
            "cluster: copy the ledger out (docs/kubernetes.md); its figures are on the pod's "
            f"loopback (port {ledger.USAGE_PORT}), not scraped")
    if plan.waker is not None:
        groups = sorted({s.swap_group for s in plan.services if s.swap_group})
        notes.append(
            f"idle_sleep: {', '.join(plan.waker.names())} run awake for good: kit's waker is "
            "not exported, so nothing puts them to sleep nor wakes them, and their pods start "
            "without sleep mode and vLLM's development routes (docs/sleep.md, Kubernetes)"
            + (f"; swap group(s) {', '.join(groups)}: each member needs GPUs of its own there"
               if groups else ""))
    if any(s.multinode for s in plan.services):
        notes.append("multi-node services: a LeaderWorkerSet (its controller must be installed) "
                     "on the pod network; host networking and the spec's network_interface and "
                     "node addresses do not apply, VLLM_HOST_IP is the pod's IP")
    return notes


def awake_for_good(plan: Plan) -> Plan:
    """The plan as the cluster runs it: no waker (it is the compose stack's, docs/sleep.md), so
    the idle_sleep services start without sleep mode and without vLLM's development routes
    (VLLM_SERVER_DEV_MODE), which nothing would use there; nginx has no wake hook."""
    if plan.waker is None:
        return plan
    sleepers = set(plan.waker.names())
    services = [
        replace(service,
                command=[arg for arg in service.command if arg != SLEEP_MODE_FLAG],
                env={key: value for key, value in service.env.items() if key != DEV_MODE_ENV},
                swap_group=None)
        if service.name in sleepers else service
        for service in plan.services
    ]
    return replace(plan, services=services, waker=None)


def export(plan: Plan, credentials: CredentialFiles, *, namespace: str, service_type: str,
           spec_name: str) -> Export:
    """Every manifest of the site, one file per part; Secrets in their own 0600 file."""
    if plan.acme is not None:
        raise BadInput("tls.mode acme runs certbot beside nginx, which kit does not export",
                       fix="issue the certificate in the cluster (e.g. cert-manager) and use "
                       "tls.mode files with it, or self-signed")
    k8s_name(namespace, "namespace")
    notes = cannot_do(plan)
    # The cluster has no Prometheus/Grafana/door-figures of kit's: nginx must not log or route
    # to them, so its config is rendered as for a site without observability.
    plan = replace(plan, observability=None)
    plan = awake_for_good(plan)
    for service in plan.services:
        k8s_name(service.name, "service")
    files: dict[str, list[dict]] = {"00-namespace.yaml": [{
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {PART_OF: plan.site}},
    }]}
    secrets: list[dict] = []
    for service in plan.services:
        objects, service_secrets = _vllm_objects(plan, service, namespace)
        files[f"service-{service.name}.yaml"] = objects
        secrets += service_secrets
    front, front_secrets = _front_door(plan, namespace, credentials, spec_name, service_type)
    files["front-door.yaml"] = front
    secrets += front_secrets
    files["network-policy.yaml"] = _network_policies(plan, namespace)
    if plan.offline:
        _pull_if_not_present(files)
    _unique([obj for objects in (*files.values(), secrets) for obj in objects])
    header = (f"# Generated by kit from {spec_name} (`kit export k8s`): change the spec and "
              "export again, not this file.\n")
    outputs = [Output(Path(name), (header + _dump(objects)).encode())
               for name, objects in files.items()]
    outputs.append(Output(Path(SECRETS_FILE), (header + _dump(secrets)).encode(), 0o600,
                          secret=True))
    return Export(outputs, notes)


def _pull_if_not_present(value: object) -> None:
    """An offline site's containers (every pod template's, init containers too) take the image
    their node has and never ask a registry for a tag they hold (`:latest` included). Not
    `Never`: an air-gapped cluster usually serves images from its own registry, which
    IfNotPresent still reaches when a node lacks one (docs/offline.md)."""
    if isinstance(value, dict):
        for key in ("containers", "initContainers"):
            for container in value.get(key) or []:
                container["imagePullPolicy"] = "IfNotPresent"
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            _pull_if_not_present(item)


def _unique(objects: list[dict]) -> None:
    """Two objects of one kind and name would overwrite each other when applied; a
    LeaderWorkerSet also creates a headless Service of its own name."""
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        keys = [(obj["kind"], obj["metadata"]["name"])]
        if obj["kind"] == "LeaderWorkerSet":
            keys.append(("Service", obj["metadata"]["name"]))
        for key in keys:
            if key in seen:
                raise BadInput(f"two {key[0]} objects would be named {key[1]!r}",
                               fix="rename one of the services in the spec")
            seen.add(key)


class _Dumper(yaml.SafeDumper):
    """The safe dumper, with file contents (nginx.conf, the door's njs) as readable `|` blocks and
    no anchors: a value used twice is written twice, as `kubectl` users read manifests."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None  # PyYAML falls back to quoting where `|` cannot hold it
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _dump(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         width=100, allow_unicode=True)


STATE_DIR = ".kit-export"  # in the output folder: the manifest and journal of the export


@dataclass
class ExportResult:
    changes: list[Change]
    notes: list[str]
    stale: list[str]  # files of an earlier export that this one no longer writes
    # (kind, name, namespace) of objects the rewritten files held and no longer hold
    dropped: list[tuple[str, str, str]]

    def summary(self, out: Path) -> list[str]:
        lines = [f"{'created' if c.old is None else 'updated'} {out / c.output.path}"
                 for c in self.changes] or [f"no change: {out} already holds this export"]
        lines += [f"warning: {out / name} is from an earlier export and no longer part of the "
                  "site: delete it before `kubectl apply`" for name in self.stale]
        lines += [f"warning: {kind} {name} of the earlier export is no longer part of it and "
                  "`kubectl apply` leaves it running: after applying, `kubectl delete -n "
                  f"{namespace} {kind.lower()} {name}`" for kind, name, namespace in self.dropped]
        lines.append("Kubernetes does not do what the compose stack does here:")
        lines += [f"  - {note}" for note in self.notes]
        lines.append(f"apply with: kubectl apply -f {out}")
        return lines


def export_site(site: Site, out: Path, *, namespace: str | None, force: bool) -> ExportResult:
    """`kit export k8s`: the manifests written into `out` as one transaction, hand edits kept
    unless `force` (the same rules as `kit render`, with the state in out/.kit-export)."""
    spec = site.spec
    plan = build_plan(spec)
    result = export(plan, CredentialFiles.read(site.layout), namespace=namespace or spec.site,
                    service_type=spec.kubernetes.service_type, spec_name=site.spec_path.name)
    state_dir = out / STATE_DIR
    try:
        recover(out, state_dir)
        changes = pending_changes(out, result.files)
        manifest = read_manifest(state_dir / "manifest.json", force=force)
        edited = hand_edits(out, changes, manifest)
        if edited and not force:
            raise BadInput(
                "these manifests were edited by hand since kit exported them:\n"
                + "\n".join(change.diff for change in edited),
                fix="move the change into the spec, or export again with --force to overwrite",
            )
        files = {**manifest, **{str(c.output.path): digest(c.output.content) for c in changes}}
        written = {str(output.path) for output in result.files}
        commit(out, state_dir, changes, manifest_content(files) if changes else None)
    except OSError as error:
        raise write_failure(error, out) from None
    stale = sorted(name for name in files if name not in written)
    return ExportResult(changes, result.notes, stale, dropped_objects(changes))


def _objects_in(content: bytes) -> set[tuple[str, str, str]]:
    """(kind, name, namespace) of each object in a manifest file; none when it does not parse
    (a hand edit, refused or overwritten before this is asked)."""
    try:
        return {(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace", ""))
                for obj in yaml.safe_load_all(content) if isinstance(obj, dict)}
    except (yaml.YAMLError, KeyError, TypeError, AttributeError):
        return set()


def dropped_objects(changes: list[Change]) -> list[tuple[str, str, str]]:
    """Objects the rewritten files held before and no longer hold: `kubectl apply` does not
    delete them (the front door's Deployment, replaced by a StatefulSet with the usage ledger,
    would keep serving without it)."""
    before = {obj for change in changes if change.old for obj in _objects_in(change.old)}
    now = {obj for change in changes for obj in _objects_in(change.output.content)}
    return sorted(before - now)
