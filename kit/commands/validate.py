"""kit validate: check a spec without writing anything."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.plan.build import build_plan
from kit.plan.host import spec_warnings
from kit.site import Site


@click.command()
@spec_argument
def validate(spec: Path) -> None:
    """Check SPEC (default ./site.yaml): exit 0 when valid, 2 with every problem listed."""
    site = Site.load(spec)
    for warning in spec_warnings(site.spec, spec) + build_plan(site.spec).warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{spec}: valid ({len(site.spec.services)} service(s), site {site.project})")
