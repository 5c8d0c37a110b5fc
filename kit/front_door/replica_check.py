"""One replica proven on its own: /health, then a real answer (1 token, or an embedding), from
inside its container (its port is on a private network; through nginx a request reaches *some*
replica), through the engine's in-container replica client (kit.engine.replica_client) with
the gate's proof request.

Used by the probe, so that every replica of a multi-replica service is shown to answer, and by
the rolling update, which gates each new replica before nginx sends it traffic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.engine.observe import ContainerState
from kit.engine.replica_client import CHECK_TIMEOUT_S, request_in_container
from kit.front_door.client import ms_since
from kit.front_door.gate import (
    ASLEEP_SKIP,
    PROOF_NAMES,
    PROOF_PARTS,
    Check,
    proof_detail,
    proof_request,
)
from kit.spec.replicas import compose_names

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site


@dataclass(frozen=True)
class ReplicaVerdict:
    ok: bool
    detail: str
    latency_ms: float


def prove_replica(
    engine: Engine, container: ContainerState, api_name: str, task: str,
    timeout: float = CHECK_TIMEOUT_S, *, health: bool = True,
) -> ReplicaVerdict:
    """Health (unless the caller just had an answer from it), then one real answer from this
    container's vLLM (a 1-token completion, or an embedding for an embedding model), as its
    own verdict."""
    started = time.perf_counter()
    if not container.running:
        return ReplicaVerdict(False, f"{container.name} is {container.state}", 0.0)
    status, body = (request_in_container(engine, container, "/health", None, timeout)
                    if health else (200, ""))
    if status != 200:
        return ReplicaVerdict(False, f"/health answered {status or 'nothing'}: {body[:300]}",
                              ms_since(started))
    path, request = proof_request(task, api_name)
    status, body = request_in_container(engine, container, path, request, timeout)
    if status != 200:
        return ReplicaVerdict(False, f"{PROOF_NAMES[task]} got {status or 'no answer'}: "
                              f"{body[:300]}", ms_since(started))
    try:
        detail = proof_detail(task, json.loads(body))
    except (ValueError, KeyError, IndexError, TypeError):
        return ReplicaVerdict(False, f"{PROOF_NAMES[task]} answered without {PROOF_PARTS[task]}: "
                              f"{body[:160]}", ms_since(started))
    return ReplicaVerdict(True, f"health 200, {detail}" if health else detail,
                          ms_since(started))


def replica_checks(site: Site, connect: Callable[[], Engine],
                   asleep: frozenset[str] = frozenset()) -> list[Check]:
    """A check per replica of every multi-replica service (none for a single-replica site: the
    front door's own chat and stream checks already reach its only container); a service in
    `asleep` (idle_sleep) is not sent a completion its vLLM would hold until woken."""
    services = [s for s in site.spec.services if s.replica_count > 1]
    if not services:
        return []
    engine = connect()
    observed = site.observe(engine, with_images=False)
    checks = []
    for service in services:
        for host in compose_names(service.name, service.replica_count):
            found = sorted(observed.of(host), key=lambda c: not c.running)
            if not found:
                checks.append(Check(f"replica {host}", False, "no container: run kit up"))
                continue
            if service.name in asleep:
                checks.append(Check(f"replica {host}", True, ASLEEP_SKIP, skipped=True))
                continue
            verdict = prove_replica(engine, found[0], service.api_name, service.task)
            checks.append(Check(f"replica {host}", verdict.ok, verdict.detail, verdict.latency_ms))
    return checks
