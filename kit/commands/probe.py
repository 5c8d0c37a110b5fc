"""kit probe: run the front-door gate against the running site."""

import json
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.converge.sleep import asleep_services, failed_wakes
from kit.engine.docker_api import connect
from kit.errors import ExitCode
from kit.front_door.gate import run_probe
from kit.front_door.replica_check import replica_checks
from kit.site import Site


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
    asleep = asleep_services(site, lambda: connect(site.engine_url))  # never woken by a probe
    result = run_probe(site.spec, site.layout, address=address, timeout=timeout, asleep=asleep,
                       replicas=lambda: replica_checks(site, lambda: connect(site.engine_url),
                                                       asleep)
                       + failed_wakes(site, lambda: connect(site.engine_url)))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1, ensure_ascii=False))
    else:
        click.echo(result.render())
    if not result.ok:
        ctx.exit(ExitCode.FAILED)
