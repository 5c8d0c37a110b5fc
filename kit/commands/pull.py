"""kit pull: fetch the pinned models into models_root and verify them against the lock file."""

import sys
from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, spec_or_service, wait_lock_option
from kit.site import Site
from kit.supply.pull import pull_models


@click.command()
@spec_argument
@click.argument("service", required=False)
@wait_lock_option
def pull(spec: Path, service: str | None, wait_lock: float) -> None:
    """Download the pinned models of SPEC (or of SERVICE) into models_root, resumably, each
    file checked against site.lock; `kit pull SERVICE` reads ./site.yaml. With engine:
    ssh://… the server downloads them itself, in a throwaway container of the vLLM image.

    Reads HF_TOKEN and HF_ENDPOINT from the environment (the token is never written here;
    on a server it goes in a 0400 file of that container, removed with it)."""
    spec, service = spec_or_service(spec, service)
    site = Site.load(spec, check_host=False)  # the folders are what this verb makes
    with holding(site.layout.root, "pull", wait_lock):
        results = pull_models(site, service, sys.stderr)
    for result in results:
        click.echo(result.summary())
