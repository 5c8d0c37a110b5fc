"""kit export k8s: the site as Kubernetes manifests."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.site import Site


@click.group()
def export() -> None:
    """Write the site for another platform."""


@export.command()
@spec_argument
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the manifests into (created if needed).")
@click.option("--namespace", help="Kubernetes namespace of every object (default: the site name).")
@click.option("--force", is_flag=True, help="Overwrite manifests edited by hand since the last "
              "export.")
def k8s(spec: Path, out: Path, namespace: str | None, force: bool) -> None:
    """Kubernetes manifests of SPEC (default ./site.yaml): per service a Deployment (a
    LeaderWorkerSet when it spans nodes) and a Service, the front door with the site's nginx.conf
    and credentials (run `kit render` first), and NetworkPolicies. Prints what Kubernetes cannot
    do that the compose stack does."""
    from kit.render.k8s import export_site  # PyYAML dumping and templates: only when exporting

    result = export_site(Site.load(spec), out, namespace=namespace, force=force)
    click.echo("\n".join(result.summary(out)))
