#!/usr/bin/env python3
"""A soak across several verdict expiries (issue 16): Basic users vs Bearer keys vs none.

Brings up its own site like scripts/bench_auth.py (the stand-in behind the rendered nginx, the
load client in the stack's network) with the spec's DEFAULT limits and --users Basic users, and
runs three loads at once, for --duration seconds, in the same nginx and its same workers:

  basic   --basic-streams connections over the --users users (connection i: user i mod n),
          each user's verdict expiring every 60 s (the default proxy.password_recheck_s)
          while its streams run
  bearer  --bearer-streams connections with one key
  none    --none-streams connections to a copy of the TLS server on port 8443 with its
          `auth_request` lines removed (added to the rendered nginx.conf for this run only)

Each connection sends streamed completions back to back until the duration has passed (bounded by
--requests per connection too). Prints, per load: requests, failures by status, worst and p99
gap between two chunks of a stream, TTFT p50; then the verifier's bcrypt checks per user (one
per expiry is the design). Exit status 1 when a request failed, a user was checked more than once
per expiry, or Basic's worst gap is more than 50 ms above Bearer's.

    python3 scripts/bench_soak.py [--duration 190] [--users 20] [--basic-streams 64] ...
"""

import time
from concurrent.futures import ThreadPoolExecutor

from bench_frontdoor import NGINX_URL, arguments, bench_stack, machine

from kit.front_door.client import basic_header
from kit.spec.model import Proxy
from tests.support.live_stack import DOMAIN

VERDICT_TTL_S = Proxy().password_recheck_s  # the default spec's, which this soak runs
GAP_TOLERANCE_MS = 50
TLS_SERVER = "    server {\n        listen 443 ssl default_server;\n"
AFTER_TLS_SERVER = "\n    map $kit_credential_digest $kit_no_credential {"
UNAUTHENTICATED_PORT = 8443
AUTH_REQUEST = "            auth_request /_kit/auth;\n"


def with_unauthenticated_copy(conf: str) -> str:
    """The nginx.conf plus a copy of its TLS server on another port, without authentication."""
    start, end = conf.index(TLS_SERVER), conf.index(AFTER_TLS_SERVER)
    copy = (conf[start:end]
            .replace("listen 443 ssl default_server;", f"listen {UNAUTHENTICATED_PORT} ssl;")
            .replace(AUTH_REQUEST, ""))
    return conf[:end] + "\n" + copy + conf[end:]


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], rounds=1)
    parser.add_argument("--duration", type=float, default=190, help="seconds of load")
    parser.add_argument("--users", type=int, default=20, help="distinct Basic users")
    parser.add_argument("--basic-streams", type=int, default=64)
    parser.add_argument("--bearer-streams", type=int, default=32)
    parser.add_argument("--none-streams", type=int, default=32)
    parser.add_argument("--requests", type=int, default=100000,
                        help="bound on the requests of one connection")
    parser.set_defaults(tokens=32)
    args = parser.parse_args()
    users = tuple(f"user{n:02d}" for n in range(args.users))
    with bench_stack(args, "benchsoak", proxy={}, users=users) as (site, load):
        site.load_nginx_conf(with_unauthenticated_copy(site.layout.nginx_conf.read_text()))
        key = site.add_key("soak")
        print(f"soak: {args.duration:.0f} s, {args.tokens} tokens a request, stand-in at "
              f"{args.interval_ms} ms/token, default limits; {machine()} at the start")
        time.sleep(1.1)  # the verifier's log is read from here on (1 s granularity)
        since = time.time()
        loads = {
            "basic": (NGINX_URL, [basic_header(u, site.passwords[u]) for u in users],
                      args.basic_streams),
            "bearer": (NGINX_URL, f"Bearer {key}", args.bearer_streams),
            "none": (f"https://nginx:{UNAUTHENTICATED_PORT}", None, args.none_streams),
        }
        with ThreadPoolExecutor(len(loads)) as pool:
            running = {
                name: pool.submit(load.run, url, streams=streams, tokens=args.tokens,
                                  host=DOMAIN, auth=auth, requests=args.requests,
                                  duration=args.duration, timeout=args.duration + args.timeout)
                for name, (url, auth, streams) in loads.items()
            }
            figures = {name: future.result() for name, future in running.items()}
        time.sleep(1.1)
        checks = {user: site.password_checks(since, user) for user in users}
    ok = report(args, figures, checks)
    print(f"\n{'all met' if ok else 'NOT all met'}; {machine()} at the end")
    raise SystemExit(0 if ok else 1)


def report(args, figures: dict[str, dict], checks: dict[str, int]) -> bool:
    """Print the table; whether every bar is met."""
    print(f"{'load':8} {'streams':>7} {'requests':>8} {'ok':>7}  {'worst gap':>9} "
          f"{'gap p99':>7} {'TTFT p50':>8}  failures by status")
    for name, run in figures.items():
        failures = ", ".join(f"{why}: {n}" for why, n in run["failures"].items()) or "none"
        print(f"{name:8} {getattr(args, name + '_streams'):>7} {run['requests']:>8} "
              f"{run['ok']:>7}  {run['worst_gap_ms']:>7} ms {run['gap_p99_ms']:>4} ms "
              f"{run['ttft_p50_ms']:>5} ms  {failures}")
    expiries = int(args.duration // VERDICT_TTL_S)
    counts = sorted(set(checks.values()))
    print(f"bcrypt checks per Basic user over {args.duration:.0f} s ({expiries} expiries of "
          f"the {VERDICT_TTL_S} s verdict after the first check): {counts}")
    failed = sum(run["failed"] for run in figures.values())
    gap_ok = (figures["basic"]["worst_gap_ms"]
              <= figures["bearer"]["worst_gap_ms"] + GAP_TOLERANCE_MS)
    return failed == 0 and gap_ok and max(counts) <= expiries + 1


if __name__ == "__main__":
    main()
