"""kit validate: check a spec without writing anything."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.plan import build_plan
from kit.spec import load_spec, spec_warnings


@click.command()
@spec_argument
def validate(spec: Path) -> None:
    """Check SPEC (default ./site.yaml): exit 0 when valid, 2 with every problem listed."""
    loaded = load_spec(spec)
    plan = build_plan(loaded)
    for warning in spec_warnings(loaded) + plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{spec}: valid ({len(loaded.services)} service(s), site {loaded.site})")
