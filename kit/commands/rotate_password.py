"""kit rotate-password: change a person's password with no dropped stream, proven live."""

import sys

import click

from kit.access import set_password, users
from kit.commands.options import credential_site
from kit.credential_change import Applied, Expectation, apply
from kit.credentials import generate_password, verify_password
from kit.errors import BadInput
from kit.probe import basic_header


def read_passwords(
    from_stdin: bool, generate: bool, *, ask_current: bool
) -> tuple[str, str | None]:
    """(new password, current password or None when not given).

    From stdin: the new password on the first line, optionally the current one on the second.
    Interactively: the current one first (optional), then the new one twice.
    """
    if from_stdin and generate:
        raise click.UsageError("--password-stdin and --generate exclude each other")
    if from_stdin:
        lines = sys.stdin.read().split("\n")
        if not lines[0]:
            raise BadInput("no password on standard input", fix="printf 'NEW\\nCURRENT\\n' | ...")
        return lines[0], (lines[1] if len(lines) > 1 and lines[1] else None)
    current = None
    if ask_current and sys.stdin.isatty():
        current = click.prompt(
            "current password (Enter to skip proving that it stops working)",
            hide_input=True, default="", show_default=False,
        ) or None
    if generate:
        return generate_password(), current
    return click.prompt("new password", hide_input=True, confirmation_prompt=True), current


@click.command("rotate-password")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
@click.option(
    "--password-stdin", is_flag=True,
    help="Read the new password from stdin's first line (and the current one from the second).",
)
@click.option("--generate", is_flag=True, help="Generate a strong password and print it once.")
def rotate_password(args: tuple[str, ...], password_stdin: bool, generate: bool) -> None:
    """Change USER's password: atomic swap, in-place nginx reload, proof through the front door.

    Once nginx has reloaded, the new password must get 200 (and the current one, when given,
    401) through the front door; otherwise the previous file is restored and the command fails.
    """
    spec, layout, user = credential_site(args, "USER")
    password, current = read_passwords(password_stdin, generate, ask_current=True)
    known = users(layout)
    if current is not None and user in known and not verify_password(current, known[user]):
        raise BadInput(f"the current password of {user} is wrong", fix="nothing was changed")
    if current == password:
        raise BadInput("the new password is the current one", fix="choose a new password")
    expected = [Expectation("new password", basic_header(user, password), 200)]
    if current is not None:
        expected.append(Expectation("old password", basic_header(user, current), 401))
    applied = apply(
        spec, layout, lambda: set_password(layout, user, password, must_exist=True),
        lambda: expected,
    )
    click.echo(f"password of {user} changed (previous file kept in {layout.state_dir}/backup/)")
    if generate:
        click.echo(f"new password for {user}: {password}  (shown once)")
    report(applied)


def report(applied: Applied) -> None:
    if applied.proxy is None:
        click.echo(f"{applied.note}: the change takes effect when nginx starts (kit up)")
        return
    click.echo(f"reloaded {applied.proxy} in place (no restart, running streams continue)")
    for line in applied.proof:
        click.echo(f"  proven through the front door: {line}")
