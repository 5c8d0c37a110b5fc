"""The stand-in's priority scheduler, as vLLM defines it (`--scheduling-policy priority`, the
stand-in's behaviour, never product code): among waiting requests the lower `priority` goes
first, running requests are not preempted for it, and with `fcfs` the field is ignored. The
scenario is the one measured on vLLM 0.20 (issue 25): --max-num-seqs 4, 12 requests at
priority 10, then 4 at priority 0."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from tests.support.standin_process import STANDIN

sys.path.insert(0, str(STANDIN))
from vllm_standin.engine import Engine, Request  # noqa: E402


def first_tokens(priority_scheduling: bool, kv_tokens: int | None = None,
                 prefill_budget: int | None = None) -> list[str]:
    """The order in which the 16 requests got their first token (b0…b11 at priority 10, sent
    first, then i0…i3 at priority 0); with `prefill_budget`, under chunked prefill (the
    calibrated stand-in's mode)."""
    engine = Engine(model_name="m", interval_s=0.002, max_num_seqs=4, kv_tokens=kv_tokens,
                    block_size=16, cache_info={}, preempt=kv_tokens is not None,
                    priority_scheduling=priority_scheduling, prefill_budget=prefill_budget)
    order: list[str] = []

    def tracked(name: str):
        def on_token(index: int, text: str, last: bool) -> None:
            if index == 0:
                order.append(name)
        return on_token

    async def run() -> None:
        for n in range(12):
            engine.add(Request(8, 6, tracked(f"b{n}"), time.monotonic(), priority=10))
        await asyncio.sleep(0.001)  # the first four batch requests are running
        for n in range(4):
            engine.add(Request(8, 6, tracked(f"i{n}"), time.monotonic(), priority=0))
        while len(order) < 16:
            await asyncio.sleep(0.002)
        engine.stop()

    asyncio.run(run())
    return order


@pytest.mark.parametrize("prefill_budget", [None, 4096])
def test_interactive_requests_overtake_every_waiting_batch_request(
        prefill_budget: int | None) -> None:
    """The four running batch requests finish (no preemption); then the four priority-0
    requests run before the eight batch requests still waiting, which keep their order."""
    order = first_tokens(priority_scheduling=True, prefill_budget=prefill_budget)
    assert order == ([f"b{n}" for n in range(4)] + [f"i{n}" for n in range(4)]
                     + [f"b{n}" for n in range(4, 12)])


def test_first_come_first_served_ignores_priority() -> None:
    order = first_tokens(priority_scheduling=False)
    assert order == [f"b{n}" for n in range(12)] + [f"i{n}" for n in range(4)]


@pytest.mark.parametrize("priority_scheduling", [True, False])
def test_a_full_cache_preempts_the_lowest_priority_request(priority_scheduling: bool) -> None:
    """With a KV cache that cannot hold every running request's growth, vLLM's priority
    scheduler preempts the running request with the highest (priority, arrival) — never an
    interactive one while a batch one runs; fcfs preempts the newest."""
    engine = Engine(model_name="m", interval_s=0.002, max_num_seqs=4, kv_tokens=64,
                    block_size=16, cache_info={}, preempt=True,
                    priority_scheduling=priority_scheduling)
    done: list[str] = []

    def tracked(name: str):
        def on_token(index: int, text: str, last: bool) -> None:
            if last:
                done.append(name)
        return on_token

    async def run() -> None:
        engine.add(Request(14, 20, tracked("interactive-old"), time.monotonic(), priority=0))
        engine.add(Request(14, 20, tracked("batch"), time.monotonic(), priority=1))
        engine.add(Request(14, 20, tracked("interactive-new"), time.monotonic(), priority=0))
        while len(done) < 3:
            await asyncio.sleep(0.002)
        engine.stop()

    asyncio.run(run())
    assert engine.preemptions > 0
    last = "batch" if priority_scheduling else "interactive-new"
    assert done[-1] == last, done
