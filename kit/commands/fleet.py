"""kit fleet [DIR] VERB [ARGS]…: one verb over every server of a fleet folder, one row each."""

from pathlib import Path

import click

from kit.commands.options import read_passwords
from kit.fleet import (
    ServerResult,
    failed_summary,
    fleet_specs,
    one_writer_per_stack,
    results_table,
    run_all,
    run_verb,
    server_status,
    status_table,
)

# verb → how many words name it (`users add` is two)
FLEET_VERBS = {"status": 1, "render": 1, "up": 1, "probe": 1, "rotate-password": 1,
               "users": 2, "keys": 2, "usage": 1, "pull": 1}
NEW_PASSWORD = {("rotate-password",): "password", ("users", "add"): "password"}
CREDENTIAL = {**NEW_PASSWORD, ("users", "remove"): "user list", ("keys", "add"): "key list",
              ("keys", "revoke"): "key list"}
SHOW_OUTPUT = {("users", "list"), ("keys", "list"), ("keys", "add")}  # the output is the point


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False})
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="[DIR] VERB [ARGS]...")
def fleet(words: tuple[str, ...]) -> None:
    """Run VERB over every server of DIR (default .): DIR/<server>/site.yaml, one per server.

    VERB: status | render | up | probe | rotate-password USER | users add|remove|list [USER] |
    keys add|revoke|list [NAME] | usage [--since --until --by --csv --json] (every server's
    totals in one table with a SERVER column, then the servers that could not be read) |
    pull [SERVICE] (each server downloads its own pinned models from the Hub, verified
    against its site.lock; never through this machine).
    Servers run in parallel (at most 8 at once); each gets one row with its result, time and
    cause. Exit 1 when any server failed (the others still ran).
    rotate-password and users add set the SAME password everywhere (asked, read with
    --password-stdin, or generated and printed once) and say where it is live and where the old
    one still is. Every verb but status and usage refuses (exit 2, before anything runs) two
    folders that are one stack: the same engine and the same site name.
    """
    folder, verb, args = _parse(list(words))
    specs = fleet_specs(folder)
    if verb == ("status",):
        statuses = run_all(specs, server_status)
        click.echo(status_table(statuses))
        failed = [s.server for s in statuses if not s.ok]
    elif verb == ("usage",):
        failed = _usage(specs, args)
    else:
        one_writer_per_stack(specs)
        stdin, secret = None, None
        if verb in NEW_PASSWORD:
            stdin_flag, generate = "--password-stdin" in args, "--generate" in args
            args = [a for a in args if a not in ("--password-stdin", "--generate")]
            new, current, generated = read_passwords(
                stdin_flag, generate, ask_current=verb == ("rotate-password",))
            stdin, args = f"{new}\n{current or ''}\n", [*args, "--password-stdin"]
            secret = new if generated else None
        results = run_all(specs, lambda spec: run_verb(
            spec, list(verb), args, stdin, CREDENTIAL.get(verb)))
        click.echo(results_table(results))
        _details(verb, results)
        if secret is not None:
            click.echo(f"the new password: {secret}  (shown once; live where the table says)")
        failed = [r.server for r in results if not r.ok]
    if failed:
        raise failed_summary(failed, len(specs))


def _parse(words: list[str]) -> tuple[Path, tuple[str, ...], list[str]]:
    folder = Path(".")
    if words and words[0] not in FLEET_VERBS:
        folder = Path(words.pop(0))
    if not words or words[0] not in FLEET_VERBS:
        raise click.UsageError(f"expected [DIR] VERB, VERB one of {', '.join(FLEET_VERBS)}")
    count = FLEET_VERBS[words[0]]
    if len(words) < count:
        raise click.UsageError(f"`{words[0]}` needs a sub-verb (e.g. {words[0]} list)")
    return folder, tuple(words[:count]), words[count:]


def _details(verb: tuple[str, ...], results: list[ServerResult]) -> None:
    """Each server's own output when it is the point (lists, a new key)."""
    if verb not in SHOW_OUTPUT:
        return
    for result in results:
        click.echo(f"== {result.server}")
        click.echo(result.output.rstrip() or "(nothing)")


def _usage(specs: list[Path], args: list[str]) -> list[str]:
    """Every server's usage merged (one period, one `now` for all); the failed servers."""
    from datetime import UTC, datetime

    from kit.commands.usage import query, query_options, show_totals
    from kit.fleet import server_usage

    now = datetime.now(UTC)
    parse = query_options(click.Command("usage", callback=lambda **values: values))
    values = parse.main(args, "kit fleet DIR usage", standalone_mode=False)
    if not isinstance(values, dict):  # --help was shown
        return []
    chosen, keys, form = query(**values, now=now)
    found = run_all(specs, lambda spec: server_usage(spec, chosen, now))
    sections = [(row.server, row.usage) for row in found if row.usage is not None]
    if sections:
        show_totals(form, sections, keys)
    failed = [row for row in found if row.usage is None]
    if failed:
        click.echo(results_table([ServerResult(row.server, False, row.seconds, "FAILED",
                                               row.cause) for row in failed]), err=True)
    return [row.server for row in failed]
