"""Prefix routing under a load bound (kit/dataplane/door/balance.js, docs/routing.md), through
the real nginx + njs door before four stand-ins, each on its own loopback address as four
replicas are on the compose network: a conversation keeps its replica as it grows, different
conversations spread, a hot prefix spills past its home before any replica carries more than
(1 + ε) × the mean, and a replica kit up took out of the pool gets nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.converge.rollout import mark
from kit.plan.build import VLLM_PORT
from tests.support import nginx_ns
from tests.support.door_ns import Door
from tests.support.raw_http import request as raw_request
from tests.support.replica_door import HOST, REPLICAS, SERVED, replica_door
from tests.support.standin_calls import call, metric

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

EPSILON = 0.25


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, str, Path]]:
    with replica_door(tmp_path_factory.mktemp("balance"),
                      f"{{affinity: prefix, epsilon: {EPSILON}}}",
                      STANDIN_TOKEN_INTERVAL_MS="10", STANDIN_LOAD_SECONDS="0.1") as running:
        yield running


def conversation(n: int, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You answer briefly. " * 50},
                {"role": "user", "content": f"Question number {n}?"}]
    for turn in range(turns):
        messages += [{"role": "assistant", "content": f"Answer {turn}."},
                     {"role": "user", "content": f"And then {turn}?"}]
    return messages


def ask(door: Door, key: str, messages: list[dict], max_tokens: int = 1) -> None:
    body = json.dumps({"model": SERVED, "max_tokens": max_tokens, "messages": messages}).encode()
    reply = door.exchange(raw_request("POST", "/v1/chat/completions", HOST, [
        ("Content-Type", "application/json"), ("Authorization", f"Bearer {key}")], body))
    assert reply.status == 200, reply.body[:300]


def served(door: Door) -> dict[str, float]:
    """Requests each replica finished so far (its vllm:request_success_total)."""
    with door.inside():
        return {host: metric(call(VLLM_PORT, "GET", "/metrics", host=address).body.decode(),
                             "vllm:request_success_total", 'finished_reason="length"')
                for host, address in REPLICAS.items()}


def counted(door: Door, send) -> dict[str, float]:
    before = served(door)
    send()
    return {host: n - before[host] for host, n in served(door).items()}


def test_a_conversation_keeps_its_replica_as_it_grows_and_conversations_spread(door):
    running, key, _ = door
    homes = set()
    for n in range(12):
        counts = counted(running, lambda n=n: [ask(running, key, conversation(n, turn))
                                               for turn in range(6)])
        (home,) = [host for host, done in counts.items() if done]  # every turn on one replica
        assert counts[home] == 6, counts
        homes.add(home)
    assert len(homes) >= 3, homes  # different conversations, different replicas


def test_a_hot_prefix_spills_before_any_replica_passes_the_bound(door):
    """16 streams of one conversation at once: its home takes what the bound allows, the next
    replicas in its order the rest; sampled in flight, none carries more than
    ceil(16 × 1.25 / 4) = 5."""
    running, key, _ = door
    threads = [threading.Thread(target=ask, args=(running, key, conversation(99, 0), 60))
               for _ in range(16)]
    peaks = dict.fromkeys(REPLICAS, 0.0)
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        with running.inside():
            for host, address in REPLICAS.items():
                text = call(VLLM_PORT, "GET", "/metrics", host=address).body.decode()
                peaks[host] = max(peaks[host], metric(text, "vllm:num_requests_running"))
    for thread in threads:
        thread.join()
    assert max(peaks.values()) <= 5, peaks
    assert sum(1 for peak in peaks.values() if peak) >= 3, peaks
    # every request released its count: alone again, the conversation is back on one replica
    counts = counted(running, lambda: [ask(running, key, conversation(99, t)) for t in range(4)])
    assert sorted(counts.values()) == [0, 0, 0, 4], counts


def test_a_replica_out_of_the_pool_gets_no_conversation(door):
    running, key, nginx_dir = door
    pool = nginx_dir / "replicas" / "llama8b.conf"
    text = pool.read_text()
    conf = nginx_dir / "nginx.conf"
    pool.write_text(mark(text, "llama8b-r2", serving=False))
    running.reload(conf, conf.read_text())
    try:
        counts = counted(running, lambda: [ask(running, key, conversation(n, 0))
                                           for n in range(200, 224)])
        assert counts["llama8b-r2"] == 0, counts
        assert sum(counts.values()) == 24 and sum(1 for c in counts.values() if c) == 3, counts
    finally:
        pool.write_text(text)
        running.reload(conf, conf.read_text())
