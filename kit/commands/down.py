"""kit down: stop and remove the stack's containers and networks (volumes only when asked)."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.engine.docker_api import connect
from kit.engine.remote_files import site_volumes
from kit.site import Site
from kit.stack.apply import Executor
from kit.stack.reconcile import RemoveVolume, down_actions
from kit.stack.worker_nodes import WorkerEngines, worker_nodes


@click.command()
@spec_argument
@click.option("--volumes", is_flag=True, help="Also remove the named volumes (the HF cache).")
@wait_lock_option
def down(spec: Path, volumes: bool, wait_lock: float) -> None:
    """Stop and remove the containers and networks of SPEC's stack (default ./site.yaml)."""
    site = Site.load(spec, check_host=False)
    with holding(site.layout.root, "down", wait_lock, (site.engine_url, site.project)):
        _down(site, volumes)


def _down(site: Site, volumes: bool) -> None:
    """The head's stack on the site's engine, then each worker node's on its own."""
    workers = worker_nodes(site)  # a multi-node service's workers, each on its node's engine
    engine = connect(site.engine_url)
    observed = site.observe(engine, with_images=False)
    plan = down_actions(observed, volumes)
    if not volumes:  # a remote site's file volumes are copies of the site folder, not data
        plan += [RemoveVolume(v.name, "kit down: a copy of the site files")
                 for v in site_volumes(site.desired) if v.name in observed.volumes]
    Executor(engine, site.layout.applied, wait=lambda _: None, report=click.echo).run(plan)
    removed = len(plan) + WorkerEngines.connect(site, workers, connect).stop(volumes, click.echo)
    kept = "" if volumes else " (volumes kept; --volumes removes them)"
    nodes = f" and on node(s) {', '.join(w.name for w in workers)}" if workers else ""
    click.echo(f"stack {site.project}: nothing left running{nodes}{kept}" if removed else
               f"stack {site.project}: nothing to remove{nodes}")
