"""kit keys add|set|revoke|list: Bearer keys for programs (the OpenAI SDK's api_key)."""

import click

from kit.commands.options import (
    credential_holding,
    credential_site,
    offline_option,
    policy_set_command,
    report,
    spec_argument,
    wait_lock_option,
    with_policy_options,
)
from kit.credentials.material import read_keys
from kit.credentials.policy import policy_change, principal, read_policies, shown_policy
from kit.front_door.credential_change import add_key, revoke_key
from kit.layout import SiteLayout


@click.group("keys")
def keys_group() -> None:
    """API keys sent as `Authorization: Bearer <key>`; only their SHA-256 is stored."""


@keys_group.command("add")
@click.argument("args", nargs=-1, metavar="[SPEC] NAME")
@with_policy_options
@offline_option
@wait_lock_option
def add(args: tuple[str, ...], offline: bool, wait_lock: float, **policy: object) -> None:
    """Create key NAME and print it once (live: nginx reloads and the key is proven), with its
    policy (docs/policy.md)."""
    spec, layout, name, connection = credential_site(args, "NAME", offline)
    change = policy_change(spec, policy)
    if not spec.auth.api_keys:
        click.echo("warning: auth.api_keys is false: nginx ignores keys until it is true", err=True)
    with credential_holding(spec, layout, "keys add", wait_lock, offline):
        key, outcome = add_key(spec, layout, name, connection, change)
    click.echo(f"key {name}: {key}\n  (shown once; only its SHA-256 is stored)")
    report(outcome)


@keys_group.command("revoke")
@click.argument("args", nargs=-1, metavar="[SPEC] NAME")
@offline_option
@wait_lock_option
def revoke(args: tuple[str, ...], offline: bool, wait_lock: float) -> None:
    """Revoke key NAME: its next request gets 401."""
    spec, layout, name, connection = credential_site(args, "NAME", offline)
    with credential_holding(spec, layout, "keys revoke", wait_lock, offline):
        outcome = revoke_key(spec, layout, name, connection)
    click.echo(f"revoked {name}")
    report(outcome)


policy_set_command(keys_group, "key", "NAME")


@keys_group.command("list")
@spec_argument
def list_keys(spec) -> None:
    """Key names, when they were created and their policy (the keys themselves are not
    stored)."""
    layout = SiteLayout(spec.parent)
    policies = read_policies(layout)
    for name, entry in sorted(read_keys(layout).items()):
        click.echo(f"{name}\tcreated {entry['created']}\tsha256 {entry['sha256'][:12]}…\t"
                   f"{shown_policy(policies, principal('key', name))}")


keys = keys_group
