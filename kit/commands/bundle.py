"""kit bundle: the site's images, pinned models, lock file and kit itself in one verified
archive, for an air-gapped server (docs/offline.md)."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.engine.docker_api import connect
from kit.site import Site
from kit.supply.bundle import bundle_site
from kit.supply.wheelhouse import build_wheelhouse


@click.command()
@spec_argument
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="The archive to write (whole or not at all).")
@click.option("--without-kit", is_flag=True,
              help="Leave out kit's wheel and its dependencies (the server has this kit).")
@wait_lock_option
def bundle(spec: Path, out: Path, without_kit: bool, wait_lock: float) -> None:
    """On a connected machine: write FILE with the images SPEC's stack runs (docker save
    through the engine), its pinned models (verified against site.lock first), site.lock, and
    kit's wheel with its dependencies hash-pinned; a manifest holds every member's sha256.
    Carry FILE to the server and run `kit load FILE SPEC` there."""
    site = Site.load(spec, check_host=False)  # the pinned folders are checked against the lock
    engine = connect(site.engine_url)
    with holding(site.layout.root, "bundle", wait_lock):
        result = bundle_site(site.spec, site.layout, engine, out,
                             None if without_kit else build_wheelhouse,
                             lambda line: click.echo(line, err=True))
    click.echo(result.summary())
