"""What a site is doing: its containers, drift from the spec, and the last gate result."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kit.converge.reconcile import changes, up_actions
from kit.converge.rollout import out_of_service
from kit.converge.sleep import ReplicaSleep, sleep_states
from kit.engine.desired import PROMETHEUS_SERVICE, PROXY_SERVICE
from kit.engine.docker_api import Engine, connect
from kit.engine.door_ports import PortAnswer
from kit.engine.observe import ContainerState, ObservedState
from kit.engine.replica_client import served_adapters
from kit.files import read_existing
from kit.front_door.acme import AcmeStatus, acme_status
from kit.nodes.worker_nodes import WorkerEngines, node_drift, worker_nodes
from kit.render.site_files import render_site
from kit.site import Site
from kit.state import json_object, read_state
from kit.table import text_table
from kit.views.live_figures import LiveFigures, live_figures
from kit.views.usage_health import LedgerHealth, ledger_health


@dataclass(frozen=True)
class NodeContainers:
    """The containers of a multi-node service's worker node, on that node's engine."""

    node: str
    engine: str
    containers: tuple[ContainerState, ...]


@dataclass(frozen=True)
class ServedAdapters:
    """The LoRA adapters one replica serves (its own /v1/models) against the spec's."""

    container: str
    served: tuple[str, ...] | None  # None: the replica did not answer
    missing: tuple[str, ...] = ()  # declared, not served: requests for them fail there
    undeclared: tuple[str, ...] = ()  # served, not declared (the door does not route them)

    def to_json(self) -> dict:
        return {"container": self.container, "served": None if self.served is None
                else list(self.served), "missing": list(self.missing),
                "undeclared": list(self.undeclared)}

    def line(self) -> str:
        if self.served is None:
            return f"adapters of {self.container}: unknown (its /v1/models did not answer)"
        text = f"adapters of {self.container}: {', '.join(self.served) or 'none'}"
        if self.missing:
            text += f"; DRIFT: declared but not loaded: {', '.join(self.missing)}"
        if self.undeclared:
            text += f"; DRIFT: loaded but not declared: {', '.join(self.undeclared)}"
        return text


@dataclass(frozen=True)
class StackStatus:
    site: str
    containers: tuple[ContainerState, ...]
    drift: tuple[str, ...]  # what `kit up` would change in the running stack
    render_pending: tuple[str, ...]  # files the spec would change (kit up renders them first)
    last_probe: dict | None
    figures: LiveFigures | None = None  # observability on: Prometheus's live view
    acme: AcmeStatus | None = None  # tls.mode acme: the certificate and certbot's last run
    # a multi-node service's workers (kit/nodes/worker_nodes.py)
    nodes: tuple[NodeContainers, ...] = ()
    node_problems: tuple[str, ...] = ()  # why the multi-node service does not serve, if not
    door: tuple[PortAnswer, ...] = ()  # the running front door's ports, knocked on from here
    out_of_rotation: frozenset[str] = frozenset()  # replicas nginx's server lists leave out
    probe_stale: str | None = None  # why the last probe says nothing of what runs now
    usage: LedgerHealth | None = None  # the usage ledger's health (None: usage is off)
    adapters: tuple[ServedAdapters, ...] = ()  # per running replica of a service with adapters
    sleep: tuple[ReplicaSleep, ...] = ()  # awake/asleep of services with idle_sleep

    def replicas_in_service(self) -> dict[str, dict[str, int]]:
        """Per multi-replica service: how many replicas run healthy, of how many containers,
        and how many running ones nginx sends requests to."""
        counts: dict[str, dict[str, int]] = {}
        for c in self.containers:
            if c.replica_of is not None:
                count = counts.setdefault(c.replica_of,
                                          {"healthy": 0, "replicas": 0, "in_rotation": 0})
                count["replicas"] += 1
                count["healthy"] += c.running and c.health == "healthy"
                count["in_rotation"] += c.running and c.name not in self.out_of_rotation
        return counts

    def to_json(self, now: datetime) -> dict:
        """The report; a site with replicas adds which replica each container is and how many
        of each service's are healthy (keys a single-replica site's report does not have)."""
        replicas = self.replicas_in_service()
        extra = {"observability": self.figures.to_json()} if self.figures else {}
        return {
            "site": self.site,
            "containers": [_container_json(c, now, c.name not in self.out_of_rotation)
                           for c in self.containers],
            "front_door_ports": [port.to_json() for port in self.door],
            **({"replicas": replicas} if replicas else {}),
            **({"nodes": [{"node": n.node, "engine": n.engine,
                           "containers": [_container_json(c, now) for c in n.containers]}
                          for n in self.nodes],
                "multi_node_problems": list(self.node_problems)} if self.nodes else {}),
            "drift": list(self.drift),
            "render_pending": list(self.render_pending),
            "last_probe": self.last_probe,
            "last_probe_stale": self.probe_stale,
            **extra,
            **({"tls": self.acme.to_json()} if self.acme else {}),  # tls.mode acme only
            **({"usage_ledger": self.usage.to_json()} if self.usage else {}),
            **({"adapters": [replica.to_json() for replica in self.adapters]}
               if self.adapters else {}),
            **({"sleep": [state.to_json() for state in self.sleep]} if self.sleep else {}),
        }


def _container_json(c: ContainerState, now: datetime, in_rotation: bool = True) -> dict:
    return {
        "service": c.service,
        **({"replica_of": c.replica_of, "replica": c.replica, "in_rotation": in_rotation}
           if c.replica_of is not None else {}),
        "name": c.name,
        "state": c.state,
        "health": c.health,
        "gpus": list(c.gpu_ids),
        "uptime_seconds": _uptime(c, now),
        "restarts": c.restart_count,
        "image": c.image,
        "id": c.id,
    }


def gather(site: Site, engine: Engine,
           connect_node: Callable[[str], Engine] | None = None) -> StackStatus:
    """The running stack against the spec: containers, drift, pending render, last gate; with
    a multi-node service, its workers' containers and drift, asked of each node's engine."""
    pending = render_site(site, dry_run=True).changes
    observed = site.observe(engine, knock=True)
    last_probe = _last_probe(site.layout.last_probe)
    nodes, node_drift, node_problems = _worker_view(site, engine, observed, connect_node)
    return StackStatus(
        site=site.desired.project,
        containers=observed.containers,
        nodes=nodes,
        drift=tuple(str(action) for action in changes(up_actions(site.desired, observed)))
        + node_drift,
        node_problems=node_problems,
        render_pending=tuple(str(change.output.path) for change in pending),
        last_probe=last_probe,
        figures=_figures(site, engine, observed.containers),
        acme=acme_status(site) if site.spec.tls.mode == "acme" else None,
        door=observed.door,
        out_of_rotation=_out_of_rotation(site, observed.containers),
        probe_stale=_probe_stale(last_probe, observed),
        usage=ledger_health(engine, observed.containers) if site.spec.usage.enabled else None,
        adapters=replica_adapters(site, engine, observed.containers),
        sleep=sleep_states(engine, site, observed.containers),
    )


def replica_adapters(site: Site, engine: Engine, containers: tuple[ContainerState, ...]
                     ) -> tuple[ServedAdapters, ...]:
    """Each running replica of a service with adapters, asked what it serves (kit status,
    kit adapters list)."""
    declared = {s.name: {a.name for a in s.adapters} for s in site.spec.services if s.adapters}
    found = []
    for c in containers:
        if c.spec_service not in declared or not c.running:
            continue
        served = served_adapters(engine, c)
        wanted = declared[c.spec_service]
        found.append(ServedAdapters(c.service, None if served is None else tuple(served),
                                     tuple(sorted(wanted - set(served or wanted))),
                                     tuple(sorted(set(served or ()) - wanted))))
    return tuple(found)


def _out_of_rotation(site: Site, containers: tuple[ContainerState, ...]) -> frozenset[str]:
    """Replica containers nginx's server lists leave out (what it loaded at kit up's last
    reload: a rollout that stopped leaves its replica out until the next kit up)."""
    out: set[str] = set()
    for service in dict.fromkeys(c.replica_of for c in containers if c.replica_of):
        pool = read_existing(site.layout.replica_pool(service))
        hosts = out_of_service(pool.decode(errors="replace")) if pool is not None else set()
        out.update(c.name for c in containers if c.replica_of == service and c.service in hosts)
    return frozenset(out)


def _probe_stale(probe: dict | None, observed: ObservedState) -> str | None:
    """Why the last probe no longer speaks for the stack: no front door runs (kit down, a
    crash), or the one that runs started after it was probed."""
    if probe is None:
        return None
    proxies = [c for c in observed.of(PROXY_SERVICE) if c.running]
    if not proxies:
        return "the front door it probed no longer runs"
    try:
        checked = datetime.fromisoformat(str(probe.get("checked_at")))
    except ValueError:
        return "it records no time it was taken"
    started = max((c.started_at for c in proxies if c.started_at), default=None)
    if started is not None and checked.tzinfo is not None and started > checked:
        return "the front door restarted after it was taken"
    return None


def _worker_view(site: Site, engine: Engine, observed: ObservedState,
                 connect_node: Callable[[str], Engine] | None
                 ) -> tuple[tuple[NodeContainers, ...], tuple[str, ...], tuple[str, ...]]:
    """A multi-node service's worker nodes, each engine observed once: their containers, what
    kit up would change there, and why the service does not serve (if it does not)."""
    workers = worker_nodes(site)
    if not workers:
        return (), (), ()
    engines = WorkerEngines.connect(site, workers, connect_node or connect)
    plans = engines.plans()
    found = [(plan.worker, c) for plan in plans for c in plan.observed.containers]
    heads = [c for name in dict.fromkeys(w.service for w in workers) for c in observed.of(name)]
    return (
        tuple(NodeContainers(w.name, w.engine_url, tuple(c for node, c in found if node == w))
              for w in workers),
        tuple(node_drift(plans)),
        tuple(engines.diagnosis(engine, heads, found)),
    )


def _figures(site: Site, engine: Engine, containers: tuple[ContainerState, ...]
             ) -> LiveFigures | None:
    if not site.spec.observability.enabled:
        return None
    running = [c.id for c in containers if c.service == PROMETHEUS_SERVICE and c.running]
    served = {service.name for service in site.spec.services}
    healthy = frozenset((c.spec_service, str(c.replica or 0)) for c in containers
                        if c.spec_service in served and c.running and c.health == "healthy")
    return live_figures(engine, running[0] if running else None, healthy)


def _last_probe(path: Path) -> dict | None:
    return read_state(path, _probe_record, fix="run `kit probe` to rewrite it")


def _probe_record(text: str) -> dict:
    record = json_object(text)
    checks = record["checks"]
    if not (isinstance(checks, list) and all(isinstance(check, dict) for check in checks)):
        raise ValueError("its checks are not a list of records")
    return record


def _uptime(container: ContainerState, now: datetime) -> int | None:
    if not container.running or container.started_at is None:
        return None
    return int((now - container.started_at).total_seconds())


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def render_text(status: StackStatus, now: datetime) -> str:
    rows = [("SERVICE", "REPLICA", "STATE", "HEALTH", "GPUS", "UPTIME", "RESTARTS", "IMAGE")]
    rows += [
        (
            c.service, "-" if c.replica is None else f"{c.replica} of {c.replica_of}", c.state,
            (c.health or "-") + (", OUT OF ROTATION" if c.name in status.out_of_rotation else ""),
            ",".join(c.gpu_ids) or "-", _duration(_uptime(c, now)),
            str(c.restart_count), c.image,
        )
        for c in status.containers
    ]
    rows += [
        (f"{c.service} (node {n.node})", "-", c.state, c.health or "-", ",".join(c.gpu_ids) or "-",
         _duration(_uptime(c, now)), str(c.restart_count), c.image)
        for n in status.nodes for c in n.containers
    ]
    lines = text_table(rows).split("\n")
    if not status.containers:
        lines.append(f"(no containers of project {status.site})")
    for n in status.nodes:
        running = sum(c.running for c in n.containers)
        lines.append(f"node {n.node} ({n.engine}): {running} of {len(n.containers)} worker "
                     "container(s) running" + ("" if n.containers else ": run kit up"))
    lines += status.node_problems
    for service, count in status.replicas_in_service().items():
        lines.append(f"{service}: {count['healthy']} of {count['replicas']} replicas healthy, "
                     f"{count['in_rotation']} in rotation")
    left_out = sorted(c.service for c in status.containers if c.name in status.out_of_rotation)
    if left_out:
        lines.append(f"out of rotation: {', '.join(left_out)} (nginx sends it no request: a "
                     "rolling update stopped before putting it back; kit up does)")
    lines += [f"front door: {port}" for port in status.door]
    if any(port.dead for port in status.door):
        lines.append("front door: nginx runs but clients cannot reach it there; kit up "
                     "recreates it (the engine publishes its ports again)")
    if status.drift:
        lines.append("drift: `kit up` would")
        lines += [f"  {line}" for line in status.drift]
    else:
        lines.append("drift: none (the running stack is what compose/docker-compose.yml says)")
    if status.render_pending:
        lines.append(f"spec changed since the last render: {', '.join(status.render_pending)} "
                     "(kit up renders them)")
    probe = status.last_probe
    if probe is None:
        lines.append("last probe: none yet (kit up runs it, or kit probe)")
    else:
        failed = [c["name"] for c in probe.get("checks", []) if not c.get("ok")]
        verdict = "passed" if probe.get("ok") else f"FAILED ({', '.join(failed)})"
        stale = f" (stale: {status.probe_stale})" if status.probe_stale else ""
        lines.append(f"last probe: {verdict} at {probe.get('checked_at', '?')}{stale}")
    if status.figures:
        lines += status.figures.lines()
    if status.acme is not None:
        lines += status.acme.lines()
    if status.usage is not None:
        lines += status.usage.lines()
    lines += [replica.line() for replica in status.adapters]
    lines += [state.summary() for state in status.sleep]
    return "\n".join(lines)
