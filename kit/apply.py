"""Execute a plan, action by action, in its order. No decisions here: `kit.reconcile` made them."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.docker_api import Engine
from kit.errors import KitError
from kit.observe import ContainerState, ProxyLoaded, read_proxy_loaded, write_proxy_loaded
from kit.plan import NGINX_TEST
from kit.reconcile import (
    Action,
    CreateContainer,
    CreateNetwork,
    CreateVolume,
    RecreateContainer,
    ReloadProxy,
    RemoveContainer,
    RemoveNetwork,
    RemoveVolume,
    StartContainer,
    WaitHealthy,
)
from kit.stack import ServiceState

RELOAD_SIGNAL = "SIGHUP"  # nginx re-reads its config and replaces its workers gracefully
WORKER_PROCESS = "nginx: worker process"  # how a serving nginx worker shows in the process list
RELOAD_CONFIRM_SECONDS = 10
RELOAD_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Executor:
    engine: Engine
    applied: Path  # the state file recording what the proxy has loaded
    wait: Callable[[tuple[ServiceState, ...]], None]
    report: Callable[[str], None]

    def run(self, plan: list[Action]) -> None:
        for action in plan:
            self.report(str(action))
            self.execute(action)

    def execute(self, action: Action) -> None:
        match action:
            case RemoveContainer(container=container):
                self._remove(container)
            case RemoveNetwork(name=name):
                self.engine.remove_network(name)
            case CreateNetwork(network=network):
                self.engine.create_network(network)
            case CreateVolume(volume=volume):
                self.engine.create_volume(volume)
            case RemoveVolume(name=name):
                self.engine.remove_volume(name)
            case CreateContainer(service=service):
                self._create(service)
            case RecreateContainer(service=service, old=old):
                self._remove(old)
                self._create(service)
            case StartContainer(service=service, container=container):
                self.engine.start(container.id)
                self._loaded(service, container.id)
            case ReloadProxy(service=service, container=container):
                self._reload(service, container)
            case WaitHealthy(services=services):
                self.wait(services)

    def _remove(self, container: ContainerState) -> None:
        if container.running or container.state == "restarting":
            self.engine.stop(container.id)
        self.engine.remove(container.id)
        loaded = read_proxy_loaded(self.applied)
        if loaded is not None and loaded.container_id == container.id:
            write_proxy_loaded(self.applied, None)

    def _create(self, service: ServiceState) -> None:
        container_id = self.engine.create_container(
            service.container_name,
            service.config,
            service.labels,
            aliases=[service.name, service.container_name],
        )
        self.engine.start(container_id)
        self._loaded(service, container_id)

    def _loaded(self, service: ServiceState, container_id: str) -> None:
        """A reloadable service read its mounted files when it started: record which."""
        if service.reloadable and service.site_files_digest is not None:
            write_proxy_loaded(self.applied, ProxyLoaded(container_id, service.site_files_digest))

    def _reload(self, service: ServiceState, container: ContainerState) -> None:
        """`nginx -t` of the mounted config first; SIGHUP only if it passes.

        nginx applies a SIGHUP asynchronously and, when it cannot (a listen socket it cannot
        bind), logs [emerg] and keeps the old config; so the reload counts only once new worker
        processes run, and an [emerg] line after the signal is reported as the failure it is.
        """
        code, output = self.engine.exec(container.id, NGINX_TEST)
        if code != 0:
            raise KitError(
                f"{container.name} rejected the new config; it keeps serving the old one:\n"
                f"{output.rstrip()}",
                fix="fix the spec value the error points at, then `kit up` again",
            )
        before = self._workers(container.id)
        signalled = time.time()
        self.engine.signal(container.id, RELOAD_SIGNAL)
        deadline = time.monotonic() + RELOAD_CONFIRM_SECONDS
        while not (now := self._workers(container.id)) or now & before:  # old ones stop accepting
            failed = [
                line for line in self.engine.log_since(container.id, signalled).splitlines()
                if "[emerg]" in line
            ]
            if failed or time.monotonic() > deadline:
                raise KitError(
                    f"{container.name} did not apply the new config and keeps the old one: "
                    + ("\n" + "\n".join(failed) if failed else
                       f"no new worker processes {RELOAD_CONFIRM_SECONDS}s after {RELOAD_SIGNAL}"),
                    fix=f"restart it to load the config afresh: docker restart {container.name}",
                )
            time.sleep(RELOAD_POLL_SECONDS)
        self._loaded(service, container.id)

    def _workers(self, container_id: str) -> set[int]:
        return {pid for pid, command in self.engine.processes(container_id)
                if command == WORKER_PROCESS}
