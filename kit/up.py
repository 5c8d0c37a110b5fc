"""`kit up`: render what the spec changed, converge the stack to the rendered compose file
(observe → reconcile → preflight → apply → wait), then run the gate through the front door.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.apply import Executor
from kit.desired import PROXY_SERVICE
from kit.docker_api import Engine
from kit.docker_api import connect as connect_to
from kit.front_door import check_open_files, running_proxy
from kit.multinode import refuse_up
from kit.preflight import preflight
from kit.reconcile import (
    Action,
    CreateContainer,
    RecreateContainer,
    StartContainer,
    changes,
    up_actions,
)
from kit.remote_files import deliver, site_volumes
from kit.render import RenderResult, render_site
from kit.rollout import downtime_notes, record_start_times
from kit.site import Site
from kit.wait import wait_healthy

if TYPE_CHECKING:
    from kit.acme import AcmeStatus
    from kit.probe import ProbeResult



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

    def summary(self) -> str:
        changed = changes(self.converged.actions)
        seconds = self.converged.seconds
        if changed:
            return (f"stack {self.rendered.spec.site}: {len(changed)} change(s) applied, "
                    f"{self.containers} container(s) healthy ({seconds:.1f}s)")
        return f"no change: {self.containers} container(s) up to date ({seconds:.1f}s)"


def up_site(
    site: Site,
    *,
    timeout: float | None,
    probe: bool,
    report: Callable[[str], None],
    warn: Callable[[str], None],
    connect: Callable[[], Engine] | None = None,
) -> SiteUp:
    """Render what the spec changed, converge the stack, then run the gate through nginx.

    The engine is reached after the render (`connect`: a test's fake; by default the site's
    engine, kit/engine_url.py)."""
    refuse_up(site.spec)
    rendered = render_site(site)
    for warning in rendered.warnings:
        warn(warning)
    for line in rendered.summary():
        report(line)
    rendered.passwords_shown()
    engine = connect() if connect is not None else connect_to(site.engine_url)
    converged = converge(site, engine, timeout=timeout, report=report)
    acme = None
    if site.spec.tls.mode == "acme":
        from kit.acme import await_certificate, certbot_started

        acme = await_certificate(site, report, since=certbot_started(site, engine))
        for line in acme.lines():
            report(line)
    gate = None
    if probe:
        from kit.probe import run_probe  # the gate: only imported when it runs
        from kit.replica_check import replica_checks

        gate = run_probe(site.spec, site.layout,
                         replicas=lambda: replica_checks(site, lambda: engine))
    return SiteUp(rendered, converged, len(site.desired.services), gate, acme)


def converge(
    site: Site, engine: Engine, *, timeout: float | None, report: Callable[[str], None]
) -> UpResult:
    """Bring the running stack to the rendered compose file; KitError when it cannot."""
    started = time.monotonic()
    observed = site.observe(engine)
    actions = up_actions(site.desired, observed)
    if actions:
        preflight(engine, site, observed, actions, report)
        if site_volumes(site.desired):
            delivered = deliver(engine, site.desired, site.layout.root)
            report(f"site files delivered through the engine: {', '.join(delivered)}")
        for note in downtime_notes(actions, site.layout.start_times):
            report(note)
        Executor(
            engine=engine,
            applied=site.layout.applied,
            wait=lambda services: _report_healthy(
                wait_healthy(engine, site.desired, services, timeout=timeout),
                report, site.layout.start_times,
            ),
            report=report,
            layout=site.layout,
            project=site.project,
        ).run(actions)
        _check_started_proxy(engine, site.project, actions)
    return UpResult(actions, time.monotonic() - started)


def _check_started_proxy(engine: Engine, project: str, actions: list[Action]) -> None:
    """A front door this plan (re)started took its worker limits at start: check them (a
    reload checks its own in kit/front_door.py)."""
    started = [action for action in actions
               if isinstance(action, CreateContainer | RecreateContainer | StartContainer)
               and action.service.name == PROXY_SERVICE]
    proxy = running_proxy(engine, project) if started else None
    if proxy is not None and proxy.started_at is not None:
        check_open_files(engine, proxy, proxy.started_at.timestamp())


def _report_healthy(
    seconds: dict[str, float], report: Callable[[str], None], start_times: Path
) -> None:
    for name, elapsed in seconds.items():
        report(f"{name} healthy after {elapsed:.0f}s")
    record_start_times(start_times, seconds)


