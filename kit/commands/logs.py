"""kit logs: the containers' logs, one service or all of them (prefixed), optionally followed."""

import queue
import threading
from pathlib import Path

import click

from kit.commands.options import spec_argument
from kit.docker_api import Engine, connect
from kit.errors import BadInput, KitError
from kit.observe import ContainerState, observe
from kit.spec import DEFAULT_SPEC, load_spec


@click.command()
@spec_argument
@click.argument("service", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option("-n", "--tail", default="all", metavar="N",
              help="Lines from the end of each log (default: all).")
def logs(spec: Path, service: str | None, follow: bool, tail: str) -> None:
    """Print the logs of SPEC's containers, or of SERVICE only.

    In the site folder `kit logs SERVICE` works too (SPEC defaults to ./site.yaml).
    """
    if service is None and not spec.exists() and DEFAULT_SPEC.exists():
        spec, service = DEFAULT_SPEC, str(spec)
    if tail != "all" and not tail.isdigit():
        raise BadInput(f"--tail {tail!r} is not a number of lines", fix="use e.g. -n 100")
    project = load_spec(spec, check_host=False).site
    engine = connect()
    containers = list(observe(engine, project).containers)
    if service is not None:
        names = sorted({c.service for c in containers})
        containers = [c for c in containers if c.service == service]
        if not containers:
            raise BadInput(
                f"service {service!r} has no container in stack {project}",
                fix=f"pick one of: {', '.join(names)}" if names else "start the stack: kit up",
            )
    _print_logs(engine, containers, follow=follow, tail=int(tail) if tail.isdigit() else "all")


def _print_logs(
    engine: Engine, containers: list[ContainerState], *, follow: bool, tail: int | str
) -> None:
    """Stream every log at once (lines prefixed by service when there are several)."""
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
            click.echo(line)
