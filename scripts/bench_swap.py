#!/usr/bin/env python3
"""Swap-group thrash (issue 42, item 10): two services of one swap group on one GPU (0.9 each:
one awake at a time), the main one asked for 10 times a second, its partner once every 3 s with
a 1-token request — before min_awake each partner request was two switches, each a wake, and
the main model's p50 latency went from 12 ms to 4,965 ms on a live site.

No Docker: the waker (kit/dataplane/waker/waker.py, in process, its config as kit plans it) before
two vLLM STAND-INS in sleep mode (tests/standin, not vLLM) as local processes, their sleep and wake
programmed to what a real vLLM 0.20 took for an 8B model at level 1 (docs/sleep.md: a later
sleep 0.4 s, a wake 0.65 s). Each request is what the door does: ask the waker, then send the
completion once it answered; its latency is both.

    python3 scripts/bench_swap.py [--seconds 90] [--min-awake 30] [--partner-every 3]
                                  [--main-every 0.1] [--waker FILE]   # e.g. main's: before/after

Prints one run: each model's requests, p50 and worst latency, and the wakes. Exit 1 when a
request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.spec.model import MIN_AWAKE_DEFAULT_S  # noqa: E402
from tests.support.swap_load import alternating  # noqa: E402
from tests.support.waker_pair import sleepy_replicas, waker_config  # noqa: E402

REAL_TIMES = {"STANDIN_SLEEP_SECONDS": "0.4", "STANDIN_WAKE_SECONDS": "0.65"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--min-awake", type=int, default=MIN_AWAKE_DEFAULT_S,
                        help="idle_sleep.min_awake of both, seconds")
    parser.add_argument("--main-every", type=float, default=0.1)
    parser.add_argument("--partner-every", type=float, default=3)
    parser.add_argument("--waker", type=Path,
                        default=ROOT / "kit" / "dataplane" / "waker" / "waker.py",
                        help="run this waker.py instead (before/after)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("bench_waker", args.waker)
    assert spec is not None and spec.loader is not None
    waker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(waker)
    members = [{"name": name, "after": 3600, "group": "gpu0", "min_awake": args.min_awake}
               for name in ("chat", "coder")]
    with tempfile.TemporaryDirectory() as folder, \
            sleepy_replicas(Path(folder), ["chat", "coder"], **REAL_TIMES) as replicas:
        run = asyncio.run(alternating(
            waker, waker_config(replicas, members, wake_timeout=120), replicas, "chat", "coder",
            seconds=args.seconds, main_every_s=args.main_every,
            partner_every_s=args.partner_every))
    print(f"chat every {args.main_every} s, coder every {args.partner_every} s, "
          f"{args.seconds:.0f} s, min_awake {args.min_awake} s ({args.waker}):")
    print(f"  {run.describe()}")
    failures = run.main.failures + run.partner.failures
    for failure in failures[:5]:
        print(f"  failed: {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
