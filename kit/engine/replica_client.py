"""The in-container replica client: the one way kit sends a replica's vLLM a request, from
inside its container through the engine's exec (its port is on a private network; through nginx
a request reaches *some* replica; vLLM's dev routes never pass the front door). curl is in
vLLM's image (its healthcheck uses it); the key vLLM may require (VLLM_API_KEY) is read there.

What is read this way: requests in flight (`in_flight`, `adapter_in_flight`), the adapters a
replica serves, vLLM's `/is_sleeping`, and the wait for a replica's requests to end
(`wait_quiet`). The gate proves a replica with its own proof request through this client
(kit.front_door.replica_check); the converge core loads adapters and puts replicas to sleep
with it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.errors import KitError

if TYPE_CHECKING:  # only types: the plan imports VLLM_PORT from here without the engine's client
    from kit.engine.docker_api import Engine
    from kit.engine.observe import ContainerState

VLLM_PORT = 8000  # where vLLM listens inside its container (the plan renders `--port` from it)
CHECK_TIMEOUT_S = 60  # a loaded vLLM answers one token in well under a second
# $1 URL, $2 JSON body (argv, never shell text), $3 seconds; prints the body, then the status.
CURL = (
    'exec curl -sS -m "$3" -o - -w "\\n%{http_code}" '
    '${VLLM_API_KEY:+-H "Authorization: Bearer $VLLM_API_KEY"} '
    '-H "Content-Type: application/json" ${2:+-d "$2"} "$1"'
)


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
