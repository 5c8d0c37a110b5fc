"""kit probe: run the front-door gate against the running site."""

import json
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.errors import ExitCode
from kit.site import Site
from kit.stack.probe import probe_site


@click.command()
@spec_argument
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--address",
    help="Connect here instead of proxy.bind (TLS and Host still use the domain).",
)
@click.option("--timeout", type=click.FloatRange(min=1), default=30, show_default=True,
              help="Seconds to wait on any one connection.")
@click.pass_context
def probe(
    ctx: click.Context, spec: Path, as_json: bool, address: str | None, timeout: float
) -> None:
    """Prove through nginx that SPEC's site is secured and serves: exit 0 only if all checks pass.

    TLS, redirect, HSTS, auth, every model listed and answering, streams unbuffered and vLLM's
    side doors closed; each replica of a multi-replica service answering on its own; exit 1 when
    a check fails, 2 on bad input. The result is also kept in .kit/last-probe.json.
    """
    site = Site.load(spec, check_host=False)  # the model folders are vLLM's concern here
    result = probe_site(site, address=address, timeout=timeout)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1, ensure_ascii=False))
    else:
        click.echo(result.render())
    if not result.ok:
        ctx.exit(ExitCode.FAILED)
