"""kit users add|remove|list: the people who log in with HTTP Basic auth (bcrypt at rest)."""

import click

from kit.access import remove_user, require_rendered, set_password
from kit.access import users as password_entries
from kit.commands.options import credential_site, spec_argument
from kit.commands.rotate_password import read_passwords, report
from kit.credential_change import Expectation, apply
from kit.layout import PROBE_USER, SiteLayout
from kit.probe import basic_header
from kit.spec import load_spec


@click.group("users")
def users_group() -> None:
    """People who log in with a user name and password."""


@users_group.command("add")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
@click.option("--generate", is_flag=True, help="Generate a strong password and print it once.")
def add(args: tuple[str, ...], password_stdin: bool, generate: bool) -> None:
    """Add USER with a new password, live (nginx reloads in place and the login is proven)."""
    spec, layout, user = credential_site(args, "USER")
    password, _ = read_passwords(password_stdin, generate, ask_current=False)
    applied = apply(
        spec, layout, lambda: set_password(layout, user, password, must_exist=False),
        lambda: [Expectation(f"login of {user}", basic_header(user, password), 200)],
    )
    click.echo(f"added {user}")
    if generate:
        click.echo(f"password for {user}: {password}  (shown once)")
    report(applied)


@users_group.command("remove")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
def remove(args: tuple[str, ...]) -> None:
    """Remove USER; their next request gets 401."""
    spec, layout, user = credential_site(args, "USER")
    report(apply(spec, layout, lambda: remove_user(layout, user, spec.auth.users)))
    click.echo(f"removed {user}")


@users_group.command("list")
@spec_argument
def list_users(spec) -> None:
    """The users in the password file (marking those the spec lists and kit's probe)."""
    loaded = load_spec(spec)
    layout = SiteLayout(spec.parent)
    require_rendered(layout)
    for user in sorted(password_entries(layout)):
        origin = "kit probe" if user == PROBE_USER else (
            "spec" if user in loaded.auth.users else "added")
        click.echo(f"{user}\t{origin}")


users = users_group
