"""kit audit verify | export: whether the usage ledger is whole, and its records as files."""

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.commands.usage import since_option, until_option
from kit.errors import KitError
from kit.usage.period import period


@click.group()
def audit() -> None:
    """The usage ledger as evidence: verify its hash chain, export its records."""


@audit.command()
@spec_argument
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify(spec: Path, as_json: bool) -> None:
    """Walk every segment of SPEC's usage ledger: seqs without gaps, each hash chained from the
    one before, pruned segments accounted for, every earlier verify's head still in the chain.

    Exit 0 with the count and the head (kept as an anchor in the site's .kit/); exit 1 naming
    the first altered, deleted or reordered record.
    """
    from kit.engine.docker_api import connect
    from kit.site import Site
    from kit.usage.audit import verify_site

    site = Site.load(spec, check_host=False)
    verdict, kept = verify_site(site, connect(site.engine_url), datetime.now(UTC))
    if as_json:
        click.echo(json.dumps(verdict.to_json(), indent=2))
    if verdict.finding is not None:
        raise KitError(f"the usage ledger is not whole: {verdict.finding}",
                       fix="keep the ledger's volume as it is for the investigation; compare "
                       "with an earlier `kit audit export` or a backup")
    if as_json:
        return
    pruned = f", {verdict.pruned:,} more in pruned segments" if verdict.pruned else ""
    click.echo(f"ledger whole: {verdict.records:,} records in {verdict.segments} "
               f"segment(s){pruned}")
    for pruned_range in verdict.pruned_ranges:
        click.echo(f"  pruned: {pruned_range}")
    if verdict.head is None:
        click.echo("empty: no record yet")
        return
    click.echo(f"head: seq {verdict.head.seq} hash {verdict.head.hash}")
    anchors = site.layout.usage_anchors
    click.echo(f"earlier heads still in the chain: {verdict.anchors}; "
               + (f"this head kept in {anchors}" if kept else f"head already kept in {anchors}"))


@audit.command()
@spec_argument
@since_option
@until_option
@click.option("--format", "form", type=click.Choice(["jsonl", "csv"]), default="jsonl",
              show_default=True, help="jsonl: the records as the ledger holds them (hashes "
              "checkable); csv: one column per field, cells a spreadsheet cannot run.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write FILE (atomically: whole or not at all) instead of stdout.")
def export(spec: Path, since: str | None, until: str | None, form: str,
           out: Path | None) -> None:
    """The records of SPEC's usage ledger that ended in a period (default: all of it)."""
    from kit.engine.docker_api import connect
    from kit.errors import BadInput
    from kit.files import atomic_write
    from kit.site import Site
    from kit.usage.audit import export_site

    chosen = period(since, until, datetime.now(UTC), default_since=None)
    if out is not None and not out.parent.resolve().is_dir():
        raise BadInput(f"--out {out}: folder {out.parent} does not exist",
                       fix="create it, or name a file in an existing folder")
    site = Site.load(spec, check_host=False)
    chunks = export_site(site, connect(site.engine_url), chosen, form)
    if out is not None:
        atomic_write(out, chunks, 0o600)
        click.echo(f"exported to {out}", err=True)
        return
    for chunk in chunks:
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
