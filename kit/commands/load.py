"""kit load: a bundle made by `kit bundle` verified whole, then its images loaded, its pinned
models placed under models_root and its lock entries added to site.lock (docs/offline.md)."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.engine.docker_api import connect
from kit.site import Site
from kit.supply.bundle import load_bundle


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@spec_argument
@click.option("--manifest-sha256", metavar="HEX",
              help="The manifest's sha256 `kit bundle` printed: the bundle must carry exactly it.")
@wait_lock_option
def load(file: Path, spec: Path, manifest_sha256: str | None, wait_lock: float) -> None:
    """Verify FILE (every member against its manifest) before using anything, then load its
    images into SPEC's engine, place its models under models_root (each renamed into place
    when verified against the lock) and add its entries to site.lock. A damaged or changed
    bundle is exit 2 naming the member, with nothing changed."""
    site = Site.load(spec, check_host=False)  # the models are what this verb places
    engine = connect(site.engine_url)
    with holding(site.layout.root, "load", wait_lock):
        result = load_bundle(file, site.spec, site.layout, engine,
                             manifest_sha256.lower() if manifest_sha256 else None,
                             lambda line: click.echo(line, err=True))
    click.echo(result.summary(site.layout))
