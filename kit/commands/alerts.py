"""kit alerts list|silence|expire: the site's Alertmanager (observability.alerts) — what fires,
silenced or not, and its silences."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.engine.docker_api import connect
from kit.site import Site
from kit.stack.alerts import expire, list_alerts, matchers, running_alertmanager, silence
from kit.table import text_table


@click.group("alerts")
def alerts() -> None:
    """What Alertmanager holds (firing or silenced) and its silences (docs/observability.md)."""


@alerts.command("list")
@spec_argument
def list_command(spec: Path) -> None:
    """The alerts Alertmanager holds now and its silences."""
    site = Site.load(spec)
    engine = connect(site.engine_url)
    found, silences = list_alerts(engine, running_alertmanager(site, engine))
    if found:
        click.echo(text_table([["alert", "state", "labels", "since", "summary"], *(
            [a.name, "SILENCED" if a.state == "suppressed" else a.state,
             ",".join(f"{k}={v}" for k, v in sorted(a.labels.items())), a.since, a.summary]
            for a in found)]))
    else:
        click.echo("no alert firing")
    for s in silences:
        click.echo(f"silence {s.id} ({s.state}, until {s.ends}): {s.matchers} — {s.comment}")


@alerts.command("silence")
@spec_argument
@click.argument("alert")
@click.option("--label", "labels", multiple=True, metavar="NAME=VALUE",
              help="Only the alerts with this label too (repeatable), e.g. service=llama8b.")
@click.option("--for", "duration", default="2h", show_default=True,
              help="How long: 30m, 2h, 1d, 1w.")
@click.option("--comment", required=True, help="Why (Alertmanager shows it beside the silence).")
def silence_command(spec: Path, alert: str, labels: tuple[str, ...], duration: str,
                    comment: str) -> None:
    """Silence ALERT (its notifications stop; it still shows here and in kit status)."""
    matchers(alert, labels)  # bad input refused before the engine is reached
    site = Site.load(spec)
    engine = connect(site.engine_url)
    silence_id = silence(engine, running_alertmanager(site, engine), alert, labels, duration,
                         comment)
    click.echo(f"silence {silence_id}: {alert} for {duration} (kit alerts expire SPEC "
               f"{silence_id} ends it)")


@alerts.command("expire")
@spec_argument
@click.argument("silence_id", metavar="ID")
def expire_command(spec: Path, silence_id: str) -> None:
    """End silence ID now."""
    site = Site.load(spec)
    engine = connect(site.engine_url)
    expire(engine, running_alertmanager(site, engine), silence_id)
    click.echo(f"silence {silence_id} expired")
