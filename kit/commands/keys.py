"""kit keys add|revoke|list: Bearer keys for programs (the OpenAI SDK's api_key)."""

import click

from kit.access import add_key, revoke_key
from kit.commands.options import credential_site, spec_argument
from kit.commands.rotate_password import report
from kit.credential_change import Expectation, apply
from kit.credentials import read_keys
from kit.layout import SiteLayout


@click.group("keys")
def keys_group() -> None:
    """API keys sent as `Authorization: Bearer <key>`; only their SHA-256 is stored."""


@keys_group.command("add")
@click.argument("args", nargs=-1, metavar="[SPEC] NAME")
def add(args: tuple[str, ...]) -> None:
    """Create key NAME and print it once (live: nginx reloads and the key is proven)."""
    spec, layout, name = credential_site(args, "NAME")
    if not spec.auth.api_keys:
        click.echo("warning: auth.api_keys is false: nginx ignores keys until it is true", err=True)
    created: list[str] = []

    def change():
        key, before = add_key(layout, name)
        created.append(key)
        return before

    def expectations() -> list[Expectation]:
        if not spec.auth.api_keys:
            return []
        return [Expectation(f"key {name}", f"Bearer {created[0]}", 200)]

    applied = apply(spec, layout, change, expectations)
    click.echo(f"key {name}: {created[0]}\n  (shown once; only its SHA-256 is stored)")
    report(applied)


@keys_group.command("revoke")
@click.argument("args", nargs=-1, metavar="[SPEC] NAME")
def revoke(args: tuple[str, ...]) -> None:
    """Revoke key NAME: its next request gets 401."""
    spec, layout, name = credential_site(args, "NAME")
    report(apply(spec, layout, lambda: revoke_key(layout, name)))
    click.echo(f"revoked {name}")


@keys_group.command("list")
@spec_argument
def list_keys(spec) -> None:
    """Key names and when they were created (the keys themselves are not stored)."""
    layout = SiteLayout(spec.parent)
    for name, entry in sorted(read_keys(layout).items()):
        click.echo(f"{name}\tcreated {entry['created']}\tsha256 {entry['sha256'][:12]}…")


keys = keys_group
