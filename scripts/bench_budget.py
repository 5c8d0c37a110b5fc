#!/usr/bin/env python3
"""How far concurrent streams pass a credential's token budget (issue 42, item 2): 64 streams of
one key with 1,000 tokens a day, each streaming chat completions (40 tokens) one after another
until the door says the budget is spent; a request refused while the key's requests in flight
may spend what is left (429 RateLimitError, Retry-After 1) is sent again 50 ms later.

No Docker: the real nginx + njs (Debian 13's, tests/support/nginx_ns.py) on the base test site
rendered with the usage ledger, the vLLM STAND-IN (tests/standin, not vLLM) as a process at 5 ms
a token, in a network namespace of their own (tests/support/door_ns.py).

    python3 scripts/bench_budget.py [--streams 64] [--budget 1000] [--tokens 40]
                                    [--door-js DIR]   # other door modules: before/after

Prints one run: the requests admitted, the tokens the engine counted for them, the overshoot
(tokens past the budget) against one request's reservation (its body's bytes + max_tokens),
and the refusals sent again. Exit 1 when the overshoot is one reservation or more, or a request
got any other answer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.render.site_files import render_site  # noqa: E402
from kit.site import Site  # noqa: E402
from tests.support import nginx_ns  # noqa: E402
from tests.support.budget_burst import spend_in_a_burst  # noqa: E402
from tests.support.cli import run_kit  # noqa: E402
from tests.support.door_ns import serving_door  # noqa: E402
from tests.support.sites import base_site  # noqa: E402

SERVICE, SERVED, DOMAIN = "llama8b", "llama-3.1-8b", "llm.test.internal"  # the base test site
# the door's own abuse limits out of the way: the budget is what is measured
UNLIMITED = ("read_timeout: 900}", "read_timeout: 900, rate_limit_per_ip: 100000, "
                                   "rate_limit_per_credential: 100000}")


def site_with_a_budget(root: Path, budget: int, door_js: Path | None) -> tuple[Path, str]:
    """The base test site rendered in `root`, a key `burst` with `budget` tokens a day: the
    spec's path and the key."""
    spec = base_site(root) / "site.yaml"
    spec.write_text(spec.read_text().replace(*UNLIMITED))
    render_site(Site.load(spec))
    added = run_kit("keys", "add", spec, "burst", "--offline", "--tokens-per-day", str(budget))
    if added.exit_code != 0:
        sys.exit(added.output)
    for module in sorted(door_js.glob("*.js")) if door_js else []:
        (spec.parent / "nginx" / module.name).write_bytes(module.read_bytes())
    return spec, added.output.split("key burst: ")[1].split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--budget", type=int, default=1000, help="tokens a day of the key")
    parser.add_argument("--tokens", type=int, default=40, help="max_tokens of each request")
    parser.add_argument("--door-js", type=Path,
                        help="serve the door's njs modules of this folder (kit/dataplane/door/ "
                             "of another tree) instead of the rendered ones (before/after)")
    args = parser.parse_args()
    if nginx_ns.available():
        sys.exit(f"cannot run nginx here: {nginx_ns.available()}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        spec, key = site_with_a_budget(root, args.budget, args.door_js)
        (root / "work").mkdir()
        with serving_door(spec.parent / "nginx", root / "work", [SERVICE], root / "models" /
                          "llama-8b", SERVED, DOMAIN, STANDIN_TOKEN_INTERVAL_MS="5",
                          STANDIN_LOAD_SECONDS="0.1") as door:
            burst = spend_in_a_burst(door, DOMAIN, key, SERVED, budget=args.budget,
                                     streams=args.streams, max_tokens=args.tokens)
    print(f"{args.streams} concurrent streams, {args.tokens} tokens each, a budget of "
          f"{args.budget} tokens a day ({args.door_js or 'the rendered door modules'}):")
    print(f"  {burst.describe()}")
    for other in burst.others[:5]:
        print(f"  other answer: {other}")
    sys.exit(0 if burst.overshoot < burst.reservation and not burst.others else 1)


if __name__ == "__main__":
    main()
