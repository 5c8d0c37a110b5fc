#!/usr/bin/env python3
"""Prefix routing under a load bound against least connections (issue 51, docs/routing.md), in
one run: TTFT p50 and tokens/s of each workload through the door with `routing: {affinity:
prefix}` divided by the same through the door with least connections, the load imbalance, the
prefix-cache hit rate and the door's added latency per request.

No Docker: the rendered door (the real nginx + njs, tests/support/door_ns.py) before four vLLM
STAND-INS (tests/standin, not vLLM), one per replica on its own loopback address, each with the
stand-in's prefix cache (vLLM's: blocks of 16 tokens, LRU; STANDIN_PREFIX_CACHE_BLOCKS) and
chunked prefill whose steps last longer by each prompt token computed (so TTFT follows the
uncached prompt tokens). A fresh door and fresh stand-ins for every run: no cache carried over.

    python3 scripts/bench_prefix_routing.py [--users 64] [--turns 8] [--system-words 2000]
                                            [--epsilon 0.25]

Workloads (kit bench's, kit/bench/client.py): multiturn (64 users × 8 turns on a shared
2,000-word system prompt: the stand-in counts a word a token), hot (the same, half the users
starting their conversation alike), random (no shared prefix: each prompt its own). Exit 1 when
a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.bench.client import Endpoint, Load, StepRecord, run_step, words  # noqa: E402
from kit.plan.build import VLLM_PORT  # noqa: E402
from tests.support.door_ns import Door  # noqa: E402
from tests.support.replica_door import HOST, REPLICAS, SERVED, replica_door  # noqa: E402
from tests.support.standin_calls import call, metric  # noqa: E402

STANDIN = {"STANDIN_PREFILL_BUDGET": "1", "STANDIN_PREFILL_US_PER_TOKEN": "300",
           "STANDIN_TOKEN_INTERVAL_MS": "20", "STANDIN_PREFIX_CACHE_BLOCKS": "50000",
           "STANDIN_LOAD_SECONDS": "0.1"}
OUTPUT_TOKENS = 16


def replica_figures(running: Door) -> dict[str, dict[str, float]]:
    with running.inside():
        texts = {host: call(VLLM_PORT, "GET", "/metrics", host=address).body.decode()
                 for host, address in REPLICAS.items()}
    return {host: {name: metric(text, f"vllm:{name}") for name in (
        "num_requests_running", "prefix_cache_queries_total", "prefix_cache_hits_total")}
        for host, text in texts.items()}


def sampled(running: Door, stop: threading.Event, samples: list[list[float]]) -> None:
    while not stop.wait(0.05):
        figures = replica_figures(running)
        samples.append([figures[host]["num_requests_running"] for host in REPLICAS])


def one_run(root: Path, routing: str, endpoint: Endpoint, users: int, requests: int) -> dict:
    with replica_door(root, routing, **STANDIN) as (running, key, _):
        endpoint = replace(endpoint, authorization=f"Bearer {key}", ca_file=str(running.ca_file))
        samples: list[list[float]] = []
        stop = threading.Event()
        watcher = threading.Thread(target=sampled, args=(running, stop, samples))
        watcher.start()
        try:
            with running.inside():
                record = asyncio.run(run_step(endpoint, Load("spread", users), requests))
        finally:
            stop.set()
            watcher.join()
        figures = replica_figures(running)
    return summary(record, samples, figures)


def summary(record: StepRecord, samples: list[list[float]], figures: dict) -> dict:
    failed = [o.cause for o in record.outcomes if not o.ok]
    done = [o for o in record.outcomes if o.ok]
    means = [statistics.mean(column) for column in zip(*samples, strict=True)] if samples \
        else [0.0]
    busy = [max(s) / statistics.mean(s) for s in samples if statistics.mean(s) >= 1]
    return {
        "failed": failed,
        "ttft_p50": statistics.median(o.ttft for o in done),
        "tokens_s": sum(o.output_tokens for o in done) / record.duration_s,
        "imbalance": max(means) / statistics.mean(means) if statistics.mean(means) else 0.0,
        "imbalance_p90": sorted(busy)[int(0.9 * (len(busy) - 1))] if busy else 0.0,
        "hit_rate": {host: f["prefix_cache_hits_total"] / max(1.0, f["prefix_cache_queries_total"])
                     for host, f in figures.items()},
        "latency_mean": statistics.mean(o.latency for o in done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=2000)
    parser.add_argument("--epsilon", type=float, default=0.25)
    a = parser.parse_args()
    base = Endpoint(address="127.0.0.1", port=443, host=HOST, tls=True, ca_file=None,
                    authorization=None, model=SERVED, prompt=words("random", a.system_words + 50),
                    output_tokens=OUTPUT_TOKENS, system_words=a.system_words, turns=a.turns)
    prefix = f"{{affinity: prefix, epsilon: {a.epsilon}}}"
    workloads = {"multiturn": replace(base, workload="multiturn"),
                 "hot": replace(base, workload="multiturn", hot_share=0.5),
                 "random": base}
    requests = a.users * a.turns
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, endpoint) in enumerate(workloads.items()):
            results[name] = {
                routing: one_run(Path(tmp) / f"{n}-{routing}", spec, endpoint, a.users, requests)
                for routing, spec in (("prefix", prefix), ("least", "{affinity: none}"))}
        one = replace(base, prompt="hi")  # one stream, tiny prompts: what the door's choice costs
        door_cost = {routing: one_run(Path(tmp) / f"one-{routing}", spec, one, 1, 200)
                     for routing, spec in (("prefix", prefix), ("least", "{affinity: none}"))}
    print(f"4 replicas, {a.users} users x {a.turns} turns, {a.system_words}-word shared system "
          f"prompt, {OUTPUT_TOKENS} output tokens, epsilon {a.epsilon}")
    print(f"{'workload':<10} {'TTFT p50 ratio':>15} {'tokens/s ratio':>15} {'imbalance':>10} "
          f"{'(p90)':>6} {'hit rate prefix / least':>24}")
    failed = False
    for name, pair in results.items():
        p, least = pair["prefix"], pair["least"]
        failed = failed or bool(p["failed"] or least["failed"])
        hits = (statistics.mean(p["hit_rate"].values()),
                statistics.mean(least["hit_rate"].values()))
        print(f"{name:<10} {p['ttft_p50'] / least['ttft_p50']:>15.3f} "
              f"{p['tokens_s'] / least['tokens_s']:>15.3f} {p['imbalance']:>10.3f} "
              f"{p['imbalance_p90']:>6.2f} {hits[0]:>11.1%} / {hits[1]:.1%}")
        print(f"{'':<10} TTFT p50 {p['ttft_p50'] * 1000:.0f} ms vs {least['ttft_p50'] * 1000:.0f} "
              f"ms; {p['tokens_s']:.0f} vs {least['tokens_s']:.0f} tokens/s")
    added = door_cost["prefix"]["latency_mean"] - door_cost["least"]["latency_mean"]
    print(f"door's added latency per request (prefix - least, one stream, 200 requests): "
          f"{added * 1000:+.2f} ms")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
