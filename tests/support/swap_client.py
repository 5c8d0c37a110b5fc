"""A client that alternates between the models of a swap group (docs/sleep.md), for the e2e
test of the door's half of sleep mode: `streams` threads send short completions for one model
during a phase, all finish, then the next phase asks for the other model. Each stream's first
request of a phase is the one a switch holds at the door while its model wakes. Each stream
keeps one connection alive, opened before the phase starts."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kit.front_door.client import DoorClient, DoorConnection


@dataclass
class Phase:
    model: str
    first: list[float] = field(default_factory=list)  # each stream's first request, seconds
    rest: list[float] = field(default_factory=list)  # every later one
    failures: list[str] = field(default_factory=list)  # status and body of any non-200

    @property
    def requests(self) -> int:
        return len(self.first) + len(self.rest)


def run_phase(client: Callable[[], DoorClient], credentials: str, model: str, streams: int,
              seconds: float) -> Phase:
    phase = Phase(model)
    lock = threading.Lock()
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    start = threading.Barrier(streams)

    payload = json.dumps(body).encode()
    headers = {"Authorization": credentials, "Content-Type": "application/json"}

    def stream() -> None:
        door = client()
        connection = DoorConnection(door.target, door.context)  # kept alive, made before the
        connection.connect()  # phase starts: a switch's figure holds no TLS handshake
        start.wait()
        ends = time.monotonic() + seconds
        first = True
        try:
            while first or time.monotonic() < ends:
                began = time.perf_counter()
                connection.request("POST", "/v1/chat/completions", body=payload,
                                   headers=headers)
                reply = connection.getresponse()
                answer = reply.read()
                took = time.perf_counter() - began
                with lock:
                    (phase.first if first else phase.rest).append(took)
                    if reply.status != 200:
                        phase.failures.append(f"{reply.status} {answer[:200]!r}")
                first = False
        except (OSError, http.client.HTTPException) as error:
            with lock:
                phase.failures.append(f"{type(error).__name__}: {error}")
        finally:
            connection.close()

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return phase


def switch_cost(phase: Phase) -> tuple[float, float]:
    """(median first request, median later request) of a phase, in seconds: what a switch
    added is their difference."""
    return statistics.median(phase.first), statistics.median(phase.rest or phase.first)
