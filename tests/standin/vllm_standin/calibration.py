"""What the stand-in costs, calibrated on a real vLLM 0.20 on one H100 (opt-in, for benchmarks).

`STANDIN_CALIBRATION=h100` sets the defaults of the capacity knobs to the figures that reproduce
what kit's door and batch class did on that card (reference/h100-costs.md); a knob set in the
environment still wins. Off by default: the test suite paces tokens at its own fixed intervals and
its timing assertions are made on a 2-core machine shared by several runs, where a stand-in that
burns most of a core at load would slow every other process of the test.

The API server's CPU (`ApiServerCost`): vLLM serialises every streamed chunk in ONE API-server
process (pydantic models dumped to JSON, SSE framing), and more when a chunk carries usage
(`continuous_usage_stats`). On the H100 at 256 streams that process was saturated (0.89-0.92 of a
core) in every condition, so whatever it spends per chunk comes off throughput: 10,622 tok/s
without usage, 9,259 (x0.872) with usage in every chunk. The stand-in spends real CPU time, in its
one process and event loop (which also runs its engine steps and reads requests), so the cost
competes with everything else on the loop and on the machine as vLLM's does.
"""

from __future__ import annotations

import os
import time

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
        # the API server's CPU per streamed chunk, and more per chunk that carries usage
        "STANDIN_CHUNK_CPU_US": "75",
        "STANDIN_USAGE_CHUNK_CPU_US": "12",
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


class ApiServerCost:
    """CPU time spent per streamed chunk (`chunk_s`) and more per chunk carrying usage
    (`usage_s`): burnt on the calling thread, measured in its own CPU time (a busy machine
    stretches it in wall time, as it stretches a real process's work)."""

    def __init__(self, chunk_s: float = 0.0, usage_s: float = 0.0):
        self.chunk_s, self.usage_s = chunk_s, usage_s
        self.active = chunk_s > 0 or usage_s > 0
        self.spent_s = 0.0  # charged so far (/metrics: standin_api_server_cpu_seconds_total)

    @classmethod
    def from_environment(cls) -> ApiServerCost:
        return cls(setting_float("STANDIN_CHUNK_CPU_US", 0) / 1e6,
                   setting_float("STANDIN_USAGE_CHUNK_CPU_US", 0) / 1e6)

    def charge(self, chunks: int, usage_chunks: int) -> None:
        cost = chunks * self.chunk_s + usage_chunks * self.usage_s
        self.spent_s += cost
        end = time.thread_time() + cost
        while time.thread_time() < end:
            pass

    def metrics(self) -> str:
        """The STAND-IN'S OWN counter (vLLM has none): the CPU time charged so far."""
        name = "standin_api_server_cpu_seconds_total"
        return (f"# HELP {name} CPU time the stand-in charged for streamed chunks (calibration)\n"
                f"# TYPE {name} counter\n{name} {self.spent_s!r}\n")
