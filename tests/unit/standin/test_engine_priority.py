"""The stand-in's priority scheduler, as vLLM defines it (`--scheduling-policy priority`, the
stand-in's behaviour, never product code): among waiting requests the lower `priority` goes
first, running requests are not preempted for it, and with `fcfs` the field is ignored. The
scenario is the one measured on vLLM 0.20 (issue 25): --max-num-seqs 4, 12 requests at
priority 10, then 4 at priority 0."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from kit.bench import run as bench_run
from kit.bench.analysis import SloBounds
from kit.bench.run import BenchOptions, run_bench
from kit.site import Site
from tests.support.bench_door import local_door
from tests.support.standin_process import LLAMA_8B, STANDIN, model_dir, serving

sys.path.insert(0, str(STANDIN))
from vllm_standin.engine import Engine, Request  # noqa: E402


def small_engine(priority_scheduling: bool, kv_tokens: int | None = None,
                 prefill_budget: int | None = None) -> Engine:
    """4 slots, a 2 ms step; with `kv_tokens`, a KV cache that small, which preempts; with
    `prefill_budget`, chunked prefill (the calibrated stand-in's mode)."""
    return Engine(model_name="m", interval_s=0.002, max_num_seqs=4, kv_tokens=kv_tokens,
                  block_size=16, cache_info={}, preempt=kv_tokens is not None,
                  priority_scheduling=priority_scheduling, prefill_budget=prefill_budget)


def tracker(events: list[str], *, first: bool, last: bool):
    """A request's token callback factory: `name` on its first token, `name.` on its last."""
    def tracked(name: str):
        def on_token(index: int, text: str, is_last: bool) -> None:
            if first and index == 0:
                events.append(name)
            if last and is_last:
                events.append(name + ".")
        return on_token
    return tracked


def first_tokens(priority_scheduling: bool, kv_tokens: int | None = None,
                 prefill_budget: int | None = None) -> list[str]:
    """The order in which the 16 requests got their first token (b0…b11 at priority 10, sent
    first, then i0…i3 at priority 0); with `prefill_budget`, under chunked prefill."""
    engine = small_engine(priority_scheduling, kv_tokens, prefill_budget)
    order: list[str] = []
    tracked = tracker(order, first=True, last=False)

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
    engine = small_engine(priority_scheduling, kv_tokens=64)
    done: list[str] = []
    tracked = tracker(done, first=False, last=True)

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
    assert done[-1] == last + ".", done


def test_at_one_priority_it_serves_and_preempts_as_first_come_first_served() -> None:
    """Every request at the door's priority 0 (a site without a batch credential): the priority
    scheduler's order, (priority, arrival), is arrival order, so it serves as fcfs does — the
    same first tokens, the same preemptions — and kit can render it from the start."""
    def run(priority_scheduling: bool) -> tuple[list[str], int]:
        engine = small_engine(priority_scheduling, kv_tokens=96)
        order: list[str] = []
        tracked = tracker(order, first=True, last=True)

        async def drive() -> None:
            start = time.monotonic()
            for n in range(10):  # at once, each a microsecond after the one before
                engine.add(Request(14, 12, tracked(f"r{n}"), start + n * 1e-6, priority=0))
            while sum(name.endswith(".") for name in order) < 10:
                await asyncio.sleep(0.002)
            engine.stop()

        asyncio.run(drive())
        return order, engine.preemptions

    priority, fcfs = run(True), run(False)
    assert fcfs[1] > 0  # the cache is small enough to preempt: the case where policies differ
    assert priority == fcfs


@pytest.mark.serial  # a throughput ratio: another test's load would move it
def test_what_the_priority_scheduler_costs_on_the_stand_in(site: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    """The same load (16 streams on 8 slots: a queue for the policy to order, every request at
    priority 0) on the stand-in process with fcfs and with priority, alternated twice. The
    stand-in models the order, not vLLM's CPU: a heap of waiting requests instead of a deque
    (vLLM's PriorityRequestQueue), O(log n) a request beside a step of milliseconds."""
    model = model_dir(tmp_path, "tiny", LLAMA_8B)
    options = BenchOptions(service=None, slo=SloBounds(5000, 1000), input_tokens=32,
                           output_tokens=24, concurrency=(16,), requests_per_step=64, max_minutes=5,
                           compare_direct=False, max_client_lag_ms=200)
    figures: dict[str, list[tuple[float, float]]] = {"fcfs": [], "priority": []}
    for policy in ("fcfs", "priority", "priority", "fcfs"):
        with serving(str(model), "--max-num-seqs", "8", "--scheduling-policy", policy,
                     STANDIN_TTFT_MS="20", STANDIN_TOKEN_INTERVAL_MS="10") as (port, _):
            monkeypatch.setattr(bench_run, "BenchDoor", local_door(port, model))
            [step] = run_bench(Site.load(site / "site.yaml"), options, lambda line: None).steps
        assert step.failed == 0
        figures[policy].append((step.output_throughput, step.median_ttft_ms))
    mean = {policy: [sum(values) / len(values) for values in zip(*runs, strict=True)]
            for policy, runs in figures.items()}
    ratio = mean["priority"][0] / mean["fcfs"][0]
    print(f"priority ÷ fcfs at one priority: tokens/s ×{ratio:.3f} "
          f"({mean['priority'][0]:.0f} vs {mean['fcfs'][0]:.0f}); TTFT p50 "
          f"{mean['priority'][1]:.0f} ms vs {mean['fcfs'][1]:.0f} ms")
    assert 0.9 <= ratio <= 1.1
