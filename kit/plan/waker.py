"""The waker as planned (docs/sleep.md): kit's own process that wakes a sleeping model for the
front door and puts idle ones to sleep, for the services with `idle_sleep` only.

Where it sits, by need: it listens on its fixed address of the internal metrics network, which no
vLLM replica is on, and answers the front door's address (and its own loopback) only, so a model's
code (assumed hostile) cannot drive any service's sleep through it. It reaches the replicas' private
port on the backend network, as the front door does. It runs kit/dataplane/waker/waker.py with the
vLLM image's python3 (standard library only), like door-figures and the usage ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.spec.model import GPU_SHARE_LIMIT
from kit.spec.replicas import compose_names

if TYPE_CHECKING:
    from kit.plan.observability import MetricsNetwork
    from kit.spec.model import Spec

WAKER_PORT = 9315  # on its metrics address only
SLEEP_JOB = "sleep"  # Prometheus's job name of the waker's figures (observability)
SCRIPT = "waker.py"
SCRIPT_MOUNT = "/opt/kit-waker"  # the site folder waker/ inside its container
# A held request waits at most this long for its model's wake (a swap waits for the other
# model's requests to finish and its sleep first; a first level-1 sleep of a real 8B model took
# 11.9 s), and at most this many are held per service: past either, a JSON 503 with Retry-After.
WAKE_TIMEOUT_S = 120
MAX_HELD = 1024
# The words of the waker's 503 to kit's probe identity for a model asleep
# (kit/dataplane/waker/waker.py says them; the gate reads them): the model fell asleep after the
# gate asked /is_sleeping.
PROBE_ASLEEP = "the probe does not wake it"
RETRY_AFTER_S = 10  # what a 503 of the waker tells the client; a failed wake is not retried sooner
# A swap group's member within its min_awake gives way to a partner's held requests once idle
# this long (nothing let through, none in flight in vLLM): keeping it awake serves nobody, and a
# client's next request a moment after the last one ended does not count as idle.
SWAP_IDLE_GRACE_S = 1.0
# One request to the waker on its loopback, inside its container (the healthcheck, kit status,
# kit sleep / kit wake): prints the status line's code, a line break, then the body; exits 1
# when nothing answers.
_ASK = (
    "import sys, urllib.error, urllib.request\n"
    "try:\n"
    "    answer = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))\n"
    "    code, body = answer.status, answer.read()\n"
    "except urllib.error.HTTPError as error:\n"
    "    code, body = error.code, error.read()\n"
    "sys.stdout.write(str(code) + '\\n' + body.decode('utf-8', 'replace'))\n"
)


def ask_argv(path: str, timeout: float) -> list[str]:
    """The command that asks the waker `GET path` inside its container."""
    return ["python3", "-c", _ASK, f"http://127.0.0.1:{WAKER_PORT}{path}", str(timeout)]


# The healthcheck: the same /health with the socket module alone (urllib's imports take seconds
# on a busy host, and three slow checks in a row would mark the waker unhealthy).
HEALTH_ARGV = [
    "python3", "-c",
    "import socket, sys\n"
    f"s = socket.create_connection(('127.0.0.1', {WAKER_PORT}), 8)\n"
    "s.sendall(b'GET /health HTTP/1.1\\r\\nHost: waker\\r\\nConnection: close\\r\\n\\r\\n')\n"
    "sys.exit(0 if s.recv(64).startswith(b'HTTP/1.1 200 ') else 1)\n",
]


@dataclass(frozen=True)
class SleeperPlan:
    """One service with idle_sleep as the waker drives it."""

    name: str
    replicas: tuple[str, ...]  # compose names: the hosts on the backend network
    level: int
    after_s: int
    swap_group: str | None
    gpus: tuple[int, ...]
    share: float  # gpu_memory_utilization: what it takes of each of its GPUs awake
    min_awake_s: int  # once woken, kept awake against a partner this long while in use

    def to_json(self) -> dict:
        return {"name": self.name, "replicas": list(self.replicas), "level": self.level,
                "after": self.after_s, "group": self.swap_group, "gpus": list(self.gpus),
                "share": self.share, "min_awake": self.min_awake_s}


@dataclass(frozen=True)
class WakerPlan:
    address: str  # its own on the metrics network
    door: str  # the front door's address there: the only peer it answers (and loopback)
    sleepers: tuple[SleeperPlan, ...]

    def names(self) -> list[str]:
        return [sleeper.name for sleeper in self.sleepers]

    def config(self, vllm_port: int) -> str:
        """The waker's whole configuration, one JSON argument of its command."""
        return json.dumps({
            "listen": self.address, "port": WAKER_PORT, "door": self.door,
            "vllm_port": vllm_port, "wake_timeout": WAKE_TIMEOUT_S, "max_held": MAX_HELD,
            "retry_after": RETRY_AFTER_S, "share_limit": GPU_SHARE_LIMIT,
            "idle_grace": SWAP_IDLE_GRACE_S,
            "services": [sleeper.to_json() for sleeper in self.sleepers],
        }, sort_keys=True)


def waker_plan(spec: Spec, metrics: MetricsNetwork) -> WakerPlan | None:
    """The waker of the spec's services with idle_sleep; None when none has it (nothing of it
    is rendered then: a site without idle_sleep pays nothing)."""
    sleepers = tuple(
        SleeperPlan(
            name=service.name,
            replicas=tuple(compose_names(service.name, service.replica_count)),
            level=service.idle_sleep.level,
            after_s=service.idle_sleep.after_seconds,
            swap_group=service.idle_sleep.swap_group,
            gpus=tuple(service.gpus),
            share=service.gpu_memory_utilization,
            min_awake_s=service.idle_sleep.min_awake_seconds,
        )
        for service in spec.services if service.idle_sleep is not None
    )
    if not sleepers:
        return None
    return WakerPlan(address=metrics.waker, door=metrics.door, sleepers=sleepers)
