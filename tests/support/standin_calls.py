"""Plain HTTP calls to a stand-in on loopback (its dev routes, a held generation), timed: for the
tests of the stand-in's sleep mode (tests/standin/vllm_standin/sleep.py)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Answer:
    status: int
    body: bytes
    done_at: float  # time.monotonic() when the answer was read

    def json(self) -> dict:
        return json.loads(self.body)


def call(port: int, method: str, path: str, body: object = None, timeout: float = 30,
         host: str = "127.0.0.1") -> Answer:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return Answer(response.status, payload, time.monotonic())


@dataclass
class InFlight:
    """A call running in its own thread: `answer` once it came back."""

    thread: threading.Thread
    answers: list[Answer] = field(default_factory=list)

    @property
    def answer(self) -> Answer | None:
        return self.answers[0] if self.answers else None


def in_flight(port: int, method: str, path: str, body: object = None) -> InFlight:
    answers: list[Answer] = []
    thread = threading.Thread(
        daemon=True, target=lambda: answers.append(call(port, method, path, body)))
    thread.start()
    return InFlight(thread, answers)


def metric(text: str, name: str, label: str = "") -> float:
    """The value of the first sample of `name` whose labels contain `label`."""
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {label} not in /metrics")
