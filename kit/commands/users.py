"""kit users add|set|remove|list: the people who log in with HTTP Basic auth (bcrypt at rest)."""

import click

from kit.commands.options import (
    credential_holding,
    credential_site,
    offline_option,
    policy_set_command,
    read_passwords,
    report,
    spec_argument,
    wait_lock_option,
    with_password_options,
    with_policy_options,
)
from kit.credentials.policy import policy_change, principal, read_policies, shown_policy
from kit.credentials.store import listed_users
from kit.front_door.credential_change import add_user, remove_user
from kit.site import Site


@click.group("users")
def users_group() -> None:
    """People who log in with a user name and password."""


@users_group.command("add")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
@with_password_options
@with_policy_options
@offline_option
@wait_lock_option
def add(args: tuple[str, ...], password_stdin: bool, generate: bool, offline: bool,
        wait_lock: float, **policy: object) -> None:
    """Add USER with a new password, live (nginx reloads in place and the login is proven),
    with its policy (docs/policy.md).

    The password is asked for twice on a terminal; without one (a script), it is generated and
    printed once unless --password-stdin gives it.
    """
    spec, layout, user, connection = credential_site(args, "USER", offline)
    change = policy_change(spec, policy)
    password, _, generated = read_passwords(password_stdin, generate, ask_current=False)
    with credential_holding(spec, layout, "users add", wait_lock, offline):
        outcome = add_user(spec, layout, user, password, connection, change)
    click.echo(f"added {user}")
    if generated:
        click.echo(f"password for {user}: {password}  (shown once)")
    report(outcome)


@users_group.command("remove")
@click.argument("args", nargs=-1, metavar="[SPEC] USER")
@offline_option
@wait_lock_option
def remove(args: tuple[str, ...], offline: bool, wait_lock: float) -> None:
    """Remove USER; their next request gets 401."""
    spec, layout, user, connection = credential_site(args, "USER", offline)
    with credential_holding(spec, layout, "users remove", wait_lock, offline):
        outcome = remove_user(spec, layout, user, connection)
    click.echo(f"removed {user}")
    report(outcome)


policy_set_command(users_group, "user", "USER")


@users_group.command("list")
@spec_argument
def list_users(spec) -> None:
    """The users in the password file (marking those the spec lists and kit's probe), and
    their policy."""
    site = Site.load(spec)
    policies = read_policies(site.layout)
    for user, origin in listed_users(site.spec, site.layout):
        click.echo(f"{user}\t{origin}\t{shown_policy(policies, principal('user', user))}")


users = users_group
