"""One replica's LoRA adapters changed and proven from inside its container: vLLM's runtime
load and unload routes (/v1/load_lora_adapter, /v1/unload_lora_adapter: registered only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING, which kit renders for a service with adapters; the front door
refuses both), and a 1-token completion on each adapter before the replica takes traffic.

Used by `kit adapters add|remove` (kit/stack/adapters.py) and by the rolling update, which
proves a new replica serves every adapter its command declares before nginx sends it traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kit.converge.reconcile import ReplicaAdapters
from kit.engine.desired import ServiceState
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState, ObservedState
from kit.engine.replica_client import (
    DRAIN_SECONDS,
    Quiet,
    adapter_in_flight,
    request_in_container,
    served_adapters,
    wait_quiet,
)
from kit.errors import KitError
from kit.front_door.replica_check import prove_replica
from kit.plan.adapters import declared_modules
from kit.site import Site
from kit.spec.replicas import compose_names
from kit.spec.vllm_flags import serving_task

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"
# A local adapter loads in well under a second on a real vLLM (its weights are megabytes);
# generous, a slow disk is not a failure.
LOAD_TIMEOUT_S = 120
ALREADY_LOADED = "has already been loaded"  # vLLM's refusal of a second load of one name
ADAPTER_DRAIN_S = DRAIN_SECONDS  # as long as a rolling update waits for a replica's requests


@dataclass(frozen=True)
class ReplicaLoad:
    """What one replica did with the adapter: loaded by kit (or already there), gated."""

    host: str
    container: ContainerState
    loaded: bool  # kit's load answered 200: an undo unloads it
    ok: bool
    detail: str
    seconds: float


def serve_declared(engine: Engine, container: ContainerState, service: ServiceState,
                   config: Path) -> str:
    """Before a replica takes traffic again (a rolling update): every adapter it declares (its
    command's --lora-modules, else those of its --config file, `config` in the site folder) is
    served (one missing is loaded) and answers a 1-token completion. Returns what it proved;
    KitError when it cannot."""
    declared = declared_modules(service.config.command, config.read_text)
    if not declared:
        return ""
    served = served_adapters(engine, container) or []
    task = serving_task(list(service.config.command))
    for name, path in declared.items():
        load = load_and_gate(engine, service.name, container, name, path, task,
                             already=name in served)
        if not load.ok:
            raise KitError(f"{service.name} does not serve its declared adapter {name}: "
                           f"{load.detail}", fix=f"read its log: kit logs {service.name}")
    return f"adapters {', '.join(declared)} answered"


def load_and_gate(engine: Engine, host: str, container: ContainerState, name: str, path: str,
                  task: str, *, already: bool = False) -> ReplicaLoad:
    """Adapter `name` loaded from `path` in this replica (unless it serves it `already`, or
    vLLM answers that it does), then one real answer on it (a 1-token completion, or an
    embedding)."""
    started = time.monotonic()
    if not already:
        status, body = request_in_container(engine, container, LOAD_ROUTE,
                                            {"lora_name": name, "lora_path": path},
                                            LOAD_TIMEOUT_S)
        already = status == 400 and ALREADY_LOADED in body  # not kit's to undo
        if status != 200 and not already:
            # FastAPI's own 404: the route is not registered (vLLM's refusals say `lora`)
            why = (" (its vLLM runs without VLLM_ALLOW_RUNTIME_LORA_UPDATING: started before "
                   "kit rendered it; kit up recreates it)" if status == 404 and '"detail"'
                   in body and "lora" not in body.lower() else "")
            return ReplicaLoad(host, container, False, False,
                               f"load answered {status or 'nothing'}: {body[:300]}{why}",
                               time.monotonic() - started)
    verdict = prove_replica(engine, container, name, task, health=False)  # it just answered
    return ReplicaLoad(host, container, not already, verdict.ok,
                       ("loaded, " if not already else "already loaded, ") + verdict.detail
                       if verdict.ok else f"gate on {name} failed: {verdict.detail}",
                       time.monotonic() - started)


def wait_idle(engine: Engine, replicas: list[tuple[str, ContainerState]], name: str,
              timeout: float = ADAPTER_DRAIN_S) -> Quiet:
    """Wait until no request on adapter `name` runs or waits in any of these replicas
    (vllm:lora_requests_info, kit.engine.replica_client.wait_quiet), at most `timeout`
    seconds."""
    def reading(container: ContainerState) -> Callable[[], bool | None]:
        return lambda: adapter_in_flight(engine, container, name)

    return wait_quiet({host: reading(container) for host, container in replicas}, timeout)


def unload(engine: Engine, container: ContainerState, name: str) -> str:
    """'' once the replica no longer serves `name` (unloaded, or it had not loaded it)."""
    status, body = request_in_container(engine, container, UNLOAD_ROUTE, {"lora_name": name},
                                        LOAD_TIMEOUT_S)
    if status == 200 or (status == 404 and "cannot be found" in body):
        return ""
    return f"unload answered {status or 'nothing'}: {body[:200]}"


def unload_all(engine: Engine, containers: list[ContainerState], name: str) -> list[str]:
    """Unload `name` from each container; the names of those it left."""
    return [container.service for container in containers if not unload(engine, container, name)]


def load_everywhere(engine: Engine, replicas: list[tuple[str, ContainerState]], name: str,
                    path: str, task: str) -> list[ReplicaLoad]:
    """Adapter `name` loaded and gated on every replica at once; on a failure anywhere,
    unloaded again from those kit loaded it on (KitError naming the failures)."""
    with ThreadPoolExecutor(max_workers=max(len(replicas), 1)) as pool:
        loads = list(pool.map(lambda replica: load_and_gate(
            engine, replica[0], replica[1], name, path, task), replicas))
    failed = [load for load in loads if not load.ok]
    if failed:
        undone = unload_all(engine, [load.container for load in loads if load.loaded], name)
        raise KitError(
            f"adapter {name} failed on {', '.join(load.host for load in failed)}: "
            + "; ".join(f"{load.host}: {load.detail}" for load in failed)
            + f"; unloaded again from {', '.join(undone) or 'no replica'}",
            fix="fix the adapter (or the replica: kit logs), or take it out of the spec")
    return loads


def drain_and_unload(engine: Engine, replicas: list[tuple[str, ContainerState]], name: str,
                     timeout: float = ADAPTER_DRAIN_S) -> list[tuple[str, str]]:
    """Once the door no longer routes adapter `name`: wait for the requests on it already
    inside each replica's vLLM (`wait_idle`), then unload it. (replica, what happened) each;
    KitError naming the replicas it is still loaded on (requests still running at `timeout`,
    or an unload refused)."""
    drain = wait_idle(engine, replicas, name, timeout)
    busy = drain.left
    idle = [(host, container) for host, container in replicas if busy.get(host) is not True]
    with ThreadPoolExecutor(max_workers=max(len(idle), 1)) as pool:
        answers = list(pool.map(lambda replica: unload(engine, replica[1], name), idle))
    failures = [f"{host}: {why}" for (host, _), why in zip(idle, answers, strict=True) if why]
    failures += [f"{host}: requests on it still running after {timeout:.0f}s, so it stays "
                 "loaded there until they end" for host, state in busy.items() if state]
    if failures:
        raise KitError(f"adapter {name} is no longer routed, but is still loaded on "
                       + "; ".join(failures),
                       fix="kit status shows it as loaded but not declared there; kit up "
                       "unloads it once no request runs on it")
    return [(host, "unloaded" + (
        f" (its /metrics could not tell whether requests on it still ran after {timeout:.0f}s)"
        if host in busy else f" once the requests on it ended ({drain.busy_s[host]:.1f}s)"
        if host in drain.busy_s else "")) for host, _ in replicas]

def adapter_states(engine: Engine, site: Site, observed: ObservedState) -> list[ReplicaAdapters]:
    """Each running replica of a service with adapters: what it declares (as its next start
    would load it: its command, else its --config file just rendered) and what it serves (its
    own /v1/models, asked at once); one that does not answer is left out (kit status shows it
    as unknown)."""
    wanted = []
    for service in site.spec.services:
        config = site.layout.lora_config(service.name)
        for host in compose_names(service.name, service.replica_count) if service.adapters else ():
            container = observed.running(host)
            if container is None:
                continue
            command = site.desired.service(host).config.command
            declared = declared_modules(command, config.read_text)
            wanted.append((service.name, host, container, declared,
                           serving_task(list(command))))
    with ThreadPoolExecutor(max_workers=max(len(wanted), 1)) as pool:
        served = list(pool.map(lambda want: served_adapters(engine, want[2]), wanted))
    return [ReplicaAdapters(service, host, container, declared, tuple(answer), task)
            for (service, host, container, declared, task), answer in zip(wanted, served,
                                                                          strict=True)
            if answer is not None]
