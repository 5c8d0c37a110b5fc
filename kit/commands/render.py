"""kit render: spec → compose file, env files, nginx config and credentials, as one transaction."""

from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.credentials import forget_shown_passwords
from kit.render import RenderResult, render_site


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
    """Write compose/ (with a 0600 env file per service), nginx/ and credentials from SPEC
    (default ./site.yaml), all or nothing. Users dropped from auth.users are removed."""
    result = render_site(spec, out, force=force, dry_run=dry_run)
    if result.recovered:
        click.echo(result.recovered)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if dry_run:
        for change in result.changes:
            if change.output.secret or not change.output.generated:
                verb = "create" if change.old is None else "update"
                click.echo(f"would {verb} {change.output.path} (secret material, not shown)")
            else:
                click.echo(change.diff or f"would create {change.output.path} (empty)", nl=False)
        if not result.changes:
            click.echo("no change")
        return
    unshown = result.layout.new_passwords.relative_to(result.layout.root)
    for change in result.changes:
        if change.output.path != unshown:  # the passwords themselves are printed below
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
    _report_users(result)


def _report_users(result: RenderResult) -> None:
    """Who lost access, who is not in the spec, and each new password exactly once."""
    for user in result.removed_users:
        click.echo(f"removed user {user}: no longer in auth.users (refused with 401 once nginx "
                   "reloads: kit up)")
    if result.unlisted_users:
        names = ", ".join(result.unlisted_users)
        click.echo(
            f"warning: htpasswd also lets in {names}, not in auth.users (added with `kit users "
            f"add`; render keeps them). Remove with: kit users remove USER, or list them in "
            "auth.users so that the spec owns them", err=True,
        )
    for new in result.new_passwords:
        click.echo(
            f"password for {new.user}: {new.password}\n"
            "  (shown once; only its bcrypt hash is stored. Change it with kit rotate-password)"
        )
    forget_shown_passwords(result.layout)
