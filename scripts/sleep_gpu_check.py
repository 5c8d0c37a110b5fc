#!/usr/bin/env python3
"""Sleep mode on a real GPU (issue 26, docs/sleep.md): given a running site and a service with
idle_sleep, time wake + first token through the front door and read the GPU memory asleep and
awake with nvidia-smi inside the service's containers (through the site's engine).

    python3 scripts/sleep_gpu_check.py SITE.yaml SERVICE --key sk-kit-… [--rounds 5] [--json]

Each round: `kit sleep` (through the waker when it runs), the GPU memory of the service's
replicas asleep, one streamed completion through the door (held while the model wakes: its
first token is "wake + first token"), the memory awake, then one more streamed completion
(the awake TTFT). The goals it is held to (issue 26): wake + first token ≤ 0.75 s (median)
and ≥ 95 % of the service's GPU memory released asleep. The share released is counted against
the memory in use awake on the replicas' GPUs, so another tenant of those GPUs makes it lower,
never higher. Exit 0 when both goals are met, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kit.converge.sleep import change_sleep, sleeping_service  # noqa: E402
from kit.engine.docker_api import Engine, connect  # noqa: E402
from kit.errors import BadInput, KitError  # noqa: E402
from kit.front_door.client import DoorClient, ProbeFailure, target_for  # noqa: E402
from kit.front_door.gate import sse_events, stream_stats  # noqa: E402
from kit.site import Site  # noqa: E402
from kit.spec.replicas import compose_names  # noqa: E402

NVIDIA_SMI = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
              "--format=csv,noheader,nounits"]
WAKE_GOAL_S = 0.75  # wake + first token through the door, 8B model, level 1, one H200
RELEASED_GOAL = 0.95  # of the service's GPU memory, asleep
MIB = 1 << 20


def gpu_memory(nvidia_smi_csv: str) -> dict[int, tuple[int, int]]:
    """nvidia-smi's `index, memory.used, memory.total` (MiB, no header, no units) → index →
    (used bytes, total bytes). A line that is not three numbers is refused, never guessed."""
    found = {}
    for line in nvidia_smi_csv.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3 or not all(field.isdigit() for field in fields):
            raise ValueError(f"nvidia-smi printed {line!r}, not `index, used MiB, total MiB`")
        index, used, total = (int(field) for field in fields)
        found[index] = (used * MIB, total * MIB)
    if not found:
        raise ValueError("nvidia-smi printed no GPU")
    return found


def released_share(awake_bytes: int, asleep_bytes: int) -> float:
    """The share of the memory in use awake that sleeping released."""
    return (awake_bytes - asleep_bytes) / awake_bytes if awake_bytes else 0.0


@dataclass
class Round:
    asleep_bytes: int
    awake_bytes: int
    wake_first_token_s: float
    awake_ttft_s: float

    @property
    def released(self) -> float:
        return released_share(self.awake_bytes, self.asleep_bytes)


def summary(rounds: list[Round]) -> dict:
    """The medians against the goals."""
    wake = statistics.median(r.wake_first_token_s for r in rounds)
    released = statistics.median(r.released for r in rounds)
    return {
        "rounds": len(rounds),
        "wake_first_token_s": {"median": round(wake, 3),
                               "min": round(min(r.wake_first_token_s for r in rounds), 3),
                               "max": round(max(r.wake_first_token_s for r in rounds), 3),
                               "goal": WAKE_GOAL_S, "met": wake <= WAKE_GOAL_S},
        "awake_ttft_s": round(statistics.median(r.awake_ttft_s for r in rounds), 3),
        "gpu_memory_gib": {
            "awake": round(statistics.median(r.awake_bytes for r in rounds) / (1 << 30), 2),
            "asleep": round(statistics.median(r.asleep_bytes for r in rounds) / (1 << 30), 2)},
        "released": {"median": round(released, 4), "goal": RELEASED_GOAL,
                     "met": released >= RELEASED_GOAL},
    }


def replica_memory(engine: Engine, site: Site, service: str) -> int:
    """GPU memory in use on every replica's GPUs (nvidia-smi in each container)."""
    observed = site.observe(engine, with_images=False)
    total = 0
    count = site.spec.service(service).replica_count
    for host in compose_names(service, count):
        running = [c for c in observed.of(host) if c.running]
        if not running:
            raise KitError(f"{host} is not running", fix=f"run kit up {site.spec_path}")
        code, output = engine.exec(running[0].id, NVIDIA_SMI)
        if code != 0:
            raise KitError(f"{host}: nvidia-smi failed: {output.strip()[:200]}",
                           fix="the container needs the NVIDIA runtime's utility capability")
        total += sum(used for used, _ in gpu_memory(output).values())
    return total


def first_token(door: DoorClient, model: str, key: str) -> float:
    """Seconds from sending a streamed completion to its first token."""
    body = {"model": model, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}
    sent = time.perf_counter()
    with door.exchange("POST", "/v1/chat/completions", body=body,
                       credentials=f"Bearer {key}") as response:
        if response.status != 200:
            raise KitError(f"the door answered {response.status}: {response.read()[:300]!r}",
                           fix="check the key and kit status")
        return stream_stats(sent, sse_events(response)).first_s


def measure(site: Site, service: str, key: str, rounds: int) -> list[Round]:
    engine = connect(site.engine_url)
    model = sleeping_service(site, service).api_name
    door = DoorClient(target_for(site.spec, site.layout, None, 120), "")
    results = []
    for _ in range(rounds):
        change_sleep(site, engine, service, "sleep")
        asleep = replica_memory(engine, site, service)
        wake = first_token(door, model, key)
        awake = replica_memory(engine, site, service)
        results.append(Round(asleep, awake, wake, first_token(door, model, key)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("service")
    parser.add_argument("--key", required=True, help="an API key of the site (kit keys add)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        site = Site.load(args.spec)
        result = summary(measure(site, args.service, args.key, max(1, args.rounds)))
    except KitError as error:
        print(f"error: {error.message}\n  fix: {error.fix}", file=sys.stderr)
        return 2 if isinstance(error, BadInput) else 1
    except ProbeFailure as failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        wake, released = result["wake_first_token_s"], result["released"]
        memory = result["gpu_memory_gib"]
        print(f"{args.service}: wake + first token through the door {wake['median']:.3f} s "
              f"(median of {result['rounds']}; {wake['min']:.3f}-{wake['max']:.3f}), goal "
              f"<= {WAKE_GOAL_S} s: {'met' if wake['met'] else 'MISSED'}; awake TTFT "
              f"{result['awake_ttft_s']:.3f} s")
        print(f"{args.service}: GPU memory {memory['awake']} GiB awake, {memory['asleep']} GiB "
              f"asleep: {released['median']:.1%} released, goal >= {RELEASED_GOAL:.0%}: "
              f"{'met' if released['met'] else 'MISSED'}")
    return 0 if result["wake_first_token_s"]["met"] and result["released"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
