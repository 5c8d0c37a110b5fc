"""Wait until services are healthy, show how it goes, and say why when they do not get there.

vLLM refuses connections while it loads (minutes), so health is the engine's healthcheck. A
failed start shows up long before the timeout: vLLM exits on bad flags or inputs and the restart
policy starts it again, so an exit, a restart or an "unhealthy" verdict ends the wait at once,
with the container's log tail and, when a rule recognises it, the cause and the spec key to fix.
"""

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kit.converge.diagnose import diagnose
from kit.engine.desired import SERVICE_LABEL, DesiredState, ServiceState, project_filter
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState, container_state
from kit.errors import KitError

POLL_SECONDS = 0.5
LOG_TAIL_LINES = 40
HEARTBEAT_SECONDS = 15  # how often a non-terminal display repeats an unchanged line


def wait_timeout(services: tuple[ServiceState, ...]) -> float:
    """By then the engine has ruled on every service: its start_period plus the retries."""
    return max(s.config.healthcheck.deadline for s in services if s.config.healthcheck)


@dataclass
class _Tracked:
    service: ServiceState
    container: ContainerState
    baseline_restarts: int
    healthy_after: float | None = None
    last_line: str = ""


class HealthProgress:
    """One line per service: elapsed, health, last log line; redrawn in place on a terminal."""

    def __init__(self) -> None:
        self._stream = sys.stderr
        self._terminal = self._stream.isatty()
        self._drawn = 0
        self._last: dict[str, tuple[str, float]] = {}

    def show(self, lines: dict[str, str], status: dict[str, str], now: float) -> None:
        if self._terminal:
            if self._drawn:
                self._stream.write(f"\x1b[{self._drawn}F")
            width = shutil.get_terminal_size().columns - 1  # a wrapped line breaks the redraw
            for line in lines.values():
                self._stream.write(f"\x1b[2K{line[:width]}\n")
            self._drawn = len(lines)
        else:
            for name, line in lines.items():
                previous = self._last.get(name)
                if previous is None or previous[0] != status[name] or (
                    now - previous[1] >= HEARTBEAT_SECONDS
                ):
                    self._stream.write(line + "\n")
                    self._last[name] = (status[name], now)
        self._stream.flush()


def wait_healthy(
    engine: Engine,
    desired: DesiredState,
    services: tuple[ServiceState, ...],
    *,
    timeout: float | None = None,
    watch: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Block until every service is healthy; seconds each took. KitError on the first failure
    (`watch`, called every poll, raises one for what the services' health depends on: the
    worker nodes of a multi-node head, kit/nodes/worker_nodes.py)."""
    progress = HealthProgress()
    limit = timeout if timeout is not None else wait_timeout(services)
    start = time.monotonic()
    tracked = []
    for service in services:
        container = _find(engine, desired, service)
        tracked.append(_Tracked(service, container, container.restart_count))
    while True:
        now = time.monotonic() - start
        for item in tracked:
            if item.healthy_after is None:
                _poll(engine, item, now, limit)
        if watch is not None:
            watch()
        lines = {t.service.name: _line(t, now) for t in tracked}
        status = {t.service.name: _status(t) for t in tracked}
        progress.show(lines, status, now)
        if all(t.healthy_after is not None for t in tracked):
            return {t.service.name: t.healthy_after or 0.0 for t in tracked}
        time.sleep(POLL_SECONDS)


def _find(engine: Engine, desired: DesiredState, service: ServiceState) -> ContainerState:
    found = engine.containers([*project_filter(desired.project), f"{SERVICE_LABEL}={service.name}"])
    if not found:
        raise KitError(
            f"service {service.name} has no container to wait for",
            fix="run `kit up` again; if it keeps happening, something removes it (`kit status`)",
        )
    return container_state(found[0])


def stopped(container: ContainerState, baseline_restarts: int) -> str | None:
    """How a container stopped since the wait began (it exited, or its restart policy
    restarted it), or None: the failure a wait must not sit out until its timeout."""
    if container.state in ("exited", "dead"):
        return f"its container exited (code {container.exit_code})"
    if container.restart_count > baseline_restarts or container.state == "restarting":
        return f"its container exited and was restarted ({container.restart_count} restarts)"
    return None


def _poll(engine: Engine, item: _Tracked, now: float, limit: float) -> None:
    attrs = engine.inspect(item.container.id)
    item.container = container_state(attrs)
    item.last_line = _last_line(engine.log_tail(item.container.id, 1))
    container = item.container
    if container.health == "healthy":
        item.healthy_after = now
        return
    failure = stopped(container, item.baseline_restarts) or _not_healthy(container, now, limit)
    if failure:
        raise _failure(engine, item, failure, now)


def _not_healthy(container: ContainerState, now: float, limit: float) -> str | None:
    """Why a running container will not turn healthy in this wait, or None: keep waiting."""
    if container.health == "unhealthy":
        return "its healthcheck failed (unhealthy)"
    if container.health is None:
        return "it has no healthcheck to wait for"
    if now > limit:
        return f"it was not healthy after {limit:.0f}s (override with --timeout)"
    return None


def _failure(engine: Engine, item: _Tracked, failure: str, now: float) -> KitError:
    name = item.container.name
    log = engine.log_tail(item.container.id, LOG_TAIL_LINES)
    message = (
        f"service {item.service.name} did not become healthy after {now:.0f}s: {failure}\n"
        f"--- last {LOG_TAIL_LINES} log lines of {name} ---\n{log.rstrip()}\n---"
    )
    found = diagnose(log)
    if found is None:
        return KitError(message, fix=f"read the whole log: kit logs {item.service.name}")
    return KitError(
        f"{message}\ncause: {found.cause}\n  (from: {found.evidence})\n"
        f"  spec key: {found.spec_key} (service {item.service.name})",
        fix=found.fix,
    )


def _status(item: _Tracked) -> str:
    return item.container.health or item.container.state


def _line(item: _Tracked, now: float) -> str:
    elapsed = item.healthy_after if item.healthy_after is not None else now
    return (
        f"  {item.service.name:<20} {_status(item):<10} {elapsed:6.0f}s  {item.last_line[:100]}"
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
