"""vLLM's sleep mode as the stand-in imitates it (NOT vLLM; vLLM 0.33's dev routes, and what a
real vLLM 0.20 did on an H200, issue 26).

Only with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1` (without the env vLLM does not
register the routes: 404; without the flag /sleep and /wake_up fail with vLLM's error, 500):
- `POST /sleep?level=1|2` answers 200 with an empty body once the engine sleeps (after
  `STANDIN_SLEEP_SECONDS`); `POST /wake_up` answers 200 empty once awake (after
  `STANDIN_WAKE_SECONDS`); `GET /is_sleeping` → `{"is_sleeping": bool}`. A sleep while asleep
  and a wake while awake are accepted and change nothing; concurrent calls run one at a time.
- While asleep /health and /v1/models answer 200 as awake; a generation request is HELD (not
  refused) and admitted, in arrival order, the moment a wake completes.
- A wake fails while the file named by `STANDIN_WAKE_FAIL_FILE` exists: 500 with FastAPI's
  plain `Internal Server Error`, a traceback in the log, and the engine stays asleep.
- Level 2 discards the weights: after its wake, vLLM serves garbage until the weights are
  reloaded (`POST /collective_rpc {"method": "reload_weights"}`); the stand-in counts the
  reloads and says in /standin/sleep whether the weights are valid.
- `vllm:engine_sleep_state` in /metrics as vLLM 0.20 reported it. The GPU memory figure is the
  STAND-IN'S OWN (`standin_gpu_memory_used_bytes` in /metrics and `gpu_memory_used_bytes` in
  `GET /standin/sleep`, neither a vLLM route nor metric): weights + KV cache + CUDA graphs +
  non-torch memory awake; CUDA graphs + non-torch memory + the CUDA context asleep (about the
  2.5 GiB the real level-1 sleep left of 129.6 GiB).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import logs

if TYPE_CHECKING:
    from .server import Connection, HttpRequest

Handler = Callable[["Connection", "HttpRequest"], None]
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
NOT_ENABLED = ("AssertionError: Sleep mode is not enabled. Please start the engine with "
               "--enable-sleep-mode.")
WAKE_FAILURE = ("RuntimeError: CUDA error: out of memory (the stand-in was told to fail the wake: "
                "STANDIN_WAKE_FAIL_FILE exists)")


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


class SleepMode:
    """One engine's sleep state, its held requests and its dev routes."""

    def __init__(self, *, enabled: bool, awake_bytes: int, asleep_bytes: int, model_name: str):
        self.enabled = enabled
        self.awake_bytes = awake_bytes
        self.asleep_bytes = asleep_bytes
        self.model_name = model_name
        self.sleep_s = _seconds("STANDIN_SLEEP_SECONDS", 0.4)
        self.wake_s = _seconds("STANDIN_WAKE_SECONDS", 0.65)
        fail_file = os.environ.get("STANDIN_WAKE_FAIL_FILE")
        self.fail_file = Path(fail_file) if fail_file else None
        self.level = 0  # 0: awake
        self.weights_valid = True
        self.sleeps = self.wakes = self.failed_wakes = self.reloads = 0
        self.held: list[Callable[[], None]] = []
        self._turn: asyncio.Lock | None = None  # one sleep or wake at a time

    @property
    def asleep(self) -> bool:
        return self.level > 0

    def routes(self) -> dict[str, tuple[set[str], Handler]]:
        """vLLM's dev routes this imitation serves (registered with VLLM_SERVER_DEV_MODE=1)."""
        return {
            "/sleep": ({"POST"}, self.sleep),
            "/wake_up": ({"POST"}, self.wake_up),
            "/is_sleeping": ({"GET"}, self.is_sleeping),
            "/collective_rpc": ({"POST"}, self.collective_rpc),
            "/reset_prefix_cache": ({"POST"}, self.reset_prefix_cache),
            "/standin/sleep": ({"GET"}, self.state),  # the stand-in's own, not vLLM's
        }

    def admit(self, start: Callable[[], None]) -> None:
        """Start a generation now, or hold it until a wake completes (as vLLM does)."""
        if self.asleep:
            self.held.append(start)
        else:
            start()

    # --- routes ----------------------------------------------------------------------------

    def sleep(self, conn: Connection, request: HttpRequest) -> None:
        query = dict(part.partition("=")[::2] for part in request.target.partition("?")[2]
                     .split("&") if part)
        level = query.get("level", "1")
        if level not in ("1", "2"):
            conn.send(request, 500, b"Internal Server Error", "text/plain; charset=utf-8")
            logs.raw(logs.API, f"ValueError: Invalid sleep level: {level}", sys.stderr)
            return
        asyncio.ensure_future(self._run(conn, request, self._sleep, int(level)))

    def wake_up(self, conn: Connection, request: HttpRequest) -> None:
        asyncio.ensure_future(self._run(conn, request, self._wake, 0))

    def is_sleeping(self, conn: Connection, request: HttpRequest) -> None:
        conn.send(request, 200, json.dumps({"is_sleeping": self.asleep}).encode())

    def collective_rpc(self, conn: Connection, request: HttpRequest) -> None:
        try:
            method = json.loads(request.body or b"{}").get("method")
        except (ValueError, AttributeError):
            method = None
        if method != "reload_weights":
            body = {"error": f"the stand-in imitates only reload_weights, not {method!r}"}
            conn.send(request, 400, json.dumps(body).encode())
            return
        self.reloads += 1
        self.weights_valid = not self.asleep
        conn.send(request, 200, json.dumps({"results": [None]}).encode())

    def reset_prefix_cache(self, conn: Connection, request: HttpRequest) -> None:
        conn.send(request, 200, b"", content_type=None)

    def state(self, conn: Connection, request: HttpRequest) -> None:
        body = {"is_sleeping": self.asleep, "level": self.level, "sleeps": self.sleeps,
                "wakes": self.wakes, "failed_wakes": self.failed_wakes, "held": len(self.held),
                "weights_valid": self.weights_valid, "reloads": self.reloads,
                "gpu_memory_used_bytes": self.gpu_bytes()}
        conn.send(request, 200, json.dumps(body).encode())

    # --- the engine's side -----------------------------------------------------------------

    async def _run(self, conn: Connection, request: HttpRequest,
                   change: Callable[[int], Awaitable[str | None]], level: int) -> None:
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            failure = await change(level)
        if failure:
            logs.raw(logs.API, "Traceback (most recent call last):\n" + failure, sys.stderr)
            conn.send(request, 500, b"Internal Server Error", "text/plain; charset=utf-8")
        else:
            conn.send(request, 200, b"", content_type=None)

    async def _sleep(self, level: int) -> str | None:
        if not self.enabled:
            return NOT_ENABLED
        if self.level >= level:
            return None
        await asyncio.sleep(self.sleep_s)
        self.level = level
        self.sleeps += 1
        if level == 2:
            self.weights_valid = False
        logs.line(logs.ENGINE, "INFO", "gpu_worker.py:130",
                  f"Sleep mode freed {(self.awake_bytes - self.asleep_bytes) / (1 << 30):.2f} "
                  f"GiB memory, {self.asleep_bytes / (1 << 30):.2f} GiB memory is still in use.")
        return None

    async def _wake(self, _: int) -> str | None:
        if not self.enabled:
            return NOT_ENABLED
        if not self.asleep:
            return None
        started = time.monotonic()
        await asyncio.sleep(self.wake_s)
        if self.fail_file is not None and self.fail_file.exists():
            self.failed_wakes += 1
            return WAKE_FAILURE
        self.level = 0
        self.wakes += 1
        logs.line(logs.ENGINE, "INFO", "core.py:520",
                  f"Woke up the engine in {time.monotonic() - started:.2f} seconds")
        held, self.held = self.held, []
        for start in held:
            start()
        return None

    def gpu_bytes(self) -> int:
        return self.asleep_bytes if self.asleep else self.awake_bytes

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.model_name}"'
        state = SLEEP_STATES[self.level]
        lines = [
            "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is "
            "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level "
            "1; discard_all = 1 means sleep level 2.",
            "# TYPE vllm:engine_sleep_state gauge",
            *(f'vllm:engine_sleep_state{{{labels},sleep_state="{name}"}} '
              f"{1.0 if (name == state) else 0.0}" for name in SLEEP_STATES),
            "# HELP standin_gpu_memory_used_bytes The STAND-IN's simulated GPU memory in use "
            "(not a vLLM metric).",
            "# TYPE standin_gpu_memory_used_bytes gauge",
            f"standin_gpu_memory_used_bytes{{{labels}}} {float(self.gpu_bytes())}",
        ]
        return "\n".join(lines) + "\n"
