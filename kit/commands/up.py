"""kit up: render when the spec changed, converge the stack, wait for health, run the gate."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.errors import KitError
from kit.site import Site
from kit.stack.up import up_site


@click.command()
@spec_argument
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    help="Seconds to wait for health (default: the healthcheck's start_period plus retries).",
)
@click.option("--no-probe", is_flag=True, help="Skip the gate (the end-to-end probe).")
@wait_lock_option
def up(spec: Path, timeout: float | None, no_probe: bool, wait_lock: float) -> None:
    """Start or update the stack of SPEC (default ./site.yaml) and prove it answers.

    One writer per site: while another kit command changes this site folder or this stack
    (same engine, same site name), it waits up to --wait-lock seconds, then exits 1 naming it."""
    site = Site.load(spec)
    with holding(site.layout.root, "up", wait_lock, (site.engine_url, site.project)):
        result = up_site(
            site, timeout=timeout, probe=not no_probe, report=click.echo,
            warn=lambda warning: click.echo(f"warning: {warning}", err=True),
        )
    click.echo(result.summary())
    if result.probe is not None:
        click.echo(result.probe.render())
        if not result.probe.ok:
            raise KitError(
                "the gate failed: the stack runs but does not serve as the spec says",
                fix="see the failed checks above; `kit status` and `kit logs` show more",
            )
    acme = result.acme
    if acme is not None and acme.waiting and acme.cause is not None:
        raise KitError(f"no certificate from the ACME CA yet ({acme.cause.name}): "
                       f"{acme.cause.message}", fix=acme.cause.fix)
