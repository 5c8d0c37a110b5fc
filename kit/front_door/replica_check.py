"""One replica proven on its own: /health, then a real answer (1 token, or an embedding), from
inside its container (its port is on a private network; through nginx a request reaches *some*
replica).

Used by the probe, so that every replica of a multi-replica service is shown to answer, and by
the rolling update, which gates each new replica before nginx sends it traffic. curl is in
vLLM's image (its healthcheck uses it); the key vLLM may require (VLLM_API_KEY) is read there.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.engine.observe import ContainerState
from kit.errors import KitError
from kit.front_door.client import ms_since
from kit.front_door.gate import (
    ASLEEP_SKIP,
    PROOF_NAMES,
    PROOF_PARTS,
    Check,
    proof_detail,
    proof_request,
)
from kit.plan.build import VLLM_PORT
from kit.spec.replicas import compose_names

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

CHECK_TIMEOUT_S = 60  # a loaded vLLM answers one token in well under a second
# $1 URL, $2 JSON body (argv, never shell text), $3 seconds; prints the body, then the status.
CURL = (
    'exec curl -sS -m "$3" -o - -w "\\n%{http_code}" '
    '${VLLM_API_KEY:+-H "Authorization: Bearer $VLLM_API_KEY"} '
    '-H "Content-Type: application/json" ${2:+-d "$2"} "$1"'
)


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


def in_flight(engine: Engine, container: ContainerState) -> int | None:
    """vllm:num_requests_running + waiting of this replica; None when it cannot tell (it
    stopped, or runs with --disable-log-stats, which removes every vllm:* metric)."""
    metrics = _metrics(engine, container)
    return None if metrics is None else _requests(metrics)


def _metrics(engine: Engine, container: ContainerState) -> str | None:
    """The replica's own /metrics text; None when it did not answer (or is not running)."""
    if not container.running:
        return None
    status, body = request_in_container(engine, container, "/metrics", None, CHECK_TIMEOUT_S)
    return body if status == 200 else None


def _requests(metrics: str) -> int | None:
    values = [float(line.rpartition(" ")[2]) for line in metrics.splitlines()
              if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))]
    return round(sum(values)) if values else None


# How kit waits for the requests already inside a replica's vLLM before it takes something away
# (the replica itself in a rolling update, an adapter from it in a removal), the door no longer
# sending it new ones: at most DRAIN_SECONDS, polled every DRAIN_POLL_SECONDS, and idle for
# DRAIN_QUIET_SECONDS before it counts (nginx's old workers still pass on requests that arrived
# on connections they accepted before the reload).
DRAIN_SECONDS = 300
DRAIN_POLL_SECONDS = 0.5
DRAIN_QUIET_SECONDS = 2.0


@dataclass(frozen=True)
class Quiet:
    """How a wait for quiet replicas ended."""

    left: dict[str, int | bool | None]  # replica → its last reading, for those not quiet in time
    busy_s: dict[str, float]  # replica → seconds from the start to its last busy reading


def wait_quiet(readings: dict[str, Callable[[], int | bool | None]],
               seconds: float = DRAIN_SECONDS) -> Quiet:
    """Polls each replica's reading (requests in flight: a count or a yes/no, None when it
    cannot tell) until each read 0/False for DRAIN_QUIET_SECONDS, at most `seconds`; a replica
    that cannot tell is waited for until the deadline."""
    started = time.monotonic()
    deadline = started + seconds
    idle_since: dict[str, float] = {}
    busy_s: dict[str, float] = {}
    pending = dict(readings)
    last: dict[str, int | bool | None] = {}
    while pending:
        now = time.monotonic()
        for host, read in list(pending.items()):
            last[host] = read()
            if last[host]:
                busy_s[host] = now - started
            if last[host] is None or last[host]:
                idle_since.pop(host, None)
            elif now - idle_since.setdefault(host, now) >= DRAIN_QUIET_SECONDS:
                del pending[host]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(DRAIN_POLL_SECONDS)
    return Quiet({host: last[host] for host in pending}, busy_s)


LORA_INFO = "vllm:lora_requests_info"  # vLLM's gauge of the adapters requests run or wait on
LORA_INFO_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def adapter_in_flight(engine: Engine, container: ContainerState, name: str) -> bool | None:
    """Whether requests on adapter `name` are running or waiting inside this replica's vLLM;
    None when it cannot tell (no answer, no vllm:* metrics).

    vLLM's gauge vllm:lora_requests_info has labels running_lora_adapters and
    waiting_lora_adapters (the adapters' names, comma-joined) and, as its value, the time it
    was set, each engine step; every label set it ever had stays exported, so the series with
    the latest time is the current state. The engine sets it only while it steps: with no
    request running or waiting at all (vllm:num_requests_running + waiting = 0), none is on
    the adapter, whatever the last series says."""
    metrics = _metrics(engine, container)
    total = None if metrics is None else _requests(metrics)
    if metrics is None or total is None:
        return None
    if total == 0:
        return False
    latest: tuple[float, dict[str, str]] | None = None
    for line in metrics.splitlines():
        if not line.startswith(LORA_INFO + "{"):
            continue
        labels_text, _, value = line[len(LORA_INFO) + 1:].rpartition("} ")
        try:
            stamp = float(value)
        except ValueError:
            continue
        if latest is None or stamp > latest[0]:
            latest = (stamp, dict(LORA_INFO_LABEL.findall(labels_text)))
    if latest is None:
        return None  # requests run, and the gauge is missing: no way to tell which
    return any(name in labels.split(",") for key, labels in latest[1].items()
               if key in ("running_lora_adapters", "waiting_lora_adapters"))


def served_adapters(engine: Engine, container: ContainerState) -> list[str] | None:
    """The LoRA adapters this replica's vLLM serves now: the entries of its own /v1/models with
    a `parent` (vLLM's LoRA model cards); None when it does not answer."""
    if not container.running:
        return None
    status, body = request_in_container(engine, container, "/v1/models", None, CHECK_TIMEOUT_S)
    try:
        cards = json.loads(body)["data"] if status == 200 else None
        return None if cards is None else sorted(card["id"] for card in cards
                                                 if card.get("parent") is not None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


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


def request_in_container(
    engine: Engine, container: ContainerState, path: str, body: dict | None, timeout: float
) -> tuple[int, str]:
    """(HTTP status, body) of one request to the replica's own port; status 0 when none came."""
    url = f"http://127.0.0.1:{VLLM_PORT}{path}"
    payload = json.dumps(body) if body is not None else ""
    try:
        code, output = engine.exec(
            container.id, ["sh", "-c", CURL, "kit-check", url, payload, str(int(timeout))]
        )
    except KitError as error:
        return 0, error.message
    text, _, status = output.rstrip("\n").rpartition("\n")
    if code != 0 or not status.isdigit():
        return 0, output.strip()[-200:]
    return int(status), text.strip()


def sleep_state(engine: Engine, container: ContainerState,
                timeout: float) -> tuple[bool | None, str]:
    """vLLM's /is_sleeping (a dev route of sleep mode, asked inside the container): (asleep,
    "") or (None, why it cannot tell)."""
    status, body = request_in_container(engine, container, "/is_sleeping", None, timeout)
    if status == 404:
        return None, ("its vLLM has no /is_sleeping: it runs without dev mode (started before "
                      "idle_sleep was added)")
    try:
        answer = json.loads(body)["is_sleeping"] if status == 200 else None
    except (ValueError, KeyError, TypeError):
        answer = None
    if not isinstance(answer, bool):
        return None, f"/is_sleeping answered {status or 'nothing'}: {body[:200]}"
    return answer, ""
