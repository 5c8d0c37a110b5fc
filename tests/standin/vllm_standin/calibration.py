"""What the stand-in costs, calibrated on a real vLLM 0.20 on one H100 (opt-in, for benchmarks).

`STANDIN_CALIBRATION=h100` sets the defaults of the capacity knobs to the figures that reproduce
what kit's door and batch class did on that card (reference/h100-costs.md); a knob set in the
environment still wins. Off by default: the test suite paces tokens at its own fixed intervals and
its timing assertions are made on a 2-core machine shared by several runs, where a stand-in that
burns most of a core at load would slow every other process of the test.

The API server's CPU (`ApiServers`): vLLM runs `--api-server-count` API-server processes (1 by
default) sharing the port, each a core of its own, one engine behind them all. A process reads
its connections' requests, turns each engine output into a token delta (detokenised, per token,
before anything can merge) and serialises each streamed chunk (pydantic models dumped to JSON,
SSE framing), more when the chunk carries usage (`continuous_usage_stats`). On the H100 at 256
streams the one process was saturated (0.89-0.92 of a core) in every condition, so what it spent
per chunk came off throughput: 10,622 tok/s without usage, 9,259 (x0.872) with usage in every
chunk. The stand-in is one process on a 2-core machine shared with the door and the load client,
so it models each API-server process in VIRTUAL time: a clock of its own that every piece of work
advances by its cost; the work is done (a request handed to the engine, a chunk written) when the
clock has got there. A process busy more than 100 % thus falls behind: its requests reach the
engine late and its chunks leave late, and the tokens a stream gets while its previous chunk
still waits merge into that chunk, as vLLM's output collector merges the deltas of a request its
API server has not sent yet (RequestOutputCollector).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable

CALIBRATION_ENV = "STANDIN_CALIBRATION"

# The H100's figures as the stand-in's knobs (how each was derived: tests/standin/README.md).
PROFILES: dict[str, dict[str, str]] = {
    "h100": {
        # the engine's step: a base, a cost per running sequence, a cost per prompt token it
        # computes (chunked prefill under --max-num-batched-tokens)
        "STANDIN_TOKEN_INTERVAL_MS": "6",
        "STANDIN_TOKEN_INTERVAL_PER_SEQ_MS": "0.02",
        "STANDIN_PREFILL_BUDGET": "1",
        "STANDIN_PREFILL_US_PER_TOKEN": "30",
        # each API-server process's CPU (virtual time, ApiServers): per request read, per
        # streamed chunk, more per chunk carrying usage
        "STANDIN_REQUEST_CPU_US": "1000",
        "STANDIN_CHUNK_CPU_US": "120",
        "STANDIN_USAGE_CHUNK_CPU_US": "17",
        "STANDIN_API_SERVER_MERGE": "0",
    },
}


class CalibrationError(ValueError):
    """STANDIN_CALIBRATION names no profile."""


def setting(name: str) -> str | None:
    """The knob's value: the environment's, else the calibration profile's, else None."""
    if name in os.environ:
        return os.environ[name]
    return profile().get(name)


def setting_float(name: str, default: float) -> float:
    value = setting(name)
    return default if value is None else float(value)


def profile() -> dict[str, str]:
    chosen = os.environ.get(CALIBRATION_ENV, "")
    if not chosen:
        return {}
    if chosen not in PROFILES:
        raise CalibrationError(f"{CALIBRATION_ENV}={chosen!r} is not a calibration the stand-in "
                               f"knows (one of: {', '.join(sorted(PROFILES))})")
    return PROFILES[chosen]




# A process's work whose time has come within this much is done at once (uvloop's timers tick
# in milliseconds): an idle process sends a chunk as the engine makes it.
SLACK_S = 0.001


class ApiProcess:
    """One API-server process: a virtual clock (`free_at`, time.monotonic's) that its work
    advances, and the work waiting for it, done in order when the clock has got there. The
    engine's output goes first: a request read from a connection (`read`) is begun only when
    the process is idle, as vLLM's output handler drains every engine output it has before its
    event loop gets to new requests, so a saturated process lets fewer requests in (their
    time to first token grows) rather than falling ever further behind on its streams."""

    def __init__(self, index: int):
        self.index = index
        self.free_at = 0.0
        self.busy_s = 0.0  # CPU charged so far (standin_api_server_cpu_seconds_total)
        self.connections = 0
        self.merged = 0  # tokens sent in a chunk with others (standin_api_server_merged_tokens)
        self.waiting: deque[tuple[float, Callable[[], None]]] = deque()
        self.reads: deque[tuple[float, Callable[[], None]]] = deque()  # requests not begun
        self.timer: asyncio.TimerHandle | None = None

    def charge(self, cost_s: float) -> float:
        """Advances the clock by `cost_s` of work begun when the process is free; its end."""
        self.free_at = max(time.monotonic(), self.free_at) + cost_s
        self.busy_s += cost_s
        return self.free_at

    def run(self, cost_s: float, action: Callable[[], None]) -> None:
        """`action` once the process has spent `cost_s` after its earlier work: at once when
        it is idle, else when its clock gets there (after the work queued before it)."""
        due = self.charge(cost_s)
        if not self.waiting and due <= time.monotonic() + SLACK_S:
            action()
            return
        self.waiting.append((due, action))
        if self.timer is not None and len(self.waiting) == 1:  # it waited to begin a read
            self.timer.cancel()
            self.timer = None
        if self.timer is None:
            self._arm()

    def read(self, cost_s: float, action: Callable[[], None]) -> None:
        """A request read from a connection: `action` after `cost_s` begun once the process
        has nothing of the engine's left to send (requests in the order they came)."""
        self.reads.append((cost_s, action))
        self._begin_reads()

    def _begin_reads(self) -> None:
        while self.reads and not self.waiting and self.timer is None:
            if self.free_at > time.monotonic() + SLACK_S:  # still busy: back when it is not
                self.timer = asyncio.get_running_loop().call_later(
                    self.free_at - time.monotonic(), self._drain)
                return
            self.run(*self.reads.popleft())

    def _arm(self) -> None:
        delay = self.waiting[0][0] - time.monotonic()
        self.timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._drain)

    def _drain(self) -> None:
        self.timer = None
        horizon = time.monotonic() + SLACK_S
        while self.waiting and self.waiting[0][0] <= horizon:
            self.waiting.popleft()[1]()
        if self.waiting:
            self._arm()
        else:
            self._begin_reads()


class ApiServers:
    """vLLM's `--api-server-count` processes and what each costs: per request read
    (`request_s`), per streamed chunk (`chunk_s`) and more per chunk carrying usage
    (`usage_s`). Inactive (every cost 0, the default) the stand-in serves as it
    always did, nothing delayed."""

    def __init__(self, count: int = 1, *, request_s: float = 0.0, chunk_s: float = 0.0,
                 usage_s: float = 0.0, merge: bool = True):
        self.request_s, self.chunk_s, self.usage_s = request_s, chunk_s, usage_s
        self.merge = merge  # a lagging stream's tokens join its waiting chunk
        self.active = any(cost > 0 for cost in (request_s, chunk_s, usage_s))
        self.processes = [ApiProcess(index) for index in range(count)]

    @classmethod
    def from_environment(cls, count: int) -> ApiServers:
        return cls(count,
                   request_s=setting_float("STANDIN_REQUEST_CPU_US", 0) / 1e6,
                   chunk_s=setting_float("STANDIN_CHUNK_CPU_US", 0) / 1e6,
                   usage_s=setting_float("STANDIN_USAGE_CHUNK_CPU_US", 0) / 1e6,
                   merge=setting("STANDIN_API_SERVER_MERGE") != "0")

    @property
    def spent_s(self) -> float:
        return sum(process.busy_s for process in self.processes)

    def assign(self) -> ApiProcess:
        """The process that accepts a new connection. vLLM's processes share one listening
        socket and each waits in accept (uvicorn's loop): the kernel wakes one that waits, so
        an idle process takes it before a busy one. Modelled as the least loaded: the one
        whose clock is free first, then the one with fewest connections, then the first."""
        now = time.monotonic()
        chosen = min(self.processes,
                     key=lambda p: (max(p.free_at, now), p.connections, p.index))
        chosen.connections += 1
        return chosen

    def cost(self, chunks: int, usage_chunks: int) -> float:
        return chunks * self.chunk_s + usage_chunks * self.usage_s

    def metrics(self) -> str:
        """The STAND-IN'S OWN series (vLLM has none), per process: the CPU charged so far (its
        rate is the process's busy fraction: 1.0 is a saturated core), how far its clock runs
        ahead of now (work waiting: its chunks and requests are late by that much), its open
        connections, the tokens it sent merged with others."""
        now = time.monotonic()
        series = [
            ("standin_api_server_cpu_seconds_total", "counter",
             "CPU time the stand-in charged an API-server process (calibration)",
             lambda p: p.busy_s),
            ("standin_api_server_backlog_seconds", "gauge",
             "How far an API-server process's virtual clock runs ahead of now",
             lambda p: max(0.0, p.free_at - now)),
            ("standin_api_server_connections", "gauge",
             "Open connections an API-server process accepted", lambda p: float(p.connections)),
            ("standin_api_server_merged_tokens_total", "counter",
             "Tokens an API-server process sent in one chunk with others (it lagged)",
             lambda p: float(p.merged)),
        ]
        lines = []
        for name, kind, text, value in series:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{process="{p.index}"}} {value(p)!r}' for p in self.processes]
        return "\n".join(lines) + "\n"
