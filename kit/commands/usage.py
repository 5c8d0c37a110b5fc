"""kit usage: who used how much of which model, from the site's usage ledger."""

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from kit.commands.options import spec_argument
from kit.errors import BadInput
from kit.usage.period import Period, period

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kit.usage.totals import Section

DEFAULT_SINCE = "30d"
since_option = click.option(
    "--since", metavar="WHEN",
    help="Start: a date (2026-11-01, UTC), a time (2026-11-01T08:00) or a duration back from "
    "now (30m, 12h, 7d, 2w).")
until_option = click.option(
    "--until", metavar="WHEN",
    help="End (default: now): a date takes that whole day in; a time or a duration as --since.")


Command = TypeVar("Command", bound=Callable)


def query_options(command: Command) -> Command:
    """--since/--until/--by/--csv/--json: `kit usage` and `kit fleet DIR usage` take them."""
    for option in reversed([
        since_option, until_option,
        click.option("--by", default="who", show_default=True, metavar="KEYS",
                     help="Group by any of who, model, day (comma-separated, in that order "
                     "of columns: e.g. who,model)."),
        click.option("--csv", "as_csv", is_flag=True, help="Print CSV."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
    ]):
        command = option(command)
    return command


def query(since: str | None, until: str | None, by: str, as_csv: bool, as_json: bool,
          now: datetime) -> tuple[Period, tuple[str, ...], str]:
    """(period, --by keys, output form: text, csv or json); BadInput on any bad value."""
    from kit.usage.totals import parse_by

    if as_csv and as_json:
        raise BadInput("--csv and --json exclude each other", fix="give one of them")
    keys = parse_by(by)
    return (period(since, until, now, default_since=DEFAULT_SINCE), keys,
            "csv" if as_csv else "json" if as_json else "text")


@click.command()
@spec_argument
@query_options
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.png",
              help="Also draw requests and tokens per day per credential as a PNG "
              "(needs pip install 'kit[plot]').")
def usage(spec: Path, since: str | None, until: str | None, by: str, as_csv: bool,
          as_json: bool, plot: Path | None) -> None:
    """Totals of SPEC's usage ledger over a period (default: the last 30 days): requests, how
    they ended, prompt and completion tokens, by credential (--by who), model and/or day.

    With usage.gpu_hour_cost in the spec, each row also shows its cost and its cost per
    million tokens (docs/usage.md: the rule).
    """
    now = datetime.now(UTC)
    chosen, keys, form = query(since, until, by, as_csv, as_json, now)
    plt = _plot_ready(plot)
    from kit.engine.docker_api import connect
    from kit.site import Site
    from kit.usage import totals

    site = Site.load(spec, check_host=False)
    found = totals.site_usage(site, connect(site.engine_url), chosen, now)
    show_totals(form, [(None, found)], keys)
    if plot is not None:
        from kit.files import atomic_write
        from kit.usage.plot import png

        atomic_write(plot, png(found, plt))
        click.echo(f"plot: {plot}", err=True)


def show_totals(form: str, sections: "Sequence[Section]", keys: tuple[str, ...]) -> None:
    """The totals as text, CSV or JSON, for `kit usage` and `kit fleet DIR usage`."""
    from kit.usage import totals

    click.echo({"text": totals.text, "csv": totals.csv_text,
                "json": totals.json_text}[form](sections, keys).rstrip("\n"))


def _plot_ready(plot: Path | None):
    """pyplot when --plot is asked (BadInput before anything is read: no matplotlib, a name
    that is not .png, a folder that does not exist)."""
    if plot is None:
        return None
    if plot.suffix.lower() != ".png":
        raise BadInput(f"--plot {plot}: the plot is a PNG", fix="name the file FILE.png")
    if not plot.parent.resolve().is_dir():
        raise BadInput(f"--plot {plot}: folder {plot.parent} does not exist",
                       fix="create it, or name a file in an existing folder")
    from kit.usage.plot import pyplot

    return pyplot("kit usage --plot", instead="leave out --plot")
