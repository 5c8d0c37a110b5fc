"""The containers' logs of a site: one service or all of them, merged line by line."""

import queue
import threading
from collections.abc import Iterator

from kit.docker_api import Engine
from kit.errors import BadInput, KitError
from kit.observe import ContainerState, observe
from kit.site import Site


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


def log_lines(
    engine: Engine, containers: list[ContainerState], *, follow: bool, tail: int | str
) -> Iterator[str]:
    """Every log at once, as lines (prefixed by service when there are several).

    One reader thread per container feeds a queue, so a quiet container never holds back a
    chatty one; a reader's KitError is raised here, in the caller's thread.
    """
    lines: queue.Queue[str | KitError | None] = queue.Queue()  # None: one log ended
    width = max((len(c.service) for c in containers), default=0)

    def pump(container: ContainerState) -> None:
        prefix = f"{container.service:<{width}} | " if len(containers) > 1 else ""
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

    for container in containers:
        threading.Thread(target=pump, args=(container,), daemon=True).start()
    running = len(containers)
    while running:
        line = lines.get()
        if line is None:
            running -= 1
        elif isinstance(line, KitError):
            raise line
        else:
            yield line
