"""kit lock: resolve each pinned model's revision on the Hub and write the lock file."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.site import Site
from kit.weights.hub import lock_site


@click.command()
@spec_argument
@wait_lock_option
def lock(spec: Path, wait_lock: float) -> None:
    """Write site.lock beside SPEC: each pinned model's commit and every file's size and sha256.

    LFS files' hashes are the Hub's own; small files are downloaded at the commit and hashed.
    Reads HF_TOKEN and HF_ENDPOINT from the environment (the token is never written)."""
    site = Site.load(spec, check_host=False)  # the folders are pulled after the lock
    with holding(site.layout.root, "lock", wait_lock):
        models = lock_site(site.spec, site.layout.lock_file)
    for model in models:
        click.echo(f"{model.key}: commit {model.commit}, {len(model.files)} file(s), "
                   f"{model.total_bytes} bytes")
    click.echo(f"wrote {site.layout.lock_file} (review it and commit it beside the spec)")
