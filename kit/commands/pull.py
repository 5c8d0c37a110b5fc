"""kit pull: fetch the pinned models into models_root and verify them against the lock file."""

import sys
from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.engine.url import is_local
from kit.errors import BadInput
from kit.site import Site
from kit.spec.model import DEFAULT_SPEC
from kit.weights.pull import pull_site


@click.command()
@spec_argument
@click.argument("service", required=False)
@wait_lock_option
def pull(spec: Path, service: str | None, wait_lock: float) -> None:
    """Download the pinned models of SPEC (or of SERVICE) into models_root, resumably, each
    file checked against site.lock; `kit pull SERVICE` reads ./site.yaml.

    Reads HF_TOKEN and HF_ENDPOINT from the environment (the token is never written)."""
    if service is None and not spec.exists() and spec.suffix == "":
        spec, service = DEFAULT_SPEC, str(spec)
    site = Site.load(spec, check_host=False)  # the folders are what this verb makes
    if not is_local(site.engine_url):
        raise BadInput(
            f"kit pull on a remote engine ({site.engine_url}) is not supported yet",
            fix="run `kit pull` on the GPU server itself (it must never download through "
            "this machine); docs/weights.md lists this gap")
    with holding(site.layout.root, "pull", wait_lock):
        results = pull_site(site.spec, site.layout, service, sys.stderr)
    for result in results:
        click.echo(result.summary())
