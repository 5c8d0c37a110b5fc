"""kit rotate-password: change a person's password with no dropped stream, proven live."""

import click

from kit.commands.options import (
    credential_holding,
    credential_site,
    offline_option,
    read_passwords,
    report,
    wait_lock_option,
    with_password_options,
)
from kit.front_door.credential_change import rotate_password as rotate


@click.command("rotate-password")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
@with_password_options
@offline_option
@wait_lock_option
def rotate_password(
    args: tuple[str, ...], password_stdin: bool, generate: bool, offline: bool, wait_lock: float
) -> None:
    """Change USER's password: atomic swap, in-place nginx reload, proof through the front door.

    Once nginx has reloaded, the new password must get 200 (and the current one, when given,
    401) through the front door; otherwise the previous file is restored, nginx reloads it and
    the command fails. On a terminal the passwords are asked for; without one (a script), the
    new password is generated and printed once unless --password-stdin gives it.
    """
    spec, layout, user, connection = credential_site(args, "USER", offline)
    password, current, generated = read_passwords(password_stdin, generate, ask_current=True)
    with credential_holding(spec, layout, "rotate-password", wait_lock, offline):
        outcome = rotate(spec, layout, user, password, current, connection)
    click.echo(f"password of {user} changed (previous file kept in {layout.state_dir}/backup/)")
    if generated:
        click.echo(f"new password for {user}: {password}  (shown once)")
    report(outcome)
