"""The stand-in's timing under load: the event loop it serves on and where a programmed TTFT
counts from (tests/standin/vllm_standin: main.event_loop_factory, engine.Engine)."""

from __future__ import annotations

import asyncio
import sys
import time

import uvloop

from tests.support.standin_process import STANDIN

sys.path.insert(0, str(STANDIN))
from vllm_standin import main  # noqa: E402
from vllm_standin.engine import Engine, Request  # noqa: E402


def test_the_standin_serves_on_uvloop_when_installed_else_on_asyncio(monkeypatch):
    assert main.event_loop_factory() is uvloop.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert main.event_loop_factory() is None


def test_a_programmed_ttft_counts_from_the_requests_arrival():
    """A request read 30 ms before the engine got it still has its first token 50 ms after it
    was read: time spent before admission is not added to the programmed TTFT."""
    engine = Engine(model_name="m", interval_s=0.01, max_num_seqs=4, kv_tokens=None,
                    block_size=16, cache_info={}, ttft_s=0.05)
    firsts: list[float] = []

    def on_token(index: int, text: str, last: bool) -> None:
        if index == 0:
            firsts.append(time.monotonic())

    async def run() -> float:
        arrival = time.monotonic() - 0.03
        engine.add(Request(8, 2, on_token, arrival))
        while len(firsts) < 1:
            await asyncio.sleep(0.001)
        engine.stop()
        return firsts[0] - arrival

    ttft = asyncio.run(run())
    assert 0.05 <= ttft < 0.065, ttft
