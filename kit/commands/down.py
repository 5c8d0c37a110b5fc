"""kit down: stop and remove the stack's containers and networks (volumes only when asked)."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.site import Site
from kit.stack.down import down_site


@click.command()
@spec_argument
@click.option("--volumes", is_flag=True, help="Also remove the named volumes (the HF cache).")
@wait_lock_option
def down(spec: Path, volumes: bool, wait_lock: float) -> None:
    """Stop and remove the containers and networks of SPEC's stack (default ./site.yaml)."""
    site = Site.load(spec, check_host=False)
    with holding(site.layout.root, "down", wait_lock, (site.engine_url, site.project)):
        click.echo(down_site(site, volumes, click.echo))
