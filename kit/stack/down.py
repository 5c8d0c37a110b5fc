"""`kit down`: the site's stack removed from its engine, then each worker node's from its own.

Like `kit up`, one core call: observe → reconcile (`down_actions`) → the Executor, so removal
order and the applied record follow the same rules as every other change to the stack.
"""

from collections.abc import Callable

from kit.converge.apply import Executor
from kit.converge.reconcile import RemoveVolume, down_actions
from kit.engine.docker_api import connect
from kit.engine.remote_files import site_volumes
from kit.nodes.worker_nodes import WorkerEngines, worker_nodes
from kit.site import Site


def down_site(site: Site, volumes: bool, report: Callable[[str], None]) -> str:
    """Remove the stack (its named volumes only with `volumes`), each step told to `report`;
    the one-line outcome."""
    workers = worker_nodes(site)  # a multi-node service's workers, each on its node's engine
    engine = connect(site.engine_url)
    observed = site.observe(engine, with_images=False)
    plan = down_actions(observed, volumes)
    if not volumes:  # a remote site's file volumes are copies of the site folder, not data
        plan += [RemoveVolume(v.name, "kit down: a copy of the site files")
                 for v in site_volumes(site.desired) if v.name in observed.volumes]
    Executor(engine, site.layout.applied, wait=lambda _: None, report=report).run(plan)
    removed = len(plan) + WorkerEngines.connect(site, workers, connect).stop(volumes, report)
    kept = "" if volumes else " (volumes kept; --volumes removes them)"
    nodes = f" and on node(s) {', '.join(w.name for w in workers)}" if workers else ""
    return (f"stack {site.project}: nothing left running{nodes}{kept}" if removed else
            f"stack {site.project}: nothing to remove{nodes}")
