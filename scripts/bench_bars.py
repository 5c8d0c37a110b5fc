#!/usr/bin/env python3
"""The bars of `kit bench` (issue 11), each on its own throw-away site with the vLLM STAND-IN
(tests/standin, not vLLM) programmed for it, measured by `kit bench` itself:

  fidelity   STANDIN_TTFT_MS / STANDIN_TOKEN_INTERVAL_MS programmed; at 1 and 256 streams the
             reported median TTFT and TPOT are within 3 % (or 2 ms) of the programmed values plus
             the front door's own cost (front door minus direct, --compare-direct)
  capacity   one kit bench process drives 500 streams with that fidelity and no event-loop lag
  boundary   max_num_seqs K = 8, 24, 64 (the rest queue): the default search reports a boundary
             within 10 % of K, in under 10 minutes each

    python3 scripts/bench_bars.py [--only fidelity,capacity,boundary]

Needs a Docker engine (scripts/dockerd.sh start) and builds the test images when needed. For the
fidelity and capacity bars, with 2 CPUs, the stand-in's server runs on one and the load (kit
bench, its direct client, the front door's nginx and verifier) on the other
(tests/support/cpus.py). Prints each bar's figures and verdict; exit status 1 when one is not
met.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.engine.desired import PROJECT_LABEL, SERVICE_LABEL  # noqa: E402
from tests.support.cpus import ContainerSplit  # noqa: E402
from tests.support.docker_engine import BUILD, pick_free_port  # noqa: E402
from tests.support.live_stack import SERVICE, kit, running_site  # noqa: E402

PROXY = {"rate_limit_per_ip": 1000000, "rate_limit_per_credential": 1000000,
         "max_connections_per_ip": 4096}
FIDELITY_REQUESTS = {1: 20}  # else one request per stream (a stream at c=1 takes 3.3 s)


def bench(site, *args: str) -> tuple[dict, float]:
    """`kit bench` on the site; its bench.json and how long it took."""
    out = site.root / f"out-{time.monotonic_ns()}"
    started = time.monotonic()
    result = kit("bench", str(site.spec_path), "--out", str(out), *args, timeout=1200)
    took = time.monotonic() - started
    print(result.stdout.rstrip())
    if result.returncode != 0:
        print(result.stderr.rstrip())
    return json.loads((out / "bench.json").read_text()), took


def front_door(site) -> list:
    """The site's containers other than the stand-in's: nginx and the credential verifier."""
    found = site.client.containers.list(filters={"label": f"{PROJECT_LABEL}={site.name}"})
    return [c for c in found if c.labels.get(SERVICE_LABEL) != SERVICE]


def within(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= max(0.03 * expected, 2.0)


def fidelity_rows(report: dict, ttft: float, tpot: float, label: str) -> bool:
    ok = True
    for step in report["steps"]:
        d = step["direct"]
        for key, programmed in (("median_ttft_ms", ttft), ("median_tpot_ms", tpot)):
            cost = step[key] - d[key]
            good = within(step[key], programmed + cost) and within(d[key], programmed)
            ok &= good and not step["client_overloaded"] and step["failed"] == 0
            print(f"  {label} {step['max_concurrency']:>4} streams {key}: front door "
                  f"{step[key]:.2f}, direct {d[key]:.2f}, programmed {programmed:g}, front door "
                  f"cost {cost:+.2f} ms; client lag p90 {step['client_lag_p90_ms']} ms, failed "
                  f"{step['failed']}: {'met' if good else 'NOT met'}")
    return ok


def fidelity(client, root: Path, levels: tuple[int, ...], ttft: int, interval: int,
             label: str) -> bool:
    env = {"STANDIN_TTFT_MS": str(ttft), "STANDIN_TOKEN_INTERVAL_MS": str(interval)}
    ok = True
    with running_site(root, client, pick_free_port(), pick_free_port(), prefix="bars",
                      proxy=PROXY, env=env, max_num_seqs=1024) as site, \
            ContainerSplit(site.container(SERVICE), front_door(site)):
        for level in levels:
            report, _ = bench(site, "--concurrency", str(level), "--input-tokens", "128",
                              "--output-tokens", "32", "--requests-per-step",
                              str(FIDELITY_REQUESTS.get(level, level)), "--compare-direct",
                              "--slo-ttft-p95-ms", str(ttft * 10),
                              "--slo-tpot-p95-ms", str(interval * 10))
            ok &= fidelity_rows(report, ttft, interval, label)
    return ok


def boundary(client, root: Path, k: int) -> bool:
    # a stream lasts 200 + 32 x 40 ms = 1.48 s, so at 1.1 K streams each request waits ~150 ms
    # for a slot: over the SLO's 100 ms of slack, which is wider than a busy machine's jitter
    env = {"STANDIN_TTFT_MS": "200", "STANDIN_TOKEN_INTERVAL_MS": "40"}
    with running_site(root, client, pick_free_port(), pick_free_port(), prefix="bars",
                      proxy=PROXY, env=env, max_num_seqs=k) as site:
        report, took = bench(site, "--slo-ttft-p95-ms", "300", "--slo-tpot-p95-ms", "80",
                             "--input-tokens", "128", "--output-tokens", "32")
    found = report["max_passing_concurrency"]
    good = found is not None and abs(found - k) <= 0.1 * k and took < 600
    print(f"  boundary K={k}: reported {found} (first failing "
          f"{report['first_failing_concurrency']}), {len(report['steps'])} steps in "
          f"{took / 60:.1f} min: {'met' if good else 'NOT met'}")
    return good


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fidelity,capacity,boundary")
    args = parser.parse_args()
    subprocess.run(["bash", str(BUILD)], check=True, capture_output=True)
    client = docker.from_env()
    chosen = args.only.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="kit-bench-bars-") as tmp:
        root = Path(tmp)
        if "fidelity" in chosen:
            results.append(fidelity(client, root / "f", (1, 256), 100, 100, "fidelity"))
        if "capacity" in chosen:
            results.append(fidelity(client, root / "c", (500,), 100, 100, "capacity"))
        if "boundary" in chosen:
            results += [boundary(client, root / f"k{k}", k) for k in (8, 24, 64)]
    print("all bars met" if all(results) else "a bar was NOT met")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
