"""kit status: what runs, how healthy, what `kit up` would change, and the last gate result."""

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.docker_api import connect
from kit.errors import KitError
from kit.observe import ContainerState
from kit.reconcile import changes, plan_up
from kit.render import render_site
from kit.up import Site


@dataclass(frozen=True)
class StackStatus:
    site: str
    containers: tuple[ContainerState, ...]
    drift: tuple[str, ...]  # what `kit up` would change in the running stack
    render_pending: tuple[str, ...]  # files the spec would change (kit up renders them first)
    last_probe: dict | None

    def to_json(self, now: datetime) -> dict:
        return {
            "site": self.site,
            "containers": [
                {
                    "service": c.service,
                    "name": c.name,
                    "state": c.state,
                    "health": c.health,
                    "gpus": list(c.gpu_ids),
                    "uptime_seconds": _uptime(c, now),
                    "restarts": c.restart_count,
                    "image": c.image,
                    "id": c.id,
                }
                for c in self.containers
            ],
            "drift": list(self.drift),
            "render_pending": list(self.render_pending),
            "last_probe": self.last_probe,
        }


def gather(spec: Path) -> StackStatus:
    site = Site.load(spec)
    pending = render_site(spec, dry_run=True).changes
    observed = site.observe(connect())
    return StackStatus(
        site=site.desired.project,
        containers=observed.containers,
        drift=tuple(str(action) for action in changes(plan_up(site.desired, observed))),
        render_pending=tuple(str(change.output.path) for change in pending),
        last_probe=_last_probe(site.layout.last_probe),
    )


def _last_probe(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
        checks = record["checks"]
        if isinstance(checks, list) and all(isinstance(check, dict) for check in checks):
            return record
        problem = "its checks are not a list of records"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        problem = str(error)
    raise KitError(f"{path} is unreadable ({problem})", fix="run `kit probe` to rewrite it")


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
    rows = [("SERVICE", "STATE", "HEALTH", "GPUS", "UPTIME", "RESTARTS", "IMAGE")]
    rows += [
        (
            c.service, c.state, c.health or "-", ",".join(c.gpu_ids) or "-",
            _duration(_uptime(c, now)), str(c.restart_count), c.image,
        )
        for c in status.containers
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    if not status.containers:
        lines.append(f"(no containers of project {status.site})")
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
        lines.append(f"last probe: {verdict} at {probe.get('checked_at', '?')}")
    return "\n".join(lines)


@click.command()
@spec_argument
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(spec: Path, as_json: bool) -> None:
    """Show the containers of SPEC's stack, drift from the spec and the last probe result."""
    report = gather(spec)
    now = datetime.now(UTC)
    if as_json:
        click.echo(json.dumps(report.to_json(now), indent=2))
    else:
        click.echo(render_text(report, now))
