"""Desired vs observed → the list of actions that converges the stack (pure; no engine).

Every decision `kit up` and `kit down` make is taken here, so the plan prints as text that tests
compare exactly, and an unchanged, healthy stack gives an empty plan. `kit.converge.apply`
only executes.

Order matters and is decided here: containers that must go are removed first (a vLLM container
holds GPU memory its replacement needs, so it is removed before the new one is created), then
networks and volumes, then services in dependency order. A service waits for the health of the
services it depends on before it is touched, and the proxy is reloaded after a backend it routes
to was replaced (nginx resolves upstream names when it loads its config).
"""

from dataclasses import dataclass

from kit.engine.desired import (
    PROXY_SERVICE,
    REPLICA_SERVICE_LABEL,
    SLEEP_LEVEL_LABEL,
    SWAP_GROUP_LABEL,
    DesiredState,
    NetworkState,
    ServiceState,
    VolumeState,
)
from kit.engine.observe import ContainerState, NetworkFound, ObservedState

NEW = "new"  # why an object is created that the stack has not had yet


@dataclass(frozen=True)
class RemoveContainer:
    container: ContainerState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"remove container {self.container.name}: {self.reason}"


@dataclass(frozen=True)
class RemoveNetwork:
    name: str
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"remove network {self.name}: {self.reason}"


@dataclass(frozen=True)
class CreateNetwork:
    network: NetworkState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"create network {self.network.name} ({self.reason})"


@dataclass(frozen=True)
class CreateVolume:
    volume: VolumeState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"create volume {self.volume.name} ({self.reason})"


@dataclass(frozen=True)
class RemoveVolume:
    name: str
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"remove volume {self.name}: {self.reason}"


@dataclass(frozen=True)
class CreateContainer:
    """Create and start the service's container."""

    service: ServiceState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"create container {self.service.container_name} ({self.reason})"


@dataclass(frozen=True)
class RecreateContainer:
    """Stop and remove the old container, then create and start the new one."""

    service: ServiceState
    old: ContainerState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"recreate container {self.old.name}: {self.reason}"


@dataclass(frozen=True)
class RollReplicas:
    """Replace changed replicas of one service one at a time (kit/converge/rollout.py): each leaves
    nginx, drains, is recreated on its GPUs, proves itself and comes back before the next."""

    service: str  # the spec service
    replicas: tuple[RecreateContainer, ...]
    is_change = True

    def __str__(self) -> str:
        names = ", ".join(r.old.name for r in self.replicas)
        return f"roll {self.service} one replica at a time ({names}): {self.replicas[0].reason}"


@dataclass(frozen=True)
class RetireReplica:
    """Remove a replica the spec no longer has once nginx reloaded without it and it drained
    (kit/converge/rollout.py), so shrinking a service cuts none of the streams it still carries."""

    container: ContainerState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"retire replica {self.container.name}: {self.reason}"


@dataclass(frozen=True)
class StartContainer:
    service: ServiceState
    container: ContainerState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"start container {self.container.name}: {self.reason}"


@dataclass(frozen=True)
class ReloadProxy:
    """Check the proxy's config in the container, then make it reload in place."""

    service: ServiceState
    container: ContainerState
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"reload {self.container.name}: {self.reason}"


@dataclass(frozen=True)
class RewireProxy:
    """Connect the running proxy to the networks of services added, and disconnect it from
    those of services removed, in place (each service has a network of its own): its streams
    go on, and the reload that follows routes to the new ones."""

    service: ServiceState
    container: ContainerState
    connect: tuple[str, ...]
    disconnect: tuple[str, ...]
    is_change = True

    def __str__(self) -> str:
        moves = [f"connect {', '.join(self.connect)}"] if self.connect else []
        moves += [f"disconnect {', '.join(self.disconnect)}"] if self.disconnect else []
        return f"rewire {self.container.name}: {'; '.join(moves)}"


@dataclass(frozen=True)
class SleepMember:
    """Put a swap group's member to sleep before another member starts (docs/sleep.md): its
    vLLM holds its GPU memory until then, and the next one's start-up profiling would fail."""

    service: ServiceState
    level: int
    reason: str
    is_change = True

    def __str__(self) -> str:
        return f"sleep {self.service.container_name}: {self.reason}"


@dataclass(frozen=True)
class WaitHealthy:
    """Wait until every one of these services reports healthy (a step, not a change)."""

    services: tuple[ServiceState, ...]
    reason: str
    is_change = False

    def __str__(self) -> str:
        names = ", ".join(s.name for s in self.services)
        return f"wait until healthy {names}: {self.reason}"


@dataclass(frozen=True)
class ReplicaAdapters:
    """What one running replica serves against what it declares (its --config file): the
    observation adapter actions are decided from (kit.converge.adapter_load.replica_adapters)."""

    service: str  # the spec service
    host: str  # its compose name
    container: ContainerState
    declared: dict[str, str]  # adapter → path, as the replica would load it at its start
    served: tuple[str, ...]
    task: str  # the gate's request: generate or embed


@dataclass(frozen=True)
class LoadAdapter:
    """Hot-load an adapter the spec declares on the running replicas that lack it, each gated
    with a 1-token completion, all or nothing; before the door routes it (docs/adapters.md)."""

    service: str
    adapter: str
    path: str
    replicas: tuple[tuple[str, ContainerState], ...]
    task: str
    is_change = True

    def __str__(self) -> str:
        names = ", ".join(host for host, _ in self.replicas)
        return f"load adapter {self.adapter} on {names}: declared, not loaded"


@dataclass(frozen=True)
class UnloadAdapter:
    """Unload an adapter the spec no longer declares, once the door stopped routing it and the
    requests on it already inside each replica's vLLM ended."""

    service: str
    adapter: str
    replicas: tuple[tuple[str, ContainerState], ...]
    is_change = True

    def __str__(self) -> str:
        names = ", ".join(host for host, _ in self.replicas)
        return (f"unload adapter {self.adapter} from {names}: no longer declared (once no "
                "request on it runs)")


Action = (
    RemoveContainer | RemoveNetwork | CreateNetwork | CreateVolume | RemoveVolume
    | CreateContainer | RecreateContainer | StartContainer | ReloadProxy | WaitHealthy
    | RollReplicas | RetireReplica | SleepMember | RewireProxy | LoadAdapter | UnloadAdapter
)


def changes(plan: list[Action]) -> list[Action]:
    """The actions that change the stack (drift), without the health waits."""
    return [action for action in plan if action.is_change]


def up_actions(desired: DesiredState, observed: ObservedState) -> list[Action]:
    """The actions that make the running stack what the rendered compose file describes."""
    removals: list[Action] = []
    kept: dict[str, ContainerState] = {}
    gone = [c for c in observed.containers if c.service not in {s.name for s in desired.services}]
    for service in desired.services:
        ordered = sorted(
            observed.of(service.name),
            key=lambda c: (c.name != service.container_name, not c.running, c.name),
        )
        first, extra = (ordered[0], ordered[1:]) if ordered else (None, [])
        removals += [RemoveContainer(c, f"extra container of {service.name}") for c in extra]
        if first is not None:
            kept[service.name] = first

    infrastructure: list[Action] = []
    rebuilt_networks: set[str] = set()
    for network in desired.networks:
        found = observed.network(network.name)
        if found is None:
            infrastructure.append(CreateNetwork(network, NEW))
        elif change := _network_change(network, found):
            rebuilt_networks.add(network.name)
            infrastructure += [
                RemoveNetwork(network.name, change),
                CreateNetwork(network, change),
            ]
    for service in desired.services:
        if service.name in kept and rebuilt_networks.intersection(service.config.networks):
            removals.append(RemoveContainer(kept.pop(service.name), "its network is recreated"))
    infrastructure += [
        CreateVolume(volume, NEW)
        for volume in desired.volumes
        if volume.name not in observed.volumes
    ]

    services = _service_actions(desired, observed, kept, rebuilt_networks)
    proxy = kept.get(PROXY_SERVICE)
    if proxy is not None and proxy.running and proxy.config_hash == desired.service(
        PROXY_SERVICE
    ).config_hash:
        services = rolled(services)
    retiring = [] if rebuilt_networks else _retiring(gone, services)
    removals[:0] = [RemoveContainer(c, "service no longer in the compose file")
                    for c in gone if c not in retiring]
    retired: list[Action] = [
        RetireReplica(c, f"{c.replica_of} has fewer replicas; nginx reloads without it first")
        for c in retiring
    ]
    declared = {n.name for n in desired.networks}
    leftovers: list[Action] = [
        RemoveNetwork(n.name, "no longer in the compose file")
        for n in observed.networks
        if n.name not in declared
    ]
    return removals + infrastructure + services + retired + leftovers


def _network_change(network: NetworkState, found: NetworkFound) -> str | None:
    """Why an existing network must be rebuilt (the engine changes neither setting in place)."""
    if found.internal != network.internal:
        return f"internal {str(found.internal).lower()} -> {str(network.internal).lower()}"
    if network.subnet is not None and found.subnets != (network.subnet,):
        return f"subnet {', '.join(found.subnets) or 'none'} -> {network.subnet}"
    return None


def _retiring(gone: list[ContainerState], services: list[Action]) -> list[ContainerState]:
    """Replicas the spec dropped that may serve on until nginx reloaded without them: only when
    the plan reloads the front door in place (a recreated one cuts every stream anyway) and
    nothing this plan starts needs their GPUs (a vLLM holds its GPU memory until removed)."""
    if not any(isinstance(action, ReloadProxy) for action in services):
        return []
    claimed = {gpu for service in starting_services(services) for gpu in service.gpu_ids}
    return [c for c in gone
            if c.replica_of is not None and c.running and not claimed.intersection(c.gpu_ids)]


def _service_actions(
    desired: DesiredState,
    observed: ObservedState,
    kept: dict[str, ContainerState],
    rebuilt_networks: set[str],
) -> list[Action]:
    actions: list[Action] = []
    touched: set[str] = set()  # services created, recreated or started by this plan
    unhealthy: dict[str, str] = {}  # service → why it still has to be waited for
    for service in desired.services:
        action = _container_action(service, kept.get(service.name), observed, rebuilt_networks)
        if action is None and service.reloadable and kept[service.name].running:
            actions += _rewire_action(service, kept[service.name])
            action = _reload_action(service, kept[service.name], observed, touched)
        if isinstance(action, CreateContainer | RecreateContainer | StartContainer):
            actions += _make_room(desired, kept, service, touched, unhealthy)
        if action is not None:
            waits = [
                desired.service(dep) for dep, condition in service.depends_on
                if condition == "service_healthy" and dep in unhealthy
            ]
            if waits:
                reasons = sorted({unhealthy.pop(s.name) for s in waits})
                them = "them" if len(waits) > 1 else "it"
                why = f"{service.name} depends on {them}; {'; '.join(reasons)}"
                actions.append(WaitHealthy(tuple(waits), why))
            actions.append(action)
        if isinstance(action, CreateContainer | RecreateContainer | StartContainer):
            touched.add(service.name)
            if service.config.healthcheck:
                unhealthy[service.name] = "just started"
        elif service.config.healthcheck and kept[service.name].health != "healthy":
            unhealthy[service.name] = f"health {kept[service.name].health or 'unknown'}"
    if unhealthy:
        pending = tuple(desired.service(name) for name in unhealthy)
        actions.append(WaitHealthy(pending, "; ".join(sorted(set(unhealthy.values())))))
    return actions


def _make_room(desired: DesiredState, kept: dict[str, ContainerState], service: ServiceState,
               touched: set[str], unhealthy: dict[str, str]) -> list[Action]:
    """Before a swap group's member starts: every other member that runs (started by this plan:
    once healthy) put to sleep, so that its start finds the GPU memory free."""
    group = service.labels.get(SWAP_GROUP_LABEL)
    if group is None:
        return []
    member = service.labels.get(REPLICA_SERVICE_LABEL, service.name)
    actions: list[Action] = []
    for other in desired.services:
        if (other.labels.get(SWAP_GROUP_LABEL) != group  # its own replicas start together
                or other.labels.get(REPLICA_SERVICE_LABEL, other.name) == member):
            continue
        if other.name in touched:
            if other.name in unhealthy:
                actions.append(WaitHealthy((other,), f"swap group {group}: "
                                           f"{unhealthy.pop(other.name)}"))
        elif other.name not in kept or not kept[other.name].running:
            continue
        actions.append(SleepMember(other, int(other.labels.get(SLEEP_LEVEL_LABEL, "1")),
                                   f"swap group {group}: {service.name} starts next"))
    return actions


def starting_services(actions: list[Action]) -> list[ServiceState]:
    """The services these actions create, recreate or start, the replicas of a rolling update
    among them (preflight checks them all before anything changes)."""
    services: list[ServiceState] = []
    for action in actions:
        if isinstance(action, CreateContainer | RecreateContainer | StartContainer):
            services.append(action.service)
        elif isinstance(action, RollReplicas):
            services += [step.service for step in action.replicas]
    return services


def touched(actions: list[Action]) -> set[str]:
    """The container names these actions start, replace or remove: their adapters are what
    their next start loads, not kit's to hot-load."""
    names = {service.container_name for service in starting_services(actions)}
    for action in actions:
        if isinstance(action, RemoveContainer | RetireReplica):
            names.add(action.container.name)
        elif isinstance(action, RecreateContainer):
            names.add(action.old.name)
        elif isinstance(action, RollReplicas):
            names.update(step.old.name for step in action.replicas)
    return names


def with_adapter_actions(actions: list[Action], replicas: list[ReplicaAdapters]) -> list[Action]:
    """`actions` with the LoRA adapter changes of the running replicas they leave alone: each
    adapter a replica declares and does not serve loaded first (before a reload makes the door
    route it), each it serves and no longer declares unloaded last (after the door stopped
    routing it). An adapter is changed on all of a service's replicas that need it at once."""
    kept = [replica for replica in replicas if replica.container.name not in touched(actions)]
    loads: dict[tuple[str, str], list[ReplicaAdapters]] = {}
    unloads: dict[tuple[str, str], list[ReplicaAdapters]] = {}
    for replica in kept:
        for name in replica.declared:
            if name not in replica.served:
                loads.setdefault((replica.service, name), []).append(replica)
        for name in replica.served:
            if name not in replica.declared:
                unloads.setdefault((replica.service, name), []).append(replica)
    first: list[Action] = [
        LoadAdapter(service, name, group[0].declared[name],
                    tuple((r.host, r.container) for r in group), group[0].task)
        for (service, name), group in loads.items()]
    last: list[Action] = [
        UnloadAdapter(service, name, tuple((r.host, r.container) for r in group))
        for (service, name), group in unloads.items()]
    return first + actions + last


def rolled(actions: list[Action]) -> list[Action]:
    """With the front door serving, the recreates of a multi-replica service's replicas become
    one rolling update (where the first stood); each is healthy and proven before the next
    starts, so their health waits go."""
    groups: dict[str, list[RecreateContainer]] = {}
    for action in actions:
        if isinstance(action, RecreateContainer) and REPLICA_SERVICE_LABEL in action.service.labels:
            groups.setdefault(action.service.labels[REPLICA_SERVICE_LABEL], []).append(action)
    if not groups:
        return actions
    rolled_names = {r.service.name for group in groups.values() for r in group}
    result: list[Action] = []
    for action in actions:
        if isinstance(action, RecreateContainer) and action.service.name in rolled_names:
            service = action.service.labels[REPLICA_SERVICE_LABEL]
            if groups[service][0] is action:
                result.append(RollReplicas(service, tuple(groups[service])))
        elif isinstance(action, WaitHealthy):
            waits = tuple(s for s in action.services if s.name not in rolled_names)
            if waits:
                result.append(WaitHealthy(waits, action.reason))
        else:
            result.append(action)
    return result


def _container_action(
    service: ServiceState,
    container: ContainerState | None,
    observed: ObservedState,
    rebuilt_networks: set[str],
) -> Action | None:
    if container is None:
        recreated = rebuilt_networks.intersection(service.config.networks)
        reason = f"network {', '.join(sorted(recreated))} recreated" if recreated else NEW
        return CreateContainer(service, reason)
    if container.config_hash != service.config_hash:
        old = (container.config_hash or "none")[:12]
        change = f"config changed (hash {old} -> {service.config_hash[:12]})"
        return RecreateContainer(service, container, change)
    image_id = observed.image_ids.get(service.config.image)
    if image_id is not None and image_id != container.image_id:
        change = f"image {service.config.image} was updated"
        return RecreateContainer(service, container, change)
    if container.state in ("created", "exited", "dead"):
        detail = f" (exit code {container.exit_code})" if container.state == "exited" else ""
        return StartContainer(service, container, f"{container.state}{detail}")
    if service.name == PROXY_SERVICE and container.health in ("healthy", None):
        dead = [f"{port.what} ({port.problem.reason})" for port in observed.door
                if port.dead and port.problem]
        if dead:  # the engine's forwarding, not nginx: a new container is published anew
            return RecreateContainer(service, container, f"nginx runs healthy but "
                                     f"{', '.join(dead)} does not answer")
    return None


def _rewire_action(service: ServiceState, container: ContainerState) -> list[Action]:
    """The running proxy's networks made the desired ones, in place (not hashed: a service
    added or removed reloads the front door instead of recreating it)."""
    want, have = set(service.config.networks), set(container.networks)
    if want == have:
        return []
    return [RewireProxy(service, container,
                        tuple(n for n in service.config.networks if n not in have),
                        tuple(sorted(have - want)))]


def _reload_action(
    service: ServiceState, container: ContainerState, observed: ObservedState, touched: set[str]
) -> Action | None:
    reasons = []
    loaded = observed.proxy_loaded
    if loaded is None or loaded.container_id != container.id:
        reasons.append("kit has no record of the config it loaded (a reload makes sure)")
    elif loaded.files_digest != service.site_files_digest:
        reasons.append("its mounted config files changed")
    replaced = sorted(dep for dep, _ in service.depends_on if dep in touched)
    if replaced:
        reasons.append(f"re-resolve {', '.join(replaced)} (restarted)")
    return ReloadProxy(service, container, "; ".join(reasons)) if reasons else None


def down_actions(observed: ObservedState, volumes: bool) -> list[Action]:
    """Remove every container of the project, dependents before what they depend on (the
    proxy before its backends), then its networks, and its volumes only when asked."""
    plan: list[Action] = []
    remaining = list(observed.containers)
    while remaining:
        needed = {dep for c in remaining for dep in c.depends_on}
        free = [c for c in remaining if c.service not in needed] or remaining  # a cycle: all
        plan += [RemoveContainer(c, "kit down") for c in free]
        remaining = [c for c in remaining if c not in free]
    plan += [RemoveNetwork(n.name, "kit down") for n in observed.networks]
    if volumes:
        plan += [RemoveVolume(name, "kit down --volumes") for name in observed.volumes]
    return plan
