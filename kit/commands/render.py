"""kit render: spec → compose file, nginx config and credentials, atomically."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.render.site_files import render_site
from kit.site import Site


@click.command()
@spec_argument
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Site folder to write into (default: the spec's folder).",
)
@click.option("--dry-run", is_flag=True, help="Print a diff of what would change; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite files edited by hand since the last render.")
@wait_lock_option
def render(spec: Path, out: Path | None, dry_run: bool, force: bool, wait_lock: float) -> None:
    """Write compose/ (with a 0600 env file per service), nginx/ and credentials from SPEC
    (default ./site.yaml), all or nothing. Users dropped from auth.users are removed."""
    site = Site.load(spec, out=out)
    if dry_run:  # writes nothing: reads what is there, with no lock
        result = render_site(site, force=force, dry_run=True)
    else:
        with holding(site.layout.root, "render", wait_lock):
            result = render_site(site, force=force)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if dry_run:
        click.echo("\n".join(result.dry_run_report()))
        return
    click.echo("\n".join(result.summary()))
    result.passwords_shown()
