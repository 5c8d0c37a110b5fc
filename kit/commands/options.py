"""Arguments several verbs share, and what the credential verbs read and print."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kit.site_lock import DEFAULT_WAIT_SECONDS
from kit.spec.model import DEFAULT_SPEC

if TYPE_CHECKING:  # imported when a credential verb runs, not by every verb
    from kit.front_door.credential_change import ReloadOutcome
    from kit.front_door.reload import Connection
    from kit.layout import SiteLayout
    from kit.spec.model import Spec

spec_argument = click.argument(
    "spec",
    required=False,
    default=str(DEFAULT_SPEC),
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="[SPEC]",
)

offline_option = click.option(
    "--offline", is_flag=True,
    help="Change the files only, without the engine: nothing is reloaded or proven, and the "
    "change takes effect at the next `kit up`. Without it, a change that cannot be made live "
    "and proven fails (exit 1) and leaves the files as they were.",
)

wait_lock_option = click.option(
    "--wait-lock", type=click.FloatRange(min=0), default=DEFAULT_WAIT_SECONDS, show_default=True,
    metavar="SECONDS",
    help="When another kit command is changing this site (or its stack on the same engine), "
    "wait this long for it to finish, then give up (exit 1) naming it; 0 gives up at once.",
)


def holding(root: Path, verb: str, wait: float, stack: "tuple[str, str] | None" = None):
    """The site lock (kit/site_lock.py) for a verb, its waiting said on stderr."""
    from kit.site_lock import site_lock

    return site_lock(root, verb, stack=stack, wait=wait,
                     report=lambda line: click.echo(line, err=True))


def credential_holding(spec: "Spec", layout: "SiteLayout", verb: str, wait: float,
                       offline: bool):
    """A credential verb's site lock: the folder's, and the stack's when it reloads nginx."""
    from kit.engine.url import resolve

    return holding(layout.root, verb, wait, None if offline else (resolve(spec.engine), spec.site))


password_options: list[Callable] = [
    click.option("--password-stdin", is_flag=True,
                 help="Read the new password from stdin's first line (and, for "
                 "rotate-password, the current one from the second)."),
    click.option("--generate", is_flag=True,
                 help="Generate a strong password and print it once. This is also what happens "
                 "without a terminal to ask on and without --password-stdin."),
]


def with_password_options(command: Callable) -> Callable:
    for option in reversed(password_options):
        command = option(command)
    return command


def spec_or_service(spec: Path, service: str | None) -> tuple[Path, str | None]:
    """`[SPEC] [SERVICE]` where one word may be either: a word that is no file and has no
    suffix is a service of ./site.yaml (`kit pull SERVICE`)."""
    if service is None and not spec.exists() and spec.suffix == "":
        return DEFAULT_SPEC, str(spec)
    return spec, service


def spec_and_name(values: tuple[str, ...], what: str) -> tuple[Path, str]:
    """`[SPEC] NAME` as the verbs that change credentials take it."""
    if len(values) == 1:
        return DEFAULT_SPEC, values[0]
    if len(values) == 2:
        return Path(values[0]), values[1]
    raise click.UsageError(f"expected [SPEC] {what}")


def credential_site(
    values: tuple[str, ...], what: str, offline: bool
) -> "tuple[Spec, SiteLayout, str, Connection | None]":
    """(spec, layout, name, connection) for the verbs that change credentials of a rendered
    site; the connection is the real engine and front door, or None with --offline."""
    from kit.credentials.store import require_rendered
    from kit.front_door.reload import live
    from kit.site import Site

    spec_path, name = spec_and_name(values, what)
    site = Site.load(spec_path)
    require_rendered(site.layout)
    return site.spec, site.layout, name, None if offline else live(site.spec)


def read_passwords(
    from_stdin: bool, generate: bool, *, ask_current: bool
) -> tuple[str, str | None, bool]:
    """(new password, current password or None, whether it was generated).

    From stdin: the new password on the first line, optionally the current one on the second.
    On a terminal: the current one first (optional), then the new one twice. Neither: generated.
    """
    from kit.credentials.material import generate_password
    from kit.errors import BadInput

    if from_stdin and generate:
        raise click.UsageError("--password-stdin and --generate exclude each other")
    if from_stdin:
        lines = sys.stdin.read().split("\n")
        if not lines[0]:
            raise BadInput("no password on standard input", fix="printf 'NEW\\nCURRENT\\n' | ...")
        return lines[0], (lines[1] if len(lines) > 1 and lines[1] else None), False
    terminal = sys.stdin.isatty()
    current = None
    if ask_current and terminal:
        current = click.prompt(
            "current password (Enter to skip proving that it stops working)",
            hide_input=True, default="", show_default=False,
        ) or None
    if generate or not terminal:
        return generate_password(), current, True
    new = click.prompt("new password", hide_input=True, confirmation_prompt=True)
    return new, current, False


def report(outcome: "ReloadOutcome") -> None:
    """How the change went live, or why it was not reloaded."""
    if outcome.proxy is None:
        click.echo(outcome.note)
        return
    click.echo(f"reloaded {outcome.proxy} in place (no restart, running streams continue)")
    for line in outcome.proof:
        click.echo(f"  proven through the front door: {line}")


# --------------------------------------------------------------------------- credential policy

CLEARABLE = ("models", "expires", "class", "tokens-per-day", "tokens-per-month",
             "requests-per-minute")
policy_options: list[Callable] = [
    click.option("--models", help="Served model names this credential may use, comma-separated "
                 "(others are refused as if they did not exist). Default: all."),
    click.option("--expires", help="Refused from this time on: a date (00:00 UTC that day) or an "
                 "ISO time."),
    click.option("--class", "klass", type=click.Choice(["interactive", "batch"]),
                 help="interactive (default) or batch: batch yields to interactive."),
    click.option("--tokens-per-day", metavar="N",
                 help="Prompt + completion tokens a UTC day, as the usage ledger counts "
                 "them (docs/policy.md)."),
    click.option("--tokens-per-month", metavar="N",
                 help="Prompt + completion tokens a UTC month (docs/policy.md)."),
    click.option("--requests-per-minute", metavar="N",
                 help="Requests a UTC minute (docs/policy.md)."),
]
clear_option = click.option(
    "--clear", "clear", multiple=True, type=click.Choice(CLEARABLE),
    help="Remove that part of the policy (repeatable): models → all, expires → never, class → "
    "interactive, a limit → none.")


def with_policy_options(command: Callable) -> Callable:
    for option in reversed(policy_options):
        command = option(command)
    return command


def policy_set_command(group: click.Group, kind: str, what: str) -> None:
    """`kit keys set` / `kit users set`: change a credential's policy, live."""
    from kit.credentials.policy import policy_change, principal, read_policies, shown_policy
    from kit.front_door.credential_change import set_policy

    @group.command("set", help=f"Change {kind} {what}'s policy, live (options not given stay "
                   "as they are).")
    @click.argument("args", nargs=-1, metavar=f"[SPEC] {what}")
    @with_policy_options
    @clear_option
    @offline_option
    @wait_lock_option
    def set_command(args: tuple[str, ...], offline: bool, wait_lock: float,
                    clear: tuple[str, ...], **policy: object) -> None:
        spec, layout, name, connection = credential_site(args, what, offline)
        change = policy_change(spec, policy, clear)
        with credential_holding(spec, layout, f"{kind}s set", wait_lock, offline):
            outcome = set_policy(spec, layout, kind, name, change, connection)
        click.echo(f"{kind} {name}: {shown_policy(read_policies(layout), principal(kind, name))}")
        report(outcome)
