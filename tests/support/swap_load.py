"""Two members of a swap group asked for in turn through the waker (kit/dataplane/waker/waker.py, in
process, against stand-ins in sleep mode: tests/support/waker_pair.py): the main model at a
steady rate, its partner now and then (issue 42: one 1-token request every 3 s to the partner
made every switch a wake). Each request is what the door does: ask the waker, then send the
completion to the stand-in once it answered; its latency is both together."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from types import ModuleType

from tests.support.waker_pair import Replicas, chat


@dataclass
class Member:
    name: str
    latencies: list[float] = field(default_factory=list)  # seconds, each request
    failures: list[str] = field(default_factory=list)

    def p50_ms(self) -> float:
        return 1000 * statistics.median(self.latencies)

    def worst_ms(self) -> float:
        return 1000 * max(self.latencies)


@dataclass
class SwapRun:
    main: Member
    partner: Member
    wakes: dict[str, int]  # by member, during the run

    def describe(self) -> str:
        return (f"{self.main.name}: {len(self.main.latencies)} requests, p50 "
                f"{self.main.p50_ms():.0f} ms, worst {self.main.worst_ms():.0f} ms; "
                f"{self.partner.name}: {len(self.partner.latencies)} requests, p50 "
                f"{self.partner.p50_ms():.0f} ms, worst {self.partner.worst_ms():.0f} ms; "
                f"wakes {self.wakes}")


async def _request(w, replicas: Replicas, member: Member) -> None:
    """One request as the door sends it: the waker's answer, then the completion."""
    began = time.monotonic()
    try:
        await w.admit(w.sleepers[member.name], probe=False)
        answer = await asyncio.to_thread(replicas.call, member.name, "POST",
                                         "/v1/chat/completions", chat(member.name))
        if answer.status != 200:
            member.failures.append(f"{answer.status} {answer.body[:200]!r}")
    except Exception as error:  # a Refusal (503 at the door) or a lost call: counted
        member.failures.append(f"{type(error).__name__}: {error}")
    member.latencies.append(time.monotonic() - began)


async def _arrivals(w, replicas: Replicas, member: Member, every_s: float,
                    seconds: float) -> None:
    """A request every `every_s` whatever the ones before (an open load), for `seconds`."""
    tasks = []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        tasks.append(asyncio.ensure_future(_request(w, replicas, member)))
        await asyncio.sleep(every_s)
    await asyncio.gather(*tasks)


async def alternating(waker: ModuleType, config: dict, replicas: Replicas, main: str,
                      partner: str, *, seconds: float, main_every_s: float,
                      partner_every_s: float) -> SwapRun:
    """`main` asked for every `main_every_s`, `partner` every `partner_every_s`, for `seconds`,
    by the waker of `config` (both members awake or asleep as the stand-ins are)."""
    w = waker.Waker(config)
    for sleeper in w.sleepers.values():
        async with w.turn(sleeper):
            await w.sync(sleeper)
    asleep = w.sleepers[partner]
    if asleep.state == "awake":  # the run starts with the main model awake, its partner asleep
        async with w.turn(asleep):
            await w.sleep(asleep, reason="the run starts with it asleep")
    await w.admit(w.sleepers[main], probe=False)
    before = {name: sleeper.wakes for name, sleeper in w.sleepers.items()}
    run = SwapRun(Member(main), Member(partner), {})
    clock = asyncio.ensure_future(w.clock())
    try:
        await asyncio.gather(_arrivals(w, replicas, run.main, main_every_s, seconds),
                             _arrivals(w, replicas, run.partner, partner_every_s, seconds))
    finally:
        clock.cancel()
    run.wakes = {name: sleeper.wakes - before[name] for name, sleeper in w.sleepers.items()}
    return run
