"""kit logs: the containers' logs, one service or all of them (prefixed), optionally followed."""

from pathlib import Path
from typing import Literal

import click

from kit.commands.options import spec_argument
from kit.errors import BadInput
from kit.site import Site
from kit.spec.model import DEFAULT_SPEC
from kit.views.logs import site_log_lines


@click.command()
@spec_argument
@click.argument("service", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option("-n", "--tail", default="all", metavar="N",
              help="Lines from the end of each log (default: all).")
def logs(spec: Path, service: str | None, follow: bool, tail: str) -> None:
    """Print the logs of SPEC's containers, or of SERVICE only (a multi-node service's worker
    nodes included, as SERVICE@NODE).

    In the site folder `kit logs SERVICE` works too (SPEC defaults to ./site.yaml).
    """
    if service is None and not spec.exists() and DEFAULT_SPEC.exists():
        spec, service = DEFAULT_SPEC, str(spec)
    if tail != "all" and not tail.isdigit():
        raise BadInput(f"--tail {tail!r} is not a number of lines", fix="use e.g. -n 100")
    site = Site.load(spec, check_host=False)
    lines: int | Literal["all"] = int(tail) if tail.isdigit() else "all"
    for line in site_log_lines(site, service, follow=follow, tail=lines):
        click.echo(line)
