"""The worker nodes of a multi-node service, each on its own server's Docker engine.

The head runs in the site's compose project on the site's engine, beside the front door. Each
worker runs its rendered `compose/node-<name>.yml` as the compose project `<site>-<name>` on
THAT node's engine: the node's `engine:` in the spec, else the `engine:` of its sibling spec
`<fleet>/<name>/site.yaml` (the fleet layout of kit/fleet.py). kit drives a worker with the
site's own path (desired → observe → reconcile → preflight → apply); its env file is read here
and reaches the node as the container's environment through the engine API, like every
service's on a remote engine, so no secret file is copied to another disk.

A worker serves no API and has no healthcheck: the head's health is the proof that every node
joined. So `kit up` starts the workers first, then watches them while it waits for the head: a
worker that exits ends the wait with its log and diagnosis, and a head that fails is explained
with the workers' logs beside its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kit.converge.diagnose import diagnose
from kit.converge.preflight import check_services
from kit.converge.reconcile import Action, changes, down_actions, starting_services, up_actions
from kit.converge.wait import stopped
from kit.engine.desired import DesiredState, ServiceState, load_desired
from kit.engine.observe import ContainerState, ObservedState, observe
from kit.errors import BadInput, KitError
from kit.nodes.node_preflight import WorkerNode, check_nodes
from kit.plan.host import load_spec
from kit.spec.model import DEFAULT_SPEC

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

LOG_TAIL_LINES = 40


class WorkerFailed(KitError):
    """A worker node's container stopped while the head waited (already explained)."""


def worker_nodes(site: Site) -> list[WorkerNode]:
    """Every worker node of the site's multi-node service (none without one); BadInput, before
    anything is written or started, for a node whose engine kit cannot tell."""
    workers = []
    for i, service in enumerate(site.spec.services):
        for rank, node in list(enumerate(service.nodes or []))[1:]:
            workers.append(WorkerNode(
                service=service.name, name=node.name,
                engine_url=node.engine or _sibling_engine(site, f"services[{i}].nodes[{rank}]",
                                                          node.name),
                project=f"{site.project}-{node.name}",
                compose_file=site.layout.compose_dir / f"node-{node.name}.yml",
            ))
    return workers


def _sibling_engine(site: Site, where: str, name: str) -> str:
    """The `engine:` of the fleet member `name`: DIR/<name>/site.yaml beside this site's."""
    sibling = site.spec_path.resolve().parent.parent / name / DEFAULT_SPEC
    fix = (f"set {where}.engine (e.g. ssh://ops@{name}), or `engine:` in {sibling}, the "
           "fleet member's own spec (docs/multinode.md)")
    if not sibling.is_file():
        raise BadInput(f"{where} ({name}): kit cannot tell which Docker engine runs that node: "
                       f"the node sets no engine and there is no sibling spec {sibling}", fix=fix)
    try:
        engine = load_spec(sibling, check_host=False, check_capacity=False).engine
    except BadInput as error:
        raise BadInput(f"{where} ({name}): its sibling spec {sibling} is not valid: "
                       f"{error.message.splitlines()[0]}", fix=f"fix {sibling}") from None
    if engine is None:
        raise BadInput(f"{where} ({name}): its sibling spec {sibling} sets no engine, so from "
                       "here that node's Docker engine would be this host's own", fix=fix)
    return engine


def node_desired(site: Site, worker: WorkerNode) -> DesiredState:
    """The worker's rendered compose file as its engine is given it."""
    return load_desired(site.layout, worker.project, worker.compose_file)


@dataclass(frozen=True)
class WorkerPlan:
    """What `kit up` does on one worker's engine."""

    worker: WorkerNode
    engine: Engine
    observed: ObservedState
    actions: list[Action]

    @property
    def starting(self) -> list[ServiceState]:
        return starting_services(self.actions)


def node_drift(plans: list[WorkerPlan]) -> list[str]:
    """What `kit up` would change on the worker nodes (`kit status`)."""
    return [f"node {plan.worker.name}: {action}" for plan in plans
            for action in changes(plan.actions)]


@dataclass
class WorkerEngines:
    """The workers of a site, each with its engine connected (kit up, down, status)."""

    site: Site
    nodes: list[tuple[WorkerNode, Engine]]
    baseline: dict[str, int] = field(default_factory=dict)  # container id → restarts at start

    @classmethod
    def connect(cls, site: Site, workers: list[WorkerNode],
                connect: Callable[[str], Engine]) -> WorkerEngines:
        return cls(site, [(worker, connect(worker.engine_url)) for worker in workers])

    def plans(self) -> list[WorkerPlan]:
        """What `kit up` would do on each worker's engine."""
        plans = []
        for worker, engine in self.nodes:
            desired = node_desired(self.site, worker)
            images = tuple(s.config.image for s in desired.services)
            observed = observe(engine, worker.project, images)
            plans.append(WorkerPlan(worker, engine, observed, up_actions(desired, observed)))
        return plans


    def preflight(self, plans: list[WorkerPlan], head: Engine, head_actions: list[Action],
                  report: Callable[[str], None]) -> None:
        """Each worker's own preflight on its engine, then what the nodes must share."""
        for plan in plans:
            if plan.starting:
                check_services(plan.engine, self.site.spec, plan.worker.project, plan.starting,
                               plan.observed, report)
        head_starts = {s.name for s in starting_services(head_actions)}
        for name in dict.fromkeys(w.service for w, _ in self.nodes):
            if name in head_starts or any(p.starting for p in plans if p.worker.service == name):
                check_nodes((self.site.spec.site, head),
                            [(w, e) for w, e in self.nodes if w.service == name],
                            self.site.desired.service(name), head_starts=name in head_starts,
                            report=report)

    def start(self, plans: list[WorkerPlan], report: Callable[[str], None]) -> None:
        """Apply each worker's plan on its engine (checked by preflight first, in kit up)."""
        from kit.converge.apply import Executor

        for plan in plans:
            Executor(engine=plan.engine, applied=self.site.layout.applied, wait=lambda _: None,
                     report=_node_report(report, plan.worker.name)
                     ).run(plan.actions)
        self.baseline = {c.id: c.restart_count for _, c in self.containers()}

    def stop(self, volumes: bool, report: Callable[[str], None]) -> int:
        """Remove every worker container (and networks, volumes when asked); how many actions."""
        from kit.converge.apply import Executor

        done = 0
        for worker, engine in self.nodes:
            plan = down_actions(observe(engine, worker.project), volumes)
            Executor(engine=engine, applied=self.site.layout.applied, wait=lambda _: None,
                     report=_node_report(report, worker.name)
                     ).run(plan)
            done += len(plan)
        return done

    def containers(self) -> list[tuple[WorkerNode, ContainerState]]:
        return [(worker, container) for worker, engine in self.nodes
                for container in observe(engine, worker.project).containers]

    def watch(self) -> None:
        """During the head's wait: KitError as soon as a worker's container stops or restarts
        (the head would only time out waiting for it)."""
        containers = self.containers()
        for worker, container in containers:
            failure = stopped(container, self.baseline.get(container.id, 0))
            if failure:
                explained = self.explain(KitError(
                    f"worker node {worker.name} of service {worker.service} failed: {failure}"))
                raise WorkerFailed(explained.message, fix=explained.fix)
        missing = {w.name for w, _ in self.nodes} - {w.name for w, _ in containers}
        if missing:
            raise KitError(f"worker node(s) {', '.join(sorted(missing))} have no container",
                           fix="something removed it; run kit up again (kit status shows nodes)")

    def diagnosis(self, head: Engine, head_containers: list[ContainerState],
                  workers: list[tuple[WorkerNode, ContainerState]]) -> list[str]:
        """`kit status`: when the head is not healthy or a worker is not running, why (the
        first cause a rule finds in the workers' logs, the root cause when one failed, then in
        the head's)."""
        if all(c.running and c.health == "healthy" for c in head_containers) and all(
                c.running for _, c in workers) and len(workers) >= len(self.nodes):
            return []
        engines = dict((w.name, e) for w, e in self.nodes)
        logs = [(f"node {w.name} {c.name}", engines[w.name].log_tail(c.id, LOG_TAIL_LINES))
                for w, c in workers]
        logs += [(f"head {c.name}", head.log_tail(c.id, LOG_TAIL_LINES)) for c in head_containers]
        for where, log in logs:
            found = diagnose(log)
            if found is not None:
                return [f"multi-node: not serving; cause: {found.cause}",
                        f"  (from {where}: {found.evidence})",
                        f"  spec key: {found.spec_key}; fix: {found.fix}",
                        "  kit up restarts what stopped"]
        return ["multi-node: not serving yet (no known cause in the logs): kit logs, kit up"]

    def explain(self, error: KitError) -> KitError:
        """`error` with every worker's log tail and the cause a rule finds there: a worker's
        is the root cause (the head's log may only say that a node is missing), so its fix
        comes first."""
        message, fix, rooted = error.message, error.fix, False
        for worker, engine in self.nodes:
            for container in observe(engine, worker.project).containers:
                log = engine.log_tail(container.id, LOG_TAIL_LINES)
                message += (f"\n--- last {LOG_TAIL_LINES} log lines of {container.name} on node "
                            f"{worker.name} ({worker.engine_url}) ---\n{log.rstrip()}\n---")
                found = diagnose(log)
                if found is not None:
                    message += (f"\ncause on node {worker.name}: {found.cause}\n  (from: "
                                f"{found.evidence})\n  spec key: {found.spec_key} "
                                f"(service {worker.service})")
                    fix = fix if rooted else found.fix
                    rooted = True
        return KitError(message, fix=fix or "read the logs: kit logs, and on the node: "
                        "docker logs <container> (kit status lists them)")


def _node_report(report: Callable[[str], None], name: str) -> Callable[[str], None]:
    """`report` with each line prefixed by the worker node's name."""
    return lambda line: report(f"node {name}: {line}")
