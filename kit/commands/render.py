"""kit render: spec → compose file, nginx config and credentials, atomically."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.render import render_site


@click.command()
@spec_argument
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Site folder to write into (default: the spec's folder).",
)
@click.option("--dry-run", is_flag=True, help="Print a diff of what would change; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite files edited by hand since the last render.")
def render(spec: Path, out: Path | None, dry_run: bool, force: bool) -> None:
    """Write compose/docker-compose.yml, nginx/ and credentials from SPEC (default ./site.yaml)."""
    result = render_site(spec, out, force=force, dry_run=dry_run)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if dry_run:
        for change in result.changes:
            secret = not change.output.generated
            if secret:
                verb = "create" if change.old is None else "update"
                click.echo(f"would {verb} {change.output.path} (credential material, not shown)")
            else:
                click.echo(change.diff or f"would create {change.output.path} (empty)", nl=False)
        if not result.changes:
            click.echo("no change")
        return
    for change in result.changes:
        verb = "created" if change.old is None else "updated"
        click.echo(f"{verb} {change.output.path}")
    if not result.changes:
        click.echo(f"no change: {len(result.plan.services)} service(s) already rendered")
    for service in result.plan.services:
        seqs = service.max_num_seqs if service.max_num_seqs is not None else "vLLM default"
        click.echo(
            f"  {service.name}: GPUs {','.join(service.gpus)}, max_num_seqs {seqs} "
            f"({service.max_num_seqs_reason})"
        )
    for new in result.new_passwords:
        click.echo(
            f"password for {new.user}: {new.password}\n"
            "  (shown once; only its bcrypt hash is stored. Change it with kit rotate-password)"
        )
