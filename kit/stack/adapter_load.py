"""One replica's LoRA adapters changed and proven from inside its container: vLLM's runtime
load and unload routes (/v1/load_lora_adapter, /v1/unload_lora_adapter: registered only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING, which kit renders for a service with adapters; the front door
refuses both), and a 1-token completion on each adapter before the replica takes traffic.

Used by `kit adapters add|remove` (kit/stack/adapters.py) and by the rolling update, which
proves a new replica serves every adapter its command declares before nginx sends it traffic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kit.engine.desired import ServiceState
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState
from kit.errors import KitError
from kit.front_door.replica_check import prove_replica, request_in_container, served_adapters
from kit.plan.adapters import command_modules
from kit.spec.vllm_flags import serving_task

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"
# A local adapter loads in well under a second on a real vLLM (its weights are megabytes);
# generous, a slow disk is not a failure.
LOAD_TIMEOUT_S = 120
ALREADY_LOADED = "has already been loaded"  # vLLM's refusal of a second load of one name


@dataclass(frozen=True)
class ReplicaLoad:
    """What one replica did with the adapter: loaded by kit (or already there), gated."""

    host: str
    container: ContainerState
    loaded: bool  # kit's load answered 200: an undo unloads it
    ok: bool
    detail: str
    seconds: float


def serve_declared(engine: Engine, container: ContainerState, service: ServiceState) -> str:
    """Before a replica takes traffic again (a rolling update): every adapter its command
    declares is served (one missing is loaded) and answers a 1-token completion. Returns what
    it proved; KitError when it cannot."""
    declared = command_modules(service.config.command)
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
