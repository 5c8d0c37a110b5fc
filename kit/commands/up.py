"""kit up: render when the spec changed, converge the stack, wait for health, run the gate."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.commands.render import render
from kit.errors import KitError
from kit.reconcile import changes
from kit.up import Site, converge


@click.command()
@spec_argument
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    help="Seconds to wait for health (default: the healthcheck's start_period plus retries).",
)
@click.option("--no-probe", is_flag=True, help="Skip the gate (the end-to-end probe).")
@click.pass_context
def up(ctx: click.Context, spec: Path, timeout: float | None, no_probe: bool) -> None:
    """Start or update the stack of SPEC (default ./site.yaml) and prove it answers."""
    ctx.invoke(render, spec=spec, out=None, dry_run=False, force=False)
    site = Site.load(spec)
    result = converge(site, timeout=timeout, report=click.echo)
    changed = changes(result.plan)
    count = len(site.desired.services)
    if changed:
        click.echo(f"stack {site.desired.project}: {len(changed)} change(s) applied, "
                   f"{count} container(s) healthy ({result.seconds:.1f}s)")
    else:
        click.echo(f"no change: {count} container(s) up to date ({result.seconds:.1f}s)")
    if no_probe:
        return
    from kit.probe import run_probe  # the gate: only imported when it runs

    probe = run_probe(site.spec, site.layout)
    click.echo(probe.render())
    if not probe.ok:
        raise KitError(
            "the gate failed: the stack runs but does not serve as the spec says",
            fix="see the failed checks above; `kit status` and `kit logs` show more",
        )
