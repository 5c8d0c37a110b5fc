#!/usr/bin/env python3
"""kit bench's client against a server that closes idle keep-alive connections, at the size of
issue 30: 256 streams straight at a vLLM STAND-IN (tests/standin, not vLLM) that closes a
connection idle for 5 s, as uvicorn (so vLLM) does by default, with the streams' starts spread
over a 13 s warm-up (130 tokens at 100 ms), so most streams' first counted request goes out on a
connection idle for longer than 5 s. Before issue 30 the client lost 148–170 of 1,280 requests
this way against a real vLLM.

    python3 scripts/bench_stale.py [--streams 256] [--requests 512] [--keep-alive 5]
                                   [--idle-reuse-s inf]   # the resend alone, no idle bound

Prints the failures by cause, the requests the client wrote once more on a fresh connection,
and the chat requests the stand-in received against the client's count (warm-ups + counted): a
request sent twice would make the stand-in's count higher. Exit 1 unless nothing failed and the
counts match. The fast version runs in the unit suite (tests/unit/bench/test_client.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.bench import client as bench_client  # noqa: E402
from kit.bench.analysis import SloBounds, summarize  # noqa: E402
from tests.support.bench_door import stale_connection_run  # noqa: E402
from tests.support.standin_process import LLAMA_8B, model_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--keep-alive", type=float, default=5.0)
    parser.add_argument("--idle-reuse-s", type=float, default=bench_client.IDLE_REUSE_S,
                        help="replace connections idle longer than this (inf: never)")
    args = parser.parse_args()
    bench_client.IDLE_REUSE_S = args.idle_reuse_s
    with tempfile.TemporaryDirectory(prefix="kit-stale-") as tmp:
        model = model_dir(Path(tmp), "tiny", LLAMA_8B)
        record, received = stale_connection_run(model, args.streams, args.requests,
                                                keep_alive_s=args.keep_alive, tokens=130,
                                                interval_ms=100)
    step = summarize(record, SloBounds(1e9, 1e9))
    sent = args.streams + args.requests
    resent = sum(o.resent for o in record.outcomes)
    print(f"{args.streams} streams, starts spread over a 13 s warm-up, server keep-alive "
          f"{args.keep_alive:g} s, client replaces connections idle over {args.idle_reuse_s:g} s")
    print(f"completed {step.completed} of {args.requests}, failed {step.failed}"
          + "".join(f"; {n} × {cause}" for cause, n in step.failures.items()))
    print(f"written again on a fresh connection (never answered): {resent}")
    print(f"chat requests the stand-in received {received}, the client sent {sent}: "
          f"{'the same' if received == sent else 'NOT the same'}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)")
    good = step.failed == 0 and step.completed == args.requests and received == sent
    print("met" if good else "NOT met")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
