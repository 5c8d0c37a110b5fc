"""The rendered compose file → the frozen desired state `kit up` converges to.

kit does not reinterpret the spec here: it reads compose/docker-compose.yml, the same file
`docker compose` runs, so both tools create the same containers. Every compose key the template
uses is translated; any other key is refused, so nothing in the file is silently ignored.

Names and labels follow Compose v2 (`<project>-<service>-1`, `<project>_<network>`, the
`com.docker.compose.*` labels) so `docker compose -p <site> ps/logs/down` see kit's stack.
The config hash is sha256 over the canonical JSON of what the engine is given. Unlike Compose
(docker/compose#11900) it folds in the digest of site files a service bind-mounts, except for the
proxy, whose mounted config is applied by an in-place reload instead of a recreate.
"""

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from kit.engine.envfile import parse_env_file
from kit.errors import KitError
from kit.layout import LORA_MOUNT, USAGE_MODELS_MOUNT, VERIFIER_AUTH_MOUNT, SiteLayout

# Compose's label names (docker/compose pkg/api/labels.go), all in one place.
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
CONFIG_HASH_LABEL = "com.docker.compose.config-hash"
CONTAINER_NUMBER_LABEL = "com.docker.compose.container-number"
ONEOFF_LABEL = "com.docker.compose.oneoff"
WORKING_DIR_LABEL = "com.docker.compose.project.working_dir"
CONFIG_FILES_LABEL = "com.docker.compose.project.config_files"
DEPENDS_ON_LABEL = "com.docker.compose.depends_on"
NETWORK_LABEL = "com.docker.compose.network"
VOLUME_LABEL = "com.docker.compose.volume"
VERSION_LABEL = "com.docker.compose.version"
# kit's own labels on the containers of a multi-replica service (compose's service label names
# the replica): the spec service it belongs to and its replica index.
REPLICA_SERVICE_LABEL = "io.kit.service"
REPLICA_INDEX_LABEL = "io.kit.replica"
# kit's labels on the containers of a service in a swap group (idle_sleep, docs/sleep.md): kit up
# starts the group's members one at a time, each put to sleep before the next starts.
SWAP_GROUP_LABEL = "io.kit.swap-group"
SLEEP_LEVEL_LABEL = "io.kit.sleep-level"

# The Compose release whose conventions kit follows (v2 names). Compose v1 reads this label on
# every container and fails without it; v2 only records it.
COMPOSE_VERSION = "2.0.0"

PROXY_SERVICE = "nginx"  # the template's front door: config changes reload it in place
VERIFIER_SERVICE = "kit-auth"  # the front door's password verifier (its own nginx)
ACME_SERVICE = "certbot"  # the ACME client of tls.mode acme
PROMETHEUS_SERVICE = "prometheus"  # observability.enabled
GRAFANA_SERVICE = "grafana"  # observability.enabled, reached through the front door only
DOOR_FIGURES_SERVICE = "door-figures"  # observability.enabled: the front door's request figures
ALERTMANAGER_SERVICE = "alertmanager"  # observability.alerts: kit's alerts delivered
WAKER_SERVICE = "sleep-waker"  # idle_sleep: wakes a sleeping model for the door, sleeps idle ones
# The compose services kit renders beside the spec's: a spec service may not take their names.
KIT_SERVICES = {
    PROXY_SERVICE: "the front door",
    VERIFIER_SERVICE: "the front door's password verifier",
    ACME_SERVICE: "the ACME client (tls.mode acme)",
    PROMETHEUS_SERVICE: "the metrics store (observability)",
    GRAFANA_SERVICE: "the dashboards (observability)",
    DOOR_FIGURES_SERVICE: "the front door's figures (observability)",
    WAKER_SERVICE: "the waker of sleeping models (idle_sleep)",
    ALERTMANAGER_SERVICE: "the alerts' delivery (observability.alerts)",
}
# Site files a service re-reads on every request: a change needs neither reload nor recreate,
# so they stay out of its digest (the verifier's auth_basic reads htpasswd per request; a
# credential change must not restart it under the logins it is checking).
READ_PER_REQUEST = {VERIFIER_SERVICE: {VERIFIER_AUTH_MOUNT}}
# Mounted site files whose changes kit applies to the running container itself, so they are no
# part of its identity: a replica's LoRA adapters (kit adapters and kit up hot-load them; vLLM
# reads the file again at its next start), the model names the usage ledger's collector records
# (it reads the file again when it changes).
APPLIED_LIVE = {LORA_MOUNT, USAGE_MODELS_MOUNT}
CONTAINER_NUMBER = 1  # kit runs one container per service

SERVICE_KEYS = {
    "image", "entrypoint", "command", "environment", "env_file", "volumes", "ipc", "deploy",
    "healthcheck", "restart", "stop_grace_period", "stop_signal", "logging", "networks", "ports",
    "tmpfs", "read_only", "security_opt", "ulimits", "depends_on", "labels",
    "network_mode", "extra_hosts", "pull_policy",
}
# An offline site's services (kit.plan.build.Plan.pull_policy): kit up applies it by pulling
# nothing for such a site (kit.converge.preflight.ensure_images refuses a missing image)
NEVER_PULL = "never"
HOST_NETWORK = "host"  # network_mode of every node of a multi-node service (kit/plan/multinode.py)
DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)")
DURATION_SECONDS = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Mount:
    type: Literal["bind", "volume"]
    source: str  # absolute host path, or the engine's volume name
    target: str
    read_only: bool


@dataclass(frozen=True)
class GpuRequest:
    driver: str
    device_ids: tuple[str, ...]
    capabilities: tuple[str, ...]


@dataclass(frozen=True)
class PortBinding:
    host_ip: str
    host_port: int
    container_port: int
    protocol: str = "tcp"


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval: float  # seconds
    timeout: float
    retries: int
    start_period: float

    @property
    def deadline(self) -> float:
        """Seconds after start by which the engine has declared the container healthy or not."""
        return self.start_period + self.retries * (self.interval + self.timeout)


@dataclass(frozen=True)
class ContainerConfig:
    """Everything the engine is given for one service; its canonical JSON is the config hash."""

    image: str
    entrypoint: tuple[str, ...] | None  # None: the image's own
    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    tmpfs: tuple[str, ...]
    read_only: bool
    security_opt: tuple[str, ...]
    ulimits: tuple[tuple[str, int, int], ...]  # (name, soft, hard)
    ipc_mode: str | None
    gpus: tuple[GpuRequest, ...]
    healthcheck: Healthcheck | None
    restart: str
    stop_signal: str | None
    stop_timeout: int | None  # seconds
    log_driver: str
    log_options: tuple[tuple[str, str], ...]
    networks: tuple[str, ...]  # engine network names; the first is attached at create
    ports: tuple[PortBinding, ...]
    # A multi-node service's nodes share their host's network (HOST_NETWORK, then no
    # networks); the front door reaches its head by extra_hosts ("name:address").
    network_mode: str | None = None
    extra_hosts: tuple[str, ...] = ()
    # Fixed addresses (engine network name, IPv4) on networks with a subnet of their own: the
    # front door's is the one Grafana's auth proxy trusts.
    addresses: tuple[tuple[str, str], ...] = ()

    def address(self, network: str) -> str | None:
        return dict(self.addresses).get(network)


@dataclass(frozen=True)
class ServiceState:
    name: str
    container_name: str
    config: ContainerConfig
    depends_on: tuple[tuple[str, str], ...]  # (service, condition)
    config_hash: str
    labels: dict[str, str]  # the container's labels, as Compose v2 sets them
    site_files_digest: str | None  # digest of the site files it bind-mounts (None: mounts none)
    reloadable: bool  # a change of those files is applied by a reload, not a recreate

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return tuple(i for request in self.config.gpus for i in request.device_ids)

    def argument(self, flag: str) -> str | None:
        """The value its command gives `flag` (vLLM's `--flag value` form), None without it."""
        argv = self.config.command
        return next((value for name, value in zip(argv, argv[1:], strict=False)
                     if name == flag), None)


@dataclass(frozen=True)
class NetworkState:
    key: str  # the compose file's name for it
    name: str  # the engine's name: <project>_<key>
    internal: bool
    labels: dict[str, str]
    subnet: str | None = None  # compose's ipam: one IPv4 subnet and its gateway, or the engine's
    gateway: str | None = None


@dataclass(frozen=True)
class VolumeState:
    key: str
    name: str
    labels: dict[str, str]


@dataclass(frozen=True)
class DesiredState:
    project: str
    working_dir: Path
    config_file: Path
    services: tuple[ServiceState, ...]  # in start order: dependencies first
    networks: tuple[NetworkState, ...]
    volumes: tuple[VolumeState, ...]

    def service(self, name: str) -> ServiceState:
        return next(s for s in self.services if s.name == name)


def project_filter(project: str) -> list[str]:
    """The label filter that selects a project's resources, as Compose does."""
    return [f"{PROJECT_LABEL}={project}"]


def project_volume(project: str, key: str) -> VolumeState:
    """A project's named volume as Compose names and labels it (`kit down --volumes` removes
    it): the compose file's volumes, and kit's own outside it (the server's weights hashes)."""
    return VolumeState(key, f"{project}_{key}", {PROJECT_LABEL: project,
                                                  VERSION_LABEL: COMPOSE_VERSION,
                                                  VOLUME_LABEL: key})


def load_desired(layout: SiteLayout, project: str, path: Path | None = None) -> DesiredState:
    """Parse the rendered compose file of a site (or `path`, a worker node's compose file in
    its compose folder) into its desired state."""
    path = path or layout.compose_file
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise KitError(
            f"{path} does not exist", fix="run `kit render` (or `kit up`) on the spec first"
        ) from None
    except (OSError, yaml.YAMLError) as error:
        raise KitError(
            f"cannot read {path}: {error}", fix="re-render it: kit render --force"
        ) from None
    return parse_compose(document, project, path.resolve(), layout.root.resolve())


def parse_compose(
    document: Any, project: str, config_file: Path, site_root: Path
) -> DesiredState:
    """The compose document → desired state; bind sources resolve against the file's folder."""
    _expect(isinstance(document, dict) and isinstance(document.get("services"), dict),
            config_file, "has no services mapping")
    working_dir = config_file.parent
    owner = {PROJECT_LABEL: project, VERSION_LABEL: COMPOSE_VERSION}
    networks = tuple(
        NetworkState(
            key, f"{project}_{key}", bool((body or {}).get("internal", False)),
            {**owner, NETWORK_LABEL: key}, *_ipam(body or {}, key, config_file),
        )
        for key, body in (document.get("networks") or {}).items()
    )
    volumes = tuple(project_volume(project, key) for key in (document.get("volumes") or {}))
    context = _Context(project, config_file, working_dir, site_root, networks, volumes)
    services = [_service(name, body or {}, context) for name, body in document["services"].items()]
    return DesiredState(
        project=project,
        working_dir=working_dir,
        config_file=config_file,
        services=tuple(_start_order(services, config_file)),
        networks=networks,
        volumes=volumes,
    )


@dataclass(frozen=True)
class _Context:
    project: str
    config_file: Path
    working_dir: Path
    site_root: Path
    networks: tuple[NetworkState, ...]
    volumes: tuple[VolumeState, ...]


def _expect(condition: bool, config_file: Path, problem: str) -> None:
    if not condition:
        raise KitError(
            f"{config_file} {problem}",
            fix="kit renders this file; re-render it with `kit render --force`",
        )


def _literal(value: str) -> str:
    """A command argument as compose passes it on: `$$` is a literal `$`."""
    return value.replace("$$", "$")


def _service(name: str, body: dict, context: _Context) -> ServiceState:
    where = f"services.{name}"
    _expect(body.get("network_mode") in (None, HOST_NETWORK), context.config_file,
            f"{where}.network_mode is not {HOST_NETWORK!r}, the only one kit renders")
    _expect(body.get("pull_policy") in (None, NEVER_PULL), context.config_file,
            f"{where}.pull_policy is not {NEVER_PULL!r}, the only one kit renders")
    unknown = sorted(set(body) - SERVICE_KEYS)
    _expect(not unknown, context.config_file,
            f"{where} uses {', '.join(unknown)}, which kit up does not apply")
    mounts, site_sources = _mounts(
        body.get("volumes") or [], context, where, READ_PER_REQUEST.get(name, set()) | APPLIED_LIVE
    )
    logging, grace = body.get("logging") or {}, body.get("stop_grace_period")
    config = ContainerConfig(
        image=str(body["image"]),
        entrypoint=tuple(str(arg) for arg in body["entrypoint"]) if "entrypoint" in body else None,
        command=tuple(_literal(str(arg)) for arg in body.get("command") or ()),
        environment=_pairs({
            **_env_files(body.get("env_file"), context, where),
            **(body.get("environment") or {}),  # as in Compose: environment wins over env_file
        }),
        mounts=mounts,
        tmpfs=tuple(body.get("tmpfs") or ()),
        read_only=bool(body.get("read_only", False)),
        security_opt=tuple(body.get("security_opt") or ()),
        ulimits=tuple(
            (key, int(limit["soft"]), int(limit["hard"]))
            if isinstance(limit, dict) else (key, int(limit), int(limit))
            for key, limit in sorted((body.get("ulimits") or {}).items())
        ),
        ipc_mode=body.get("ipc"),
        gpus=_gpus(body.get("deploy") or {}),
        healthcheck=_healthcheck(body.get("healthcheck")),
        restart=str(body.get("restart", "no")),
        stop_signal=body.get("stop_signal"),
        stop_timeout=round(parse_duration(grace)) if grace is not None else None,
        log_driver=str(logging.get("driver", "json-file")),
        log_options=_pairs(logging.get("options")),
        networks=_networks(body.get("networks") or [], context, where),
        addresses=_addresses(body.get("networks") or [], context, where),
        ports=tuple(_port(spec, context, where) for spec in body.get("ports") or ()),
        network_mode=body.get("network_mode"),
        extra_hosts=tuple(str(entry) for entry in body.get("extra_hosts") or ()),
    )
    reloadable = name == PROXY_SERVICE
    files_digest = digest_paths(site_sources) if site_sources else None
    depends_on = tuple(
        (dep, str((cond or {}).get("condition", "service_started")))
        for dep, cond in _depends_on(body.get("depends_on")).items()
    )
    # What Compose v2 labels a container with, so its ps/logs/down find kit's containers.
    identity = {
        PROJECT_LABEL: context.project,
        SERVICE_LABEL: name,
        CONTAINER_NUMBER_LABEL: str(CONTAINER_NUMBER),
        ONEOFF_LABEL: "False",
        WORKING_DIR_LABEL: str(context.working_dir),
        CONFIG_FILES_LABEL: str(context.config_file),
        VERSION_LABEL: COMPOSE_VERSION,
        **{str(key): str(value) for key, value in (body.get("labels") or {}).items()},
    }
    digest = config_hash(config, identity, None if reloadable else files_digest,
                         live_networks=reloadable)
    labels = {**identity, CONFIG_HASH_LABEL: digest}
    if depends_on:  # not hashed (as in Compose): a new backend must not recreate the proxy
        labels[DEPENDS_ON_LABEL] = ",".join(f"{dep}:{cond}:false" for dep, cond in depends_on)
    return ServiceState(
        name=name,
        container_name=f"{context.project}-{name}-{CONTAINER_NUMBER}",
        config=config,
        depends_on=depends_on,
        config_hash=digest,
        labels=labels,
        site_files_digest=files_digest,
        reloadable=reloadable,
    )


def config_hash(
    config: ContainerConfig, labels: dict[str, str], site_files_digest: str | None, *,
    live_networks: bool = False,
) -> str:
    """sha256 of the canonical JSON of the engine config and labels (+ mounted site files).

    The multi-node keys count only when set, so a stack created before kit knew them keeps
    its hashes (no recreate on upgrade). `live_networks` (the front door, on one network per
    service): its networks do not count, kit connects and disconnects them in place, so a
    service added or removed reloads it instead of recreating it."""
    fields = asdict(config)
    if live_networks:
        del fields["networks"]
    for key in ("network_mode", "extra_hosts", "addresses"):
        if not fields[key]:
            del fields[key]
    document = {"config": fields, "labels": labels, "site_files": site_files_digest}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def digest_paths(paths: list[Path]) -> str:
    """One digest over every file below `paths` (names and contents), stable across runs."""
    hasher = hashlib.sha256()
    for root in sorted(paths):
        if not root.exists():  # the preflight refuses to start it; the digest only notes it
            hasher.update(f"missing {root.name}\0".encode())
            continue
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            hasher.update(str(file.relative_to(root.parent)).encode() + b"\0")
            hasher.update(hashlib.sha256(file.read_bytes()).digest())
    return hasher.hexdigest()


def parse_duration(value: Any) -> float:
    """A compose duration ("10s", "1m30s", "500ms", or a number of seconds) in seconds."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise KitError(f"{value!r} is not a compose duration", fix="use e.g. 10s, 1m30s, 500ms")
    return sum(float(number) * DURATION_SECONDS[unit] for number, unit in parts)


def _mounts(
    entries: list, context: _Context, where: str, read_per_request: set[str]
) -> tuple[tuple[Mount, ...], list[Path]]:
    """The mounts, plus the site's own config files among the bind sources.

    Those are the read-only binds with a relative source: files kit rendered beside the compose
    file, which the container reads when it starts. Absolute sources are host data (models,
    caches) that must never be read for a digest; writable binds are state the container itself
    writes; targets in `read_per_request` are re-read by the service as they change.
    """
    mounts, site_sources = [], []
    volume_names = {v.key: v.name for v in context.volumes}
    for entry in entries:
        _expect(isinstance(entry, dict), context.config_file,
                f"{where}.volumes uses the short syntax; kit renders the long one")
        kind, source = entry["type"], str(entry["source"])
        if kind == "bind":
            path = Path(source)
            if not path.is_absolute():
                path = (context.working_dir / path).resolve()
                if entry.get("read_only") and entry["target"] not in read_per_request:
                    site_sources.append(path)
            source = str(path)
        elif kind == "volume":
            _expect(source in volume_names, context.config_file,
                    f"{where}.volumes names volume {source!r}, which is not declared")
            source = volume_names[source]
        else:
            _expect(False, context.config_file, f"{where}.volumes has type {kind!r}")
        mounts.append(Mount(kind, source, str(entry["target"]), bool(entry.get("read_only"))))
    return tuple(mounts), site_sources


def _env_files(names: Any, context: _Context, where: str) -> dict[str, str]:
    """The variables of a service's env files (kit writes the quoted form of kit.engine.envfile)."""
    if isinstance(names, str):
        names = [names]
    env: dict[str, str] = {}
    for name in names or []:
        path = context.working_dir / str(name)
        try:
            values, bad_line = parse_env_file(path.read_text())
        except OSError as error:
            raise KitError(
                f"cannot read {path} ({where}.env_file): {error.strerror or error}",
                fix="run kit as the user that rendered the site (the file is 0600: it may hold "
                "tokens), or re-render it with `kit render`",
            ) from None
        _expect(bad_line is None, context.config_file,
                f"{where}.env_file {path} line {bad_line} is not a KEY=\"value\" line kit wrote")
        env.update(values)
    return env


def _gpus(deploy: dict) -> tuple[GpuRequest, ...]:
    devices = ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []
    return tuple(
        GpuRequest(
            driver=str(device.get("driver", "nvidia")),
            device_ids=tuple(str(i) for i in device.get("device_ids") or ()),
            capabilities=tuple(device.get("capabilities") or ()),
        )
        for device in devices
    )


def _healthcheck(body: dict | None) -> Healthcheck | None:
    if not body:
        return None
    return Healthcheck(
        test=tuple(_literal(str(part)) for part in body["test"]),
        interval=parse_duration(body.get("interval", "30s")),
        timeout=parse_duration(body.get("timeout", "30s")),
        retries=int(body.get("retries", 3)),
        start_period=parse_duration(body.get("start_period", "0s")),
    )


def _networks(keys: list | dict, context: _Context, where: str) -> tuple[str, ...]:
    names = {n.key: n.name for n in context.networks}
    for key in keys:
        _expect(key in names, context.config_file,
                f"{where}.networks names {key!r}, which is not declared")
    return tuple(names[key] for key in keys)


def _ipam(body: dict, key: str, config_file: Path) -> tuple[str | None, str | None]:
    """(subnet, gateway) of a network's `ipam.config` (one pool, as kit renders), or Nones."""
    pools = (body.get("ipam") or {}).get("config") or []
    _expect(len(pools) <= 1, config_file, f"networks.{key}.ipam has more than one pool")
    if not pools:
        return None, None
    return str(pools[0]["subnet"]), (str(pools[0]["gateway"]) if "gateway" in pools[0] else None)


def _addresses(keys: list | dict, context: _Context, where: str) -> tuple[tuple[str, str], ...]:
    """The `ipv4_address` a service's long-form `networks:` fixes on each network; the network
    must have a subnet of its own (the engine refuses a fixed address otherwise)."""
    if not isinstance(keys, dict):
        return ()
    subnets = {n.key: n for n in context.networks}
    found = []
    for key, body in keys.items():
        address = (body or {}).get("ipv4_address")
        if address is None:
            continue
        _expect(subnets[key].subnet is not None, context.config_file,
                f"{where}.networks.{key}.ipv4_address needs networks.{key}.ipam")
        found.append((subnets[key].name, str(address)))
    return tuple(found)


def _port(spec: str, context: _Context, where: str) -> PortBinding:
    """Compose's short port syntax `[ip:]host:container[/proto]`; IPv6 in brackets or bare."""
    text, _, protocol = str(spec).partition("/")
    ip_part, _, rest = text.rpartition(":")
    host_ip, _, host_port = ip_part.rpartition(":")
    _expect(host_port.isdigit() and rest.isdigit(), context.config_file,
            f"{where}.ports has {spec!r}; kit expects ip:host_port:container_port")
    host_ip = host_ip.strip("[]") or "0.0.0.0"
    return PortBinding(host_ip, int(host_port), int(rest), protocol or "tcp")


def _pairs(mapping: dict | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(key), str(value)) for key, value in (mapping or {}).items()))


def _depends_on(value: Any) -> dict:
    if isinstance(value, list):
        return {name: {} for name in value}
    return dict(value or {})


def _start_order(services: list[ServiceState], config_file: Path) -> list[ServiceState]:
    """Dependencies before their dependents (the order containers are created in)."""
    by_name = {s.name: s for s in services}
    ordered: list[ServiceState] = []
    visiting: set[str] = set()

    def visit(service: ServiceState) -> None:
        if service in ordered:
            return
        _expect(service.name not in visiting, config_file,
                f"has a depends_on cycle at {service.name}")
        visiting.add(service.name)
        for dependency, _ in service.depends_on:
            _expect(dependency in by_name, config_file,
                    f"services.{service.name} depends on unknown service {dependency!r}")
            visit(by_name[dependency])
        ordered.append(service)

    for service in services:
        visit(service)
    return ordered
