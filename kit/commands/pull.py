"""kit pull: fetch the pinned models into models_root and verify them against the lock file."""

import sys
from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.engine.docker_api import connect
from kit.engine.url import is_local
from kit.site import Site
from kit.spec.model import DEFAULT_SPEC
from kit.supply.remote_pull import pull_site_remote
from kit.weights.pull import pull_site


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
    if service is None and not spec.exists() and spec.suffix == "":
        spec, service = DEFAULT_SPEC, str(spec)
    site = Site.load(spec, check_host=False)  # the folders are what this verb makes
    with holding(site.layout.root, "pull", wait_lock):
        if is_local(site.engine_url):
            results = pull_site(site.spec, site.layout, service, sys.stderr)
        else:  # the engine's host downloads itself: never through this machine
            results = pull_site_remote(connect(site.engine_url), site.spec, site.layout,
                                       service, sys.stderr)
    for result in results:
        click.echo(result.summary())
