"""`kit up`: render what the spec changed, converge the stack to the rendered compose file
(observe → reconcile → preflight → apply → wait), then run the gate through the front door.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.converge.adapter_load import adapter_states
from kit.converge.apply import Executor
from kit.converge.preflight import preflight
from kit.converge.reconcile import (
    Action,
    changes,
    starting_services,
    up_actions,
    with_adapter_actions,
)
from kit.converge.rollout import downtime_notes, record_start_times
from kit.converge.wait import wait_healthy
from kit.engine.desired import PROXY_SERVICE, ServiceState
from kit.engine.docker_api import Engine
from kit.engine.docker_api import connect as connect_to
from kit.engine.remote_files import deliver, site_volumes
from kit.errors import KitError
from kit.front_door.reload import check_open_files, running_proxy
from kit.nodes.worker_nodes import WorkerEngines, WorkerFailed, worker_nodes
from kit.render.site_files import RenderResult, render_site
from kit.site import Site
from kit.supply.remote_pull import check_pinned_remote

if TYPE_CHECKING:
    from kit.front_door.acme import AcmeStatus
    from kit.front_door.gate import ProbeResult

# dockerd may stamp a container's first log lines before the StartedAt it records (its log
# copier can read them first; seen on a loaded machine): a start's lines are read from this
# much earlier.
START_LOG_SLACK_S = 1.0


@dataclass(frozen=True)
class UpResult:
    actions: list[Action]
    seconds: float


@dataclass(frozen=True)
class SiteUp:
    """All of `kit up`: the render it did, the convergence, and the gate (None if skipped)."""

    rendered: RenderResult
    converged: UpResult
    containers: int
    probe: ProbeResult | None
    acme: AcmeStatus | None = None  # tls.mode acme: the certificate's state when the gate ran
    workers: int = 0  # a multi-node service's worker containers, on their nodes' engines

    def summary(self) -> str:
        changed = changes(self.converged.actions)
        seconds = self.converged.seconds
        nodes = f" + {self.workers} on worker node(s)" if self.workers else ""
        if changed:
            return (f"stack {self.rendered.spec.site}: {len(changed)} change(s) applied, "
                    f"{self.containers} container(s) healthy{nodes} ({seconds:.1f}s)")
        return f"no change: {self.containers} container(s){nodes} up to date ({seconds:.1f}s)"


def up_site(
    site: Site,
    *,
    timeout: float | None,
    probe: bool,
    report: Callable[[str], None],
    warn: Callable[[str], None],
    connect: Callable[[], Engine] | None = None,
    connect_node: Callable[[str], Engine] | None = None,
) -> SiteUp:
    """Render what the spec changed, converge the stack, then run the gate through nginx.

    The engine is reached after the render (`connect`: a test's fake; by default the site's
    engine, kit/engine/url.py); a multi-node service's worker nodes by their engine addresses
    (`connect_node`, kit/nodes/worker_nodes.py)."""
    workers = worker_nodes(site)  # a node whose engine is unknown: refused before writing
    rendered = render_site(site)
    for warning in rendered.warnings:
        warn(warning)
    for line in rendered.summary():
        report(line)
    rendered.passwords_shown()
    engine = connect() if connect is not None else connect_to(site.engine_url)
    nodes = WorkerEngines.connect(site, workers, connect_node or connect_to) if workers else None
    converged = converge(site, engine, timeout=timeout, report=report, nodes=nodes)
    acme = None
    if site.spec.tls.mode == "acme":
        from kit.front_door.acme import await_certificate, certbot_started

        acme = await_certificate(site, report, since=certbot_started(site, engine))
        for line in acme.lines():
            report(line)
    gate = None
    if probe:
        from kit.stack.probe import probe_site  # the gate: only imported when it runs

        gate = probe_site(site, lambda: engine)
    return SiteUp(rendered, converged, len(site.desired.services), gate, acme, len(workers))


def converge(
    site: Site, engine: Engine, *, timeout: float | None, report: Callable[[str], None],
    nodes: WorkerEngines | None = None,
) -> UpResult:
    """Bring the running stack to the rendered compose file; KitError when it cannot.

    With worker `nodes`, every node is checked before anything starts, the workers start
    first (they wait for the head), and the head's wait watches them."""
    started = time.monotonic()
    observed = site.observe(engine, knock=True)
    actions = up_actions(site.desired, observed)
    # the adapters the spec declares, hot-loaded or unloaded on the replicas kept running
    actions = with_adapter_actions(actions, adapter_states(engine, site, observed))
    plans = nodes.plans() if nodes else []
    node_actions = [action for plan in plans for action in plan.actions]
    if actions or node_actions:
        preflight(engine, site, observed, actions, report)
        if not engine.is_local:  # a local engine's folders are checked with the spec
            check_pinned_remote(engine, site, starting_services(actions), report)
        if nodes:
            nodes.preflight(plans, engine, actions, report)
        if site_volumes(site.desired):
            delivered = deliver(engine, site.desired, site.layout.root)
            report(f"site files delivered through the engine: {', '.join(delivered)}")
        for note in downtime_notes(actions, site.layout.start_times):
            report(note)
        if nodes:
            nodes.start(plans, report)
        Executor(
            engine=engine,
            applied=site.layout.applied,
            wait=lambda services: _report_healthy(
                _wait(engine, site, services, timeout, nodes), report, site.layout.start_times,
            ),
            report=report,
            layout=site.layout,
            project=site.project,
        ).run(actions)
        _check_started_proxy(engine, site.project, actions)
    return UpResult(node_actions + actions, time.monotonic() - started)


def _wait(engine: Engine, site: Site, services: tuple[ServiceState, ...],
          timeout: float | None, nodes: WorkerEngines | None) -> dict[str, float]:
    """The health wait; with worker nodes, watched, and a head's failure shown with their logs."""
    if nodes is None:
        return wait_healthy(engine, site.desired, services, timeout=timeout)
    try:
        return wait_healthy(engine, site.desired, services, timeout=timeout, watch=nodes.watch)
    except WorkerFailed:
        raise
    except KitError as error:
        raise nodes.explain(error) from None


def _check_started_proxy(engine: Engine, project: str, actions: list[Action]) -> None:
    """A front door this plan (re)started took its worker limits at start: check them (a
    reload checks its own in kit/front_door/reload.py)."""
    started = any(service.name == PROXY_SERVICE for service in starting_services(actions))
    proxy = running_proxy(engine, project) if started else None
    if proxy is not None and proxy.started_at is not None:
        check_open_files(engine, proxy, proxy.started_at.timestamp() - START_LOG_SLACK_S)


def _report_healthy(
    seconds: dict[str, float], report: Callable[[str], None], start_times: Path
) -> None:
    for name, elapsed in seconds.items():
        report(f"{name} healthy after {elapsed:.0f}s")
    record_start_times(start_times, seconds)


