"""kit down: stop and remove the stack's containers and networks (volumes only when asked)."""

from pathlib import Path

import click

from kit.apply import Executor
from kit.commands.options import spec_argument
from kit.docker_api import connect
from kit.layout import SiteLayout
from kit.observe import observe
from kit.reconcile import plan_down
from kit.spec import load_spec


@click.command()
@spec_argument
@click.option("--volumes", is_flag=True, help="Also remove the named volumes (the HF cache).")
def down(spec: Path, volumes: bool) -> None:
    """Stop and remove the containers and networks of SPEC's stack (default ./site.yaml)."""
    project = load_spec(spec, check_host=False).site
    layout = SiteLayout(spec.parent)
    engine = connect()
    plan = plan_down(observe(engine, project), volumes)
    Executor(engine, layout.applied, wait=lambda _: None, report=click.echo).run(plan)
    kept = "" if volumes else " (volumes kept; --volumes removes them)"
    click.echo(f"stack {project}: nothing left running{kept}" if plan else
               f"stack {project}: nothing to remove")
