"""Execute a plan, action by action, in its order.

No decisions here: `kit.converge.reconcile` made them."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.converge.adapter_load import drain_and_unload, load_everywhere
from kit.converge.reconcile import (
    Action,
    CreateContainer,
    CreateNetwork,
    CreateVolume,
    LoadAdapter,
    RecreateContainer,
    ReloadProxy,
    RemoveContainer,
    RemoveNetwork,
    RemoveVolume,
    RetireReplica,
    RewireProxy,
    RollReplicas,
    SleepMember,
    StartContainer,
    UnloadAdapter,
    WaitHealthy,
)
from kit.converge.rollout import Rollout, drain
from kit.converge.sleep import sleep_container
from kit.engine.desired import ServiceState
from kit.engine.docker_api import Engine
from kit.engine.observe import (
    ContainerState,
    container_state,
    read_proxy_loaded,
    write_proxy_loaded,
)
from kit.errors import KitError
from kit.front_door import reload as front_door
from kit.layout import SiteLayout


@dataclass(frozen=True)
class Executor:
    engine: Engine
    applied: Path  # the state file recording what the proxy has loaded
    wait: Callable[[tuple[ServiceState, ...]], None]
    report: Callable[[str], None]
    layout: SiteLayout | None = None  # the site and project a rolling update rewrites and
    project: str = ""  # reloads (kit up passes them; a plan without RollReplicas needs none)

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
                front_door.record_loaded(self.applied, service, container.id)
            case RewireProxy(service=service, container=container, connect=connect,
                             disconnect=disconnect):
                for joined in connect:
                    self.engine.connect_network(container.id, joined,
                                                [service.name, service.container_name],
                                                service.config.address(joined))
                for left in disconnect:
                    self.engine.disconnect_network(container.id, left)
            case ReloadProxy(service=service, container=container):
                front_door.reload(self.engine, service, container, self.applied)
            case WaitHealthy(services=services):
                self.wait(services)
            case RollReplicas():
                self._roll(action)
            case RetireReplica(container=container):
                self._retire(container)
            case LoadAdapter(adapter=adapter, path=path, replicas=replicas, task=task):
                for host, load in zip((host for host, _ in replicas),
                                      load_everywhere(self.engine, list(replicas), adapter,
                                                      path, task), strict=True):
                    self.report(f"  {host}: {load.detail}")
            case UnloadAdapter(adapter=adapter, replicas=replicas):
                for host, detail in drain_and_unload(self.engine, list(replicas), adapter):
                    self.report(f"  {host}: {detail}")
            case SleepMember(service=service, level=level):
                sleep_container(self.engine, service.name,
                                container_state(self.engine.inspect(service.container_name)),
                                level)

    def _roll(self, action: RollReplicas) -> None:
        if self.layout is None:
            raise KitError("a rolling update needs the site folder", fix="run it through kit up")
        Rollout(self.engine, self.layout, self.project, self._remove, self._create, self.wait,
                self.report).run(action)

    def _retire(self, container: ContainerState) -> None:
        """nginx no longer routes to it (reloaded earlier in the plan): let its streams end."""
        left = drain(self.engine, container)
        self.report(f"  {container.name}: drained" if left == 0 else
                    f"  {container.name}: {left} request(s) still running after the drain "
                    "deadline; stopping it (vLLM's --shutdown-timeout lets them finish)")
        self._remove(container)

    def _remove(self, container: ContainerState) -> None:
        if container.running or container.state == "restarting":
            self.engine.stop(container.id)
        self.engine.remove(container.id)
        loaded = read_proxy_loaded(self.applied)
        if loaded is not None and loaded.container_id == container.id:
            write_proxy_loaded(self.applied, None)

    def _create(self, service: ServiceState) -> str:
        container_id = self.engine.create_container(
            service.container_name,
            service.config,
            service.labels,
            aliases=[service.name, service.container_name],
        )
        self.engine.start(container_id)
        front_door.record_loaded(self.applied, service, container_id)
        return container_id

