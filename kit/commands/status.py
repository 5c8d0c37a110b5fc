"""kit status: what runs, how healthy, what `kit up` would change, and the last gate result."""

import json
from datetime import UTC, datetime
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.engine.docker_api import connect
from kit.site import Site
from kit.views.status import gather, render_text


@click.command()
@spec_argument
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(spec: Path, as_json: bool) -> None:
    """Show the containers of SPEC's stack, drift from the spec and the last probe result."""
    site = Site.load(spec)
    report = gather(site, connect(site.engine_url))
    now = datetime.now(UTC)
    if as_json:
        click.echo(json.dumps(report.to_json(now), indent=2))
    else:
        click.echo(render_text(report, now))
