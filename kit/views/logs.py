"""The containers' logs of a site: one service or all of them (a multi-node service's worker
nodes included, each on its own engine), merged line by line."""

import queue
import threading
from collections.abc import Iterator
from typing import Literal

from kit.engine.docker_api import Engine, connect
from kit.engine.observe import ContainerState, observe
from kit.errors import BadInput, KitError
from kit.nodes.worker_nodes import WorkerEngines, worker_nodes
from kit.site import Site


def site_log_lines(site: Site, service: str | None, *, follow: bool,
                   tail: int | Literal["all"]) -> Iterator[str]:
    """`kit logs`: the lines of the site's containers, or of `service`'s, worker nodes' too."""
    workers = worker_nodes(site)  # a multi-node service's workers: their logs on their engines
    engine = connect(site.engine_url)
    sources = [(engine, c, c.service) for c in containers_of(site, engine, service)]
    sources += [(node_engine, c, f"{c.service}@{worker.name}")
                for worker, node_engine in WorkerEngines.connect(site, workers, connect).nodes
                for c in observe(node_engine, worker.project).containers
                if service in (None, c.service)]
    return log_lines(sources, follow=follow, tail=tail)


def containers_of(site: Site, engine: Engine, service: str | None) -> list[ContainerState]:
    """The site's containers, or those of `service` (BadInput naming the choices if none)."""
    containers = list(observe(engine, site.project).containers)
    if service is None:
        return containers
    chosen = [c for c in containers if c.service == service]
    if not chosen:
        names = sorted({c.service for c in containers})
        raise BadInput(
            f"service {service!r} has no container in stack {site.project}",
            fix=f"pick one of: {', '.join(names)}" if names else "start the stack: kit up",
        )
    return chosen


Source = tuple[Engine, ContainerState, str]  # a container, its engine, its name in the prefix


def log_lines(sources: list[Source], *, follow: bool, tail: int | Literal["all"]) -> Iterator[str]:
    """Every log at once, as lines (prefixed by service when there are several; a worker
    node's container, on its own engine, as service@node).

    One reader thread per container feeds a queue, so a quiet container never holds back a
    chatty one; a reader's KitError is raised here, in the caller's thread.
    """
    lines: queue.Queue[str | KitError | None] = queue.Queue()  # None: one log ended
    width = max((len(name) for _, _, name in sources), default=0)

    def pump(engine: Engine, container: ContainerState, name: str) -> None:
        prefix = f"{name:<{width}} | " if len(sources) > 1 else ""
        pending = b""
        try:
            for chunk in engine.log_stream(container.id, follow=follow, tail=tail):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    lines.put(prefix + line.decode(errors="replace"))
            if pending:
                lines.put(prefix + pending.decode(errors="replace"))
        except KitError as error:
            lines.put(error)
        finally:
            lines.put(None)

    for source in sources:
        threading.Thread(target=pump, args=source, daemon=True).start()
    running = len(sources)
    while running:
        line = lines.get()
        if line is None:
            running -= 1
        elif isinstance(line, KitError):
            raise line
        else:
            yield line
