"""What runs now: a snapshot of a project's containers, networks and volumes, found by label.

Only plain data leaves this module; `reconcile` compares it with the desired state. What the
proxy has loaded cannot be read from a label (its config is reloaded in place), so kit records it
in the site's state dir when it creates or reloads the proxy, and reads it back here.
"""

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from kit.engine.desired import (
    CONFIG_HASH_LABEL,
    CONTAINER_NUMBER_LABEL,
    DEPENDS_ON_LABEL,
    NETWORK_LABEL,
    ONEOFF_LABEL,
    REPLICA_INDEX_LABEL,
    REPLICA_SERVICE_LABEL,
    SERVICE_LABEL,
    VOLUME_LABEL,
    project_filter,
)
from kit.engine.docker_api import Engine
from kit.engine.door_ports import PortAnswer
from kit.files import atomic_write
from kit.state import json_object, read_state


@dataclass(frozen=True)
class ContainerState:
    id: str
    name: str
    service: str
    number: int
    config_hash: str | None
    state: str  # created | running | restarting | paused | exited | dead
    health: str | None  # starting | healthy | unhealthy; None without a healthcheck
    restart_count: int
    exit_code: int
    started_at: datetime | None
    image: str  # the reference it was created from
    image_id: str
    gpu_ids: tuple[str, ...]
    host_ports: tuple[tuple[str, int], ...]  # (host ip, host port) it publishes
    depends_on: tuple[str, ...] = ()  # services it was started after (Compose's label)
    replica_of: str | None = None  # the spec service of a multi-replica service's container
    replica: int | None = None  # and its replica index there
    networks: tuple[str, ...] = ()  # the engine networks it is attached to

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def spec_service(self) -> str:
        """The spec service this container serves: one place that knows replicas are named
        apart from their service (kit/spec/replicas.py)."""
        return self.replica_of or self.service


@dataclass(frozen=True)
class NetworkFound:
    name: str
    key: str
    internal: bool
    subnets: tuple[str, ...] = ()  # its IPAM pools (the engine's pick when none was asked)


@dataclass(frozen=True)
class ProxyLoaded:
    """The site files the proxy container last loaded (at its start or a reload)."""

    container_id: str
    files_digest: str


@dataclass(frozen=True)
class ObservedState:
    containers: tuple[ContainerState, ...]
    networks: tuple[NetworkFound, ...]
    volumes: tuple[str, ...]  # engine names
    image_ids: dict[str, str | None]  # desired image reference → local image id (None: absent)
    proxy_loaded: ProxyLoaded | None
    door: tuple[PortAnswer, ...] = ()  # the running front door's ports, when knocked on

    def of(self, service: str) -> list[ContainerState]:
        return [c for c in self.containers if c.service == service]

    def running(self, service: str) -> ContainerState | None:
        """The service's running container (a replica's, by its compose name), if one runs."""
        return next((c for c in self.of(service) if c.running), None)

    def network(self, name: str) -> NetworkFound | None:
        return next((n for n in self.networks if n.name == name), None)


def observe(
    engine: Engine, project: str, images: tuple[str, ...] = (), applied: Path | None = None
) -> ObservedState:
    """Snapshot the project's resources, the local ids of `images`, and the proxy record."""
    labels = project_filter(project)
    containers = [
        container_state(attrs)
        for attrs in engine.containers([*labels, f"{ONEOFF_LABEL}=False"])
        if attrs
    ]
    networks = [
        NetworkFound(n["Name"], (n.get("Labels") or {}).get(NETWORK_LABEL, ""), n["Internal"],
                     tuple(str(pool.get("Subnet")) for pool in
                           ((n.get("IPAM") or {}).get("Config") or [])))
        for n in engine.networks(labels)
    ]
    volumes = [
        v["Name"] for v in engine.volumes(labels) if VOLUME_LABEL in (v.get("Labels") or {})
    ]
    return ObservedState(
        containers=tuple(sorted(containers, key=lambda c: (c.service, c.number, c.name))),
        networks=tuple(networks),
        volumes=tuple(volumes),
        image_ids={ref: engine.image_id(ref) for ref in dict.fromkeys(images)},
        proxy_loaded=read_proxy_loaded(applied) if applied else None,
    )


def container_state(attrs: dict) -> ContainerState:
    """Inspect data → ContainerState (pure: tests feed it recorded inspect output)."""
    labels = attrs["Config"].get("Labels") or {}
    state = attrs["State"]
    requests = attrs["HostConfig"].get("DeviceRequests") or []
    bindings = attrs["HostConfig"].get("PortBindings") or {}
    return ContainerState(
        id=attrs["Id"],
        name=attrs["Name"].lstrip("/"),
        service=labels.get(SERVICE_LABEL, ""),
        number=int(labels.get(CONTAINER_NUMBER_LABEL, "0") or 0),
        config_hash=labels.get(CONFIG_HASH_LABEL),
        state=state["Status"],
        health=(state.get("Health") or {}).get("Status"),
        restart_count=int(attrs.get("RestartCount", 0)),
        exit_code=int(state.get("ExitCode", 0)),
        started_at=parse_time(state.get("StartedAt")),
        image=attrs["Config"]["Image"],
        image_id=attrs["Image"],
        gpu_ids=tuple(i for r in requests for i in r.get("DeviceIDs") or ()),
        host_ports=tuple(
            (b.get("HostIp") or "0.0.0.0", int(b["HostPort"]))
            for port_bindings in bindings.values()
            for b in port_bindings or ()
            if b.get("HostPort")
        ),
        depends_on=tuple(
            entry.split(":")[0] for entry in labels.get(DEPENDS_ON_LABEL, "").split(",") if entry
        ),
        replica_of=labels.get(REPLICA_SERVICE_LABEL),
        replica=int(labels[REPLICA_INDEX_LABEL]) if labels.get(REPLICA_INDEX_LABEL, "").isdigit()
        else None,
        networks=tuple(sorted((attrs.get("NetworkSettings") or {}).get("Networks") or {})),
    )


def parse_time(text: str | None) -> datetime | None:
    """The engine's RFC 3339 time with nanoseconds; None for its zero time."""
    if not text or text.startswith("0001-"):
        return None
    main, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(main).replace(
        microsecond=int((fraction + "000000")[:6]), tzinfo=UTC
    )


def read_proxy_loaded(path: Path) -> ProxyLoaded | None:
    return read_state(path, _proxy_loaded, fix="delete it: kit then reloads the proxy once to "
                      "know what it has loaded")


def _proxy_loaded(text: str) -> ProxyLoaded:
    record = json_object(text)["proxy"]
    return ProxyLoaded(str(record["container_id"]), str(record["files_digest"]))


def write_proxy_loaded(path: Path, loaded: ProxyLoaded | None) -> None:
    """Record (or forget, with None) what the proxy has loaded; atomic, like every state file."""
    if loaded is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, (json.dumps({"proxy": asdict(loaded)}, indent=1) + "\n").encode(), 0o600)
