#!/usr/bin/env python3
"""What authentication costs a stream (issue 4): kit's auth against none, in the same nginx.

Brings up its own site like scripts/bench_frontdoor.py (same stack, same client in the stack's
network, same load shapes) and measures, in one run, through nginx with TLS:

  none    the rendered nginx.conf with its `auth_request` lines removed (reloaded), no header
  basic   the rendered nginx.conf, Basic with the render-generated bcrypt (cost 12) password:
          kit verifies it once in a loopback verifier and caches the verdict (docs/auth.md)
  bearer  the rendered nginx.conf, a Bearer key (SHA-256 digest looked up in a map)

over --rounds rounds of the sustained shape, order rotated. Bars, basic and bearer against none:
tokens/s ratio ≥ 0.95, TTFT p50 ratio ≤ 1.10, worst gap ≤ +50 ms (exit status 1 when one is
not met). Then, for contrast, one run each of 200 connections x 1 request right after an nginx
reload:

  none        as above
  basic-cold  as basic, just after a credential change made every cached verdict unreachable
              (what a credential costs once a minute at most)
  naive       `auth_basic` with the htpasswd in `location /v1/` itself: bcrypt cost 12 on every
              request, inside nginx's event loop — what kit's design avoids

    python3 scripts/bench_auth.py [--streams 200] [--tokens 64] [--interval-ms 20] [--rounds 3]
"""

import re
import sys

from bench_frontdoor import (
    NGINX_URL,
    SUSTAINED,
    Bar,
    Column,
    Shape,
    arguments,
    bench_stack,
    machine,
    measure,
    report,
    run_once,
)

from kit.layout import NGINX_MOUNT

AUTH_REQUEST = "            auth_request /_kit/auth;\n"
NAIVE = (f'            auth_basic "naive";\n'
         f"            auth_basic_user_file {NGINX_MOUNT}/auth/htpasswd;\n")
# the /v1/ location's auth lines and handler (who: the credential only when accepted)
V1_AUTH = (AUTH_REQUEST + "            auth_request_set $kit_auth_status $status;"
           "  # who: the credential only when accepted\n            js_content route.request;")
CONTRAST = Shape("contrast", 1.0, 1)
USER = "ops"
LIMITS = (("tokens_per_s", "min_ratio", 0.95), ("ttft_p50_ms", "max_ratio", 1.10),
          ("worst_gap_ms", "max_added", 50))


def bcrypt_cost(htpasswd: str, user: str) -> int:
    return int(re.search(rf"^{user}:\$2[aby]\$(\d+)\$", htpasswd, re.MULTILINE).group(1))


def main() -> None:
    args = arguments(__doc__.splitlines()[0], rounds=3).parse_args()
    bars = [Bar(subject, "none", *limit) for subject in ("basic", "bearer") for limit in LIMITS]
    contrast_bars = [Bar(subject, "none", *limit) for subject in ("basic-cold", "naive")
                     for limit in LIMITS]
    with bench_stack(args, "benchauth") as (site, load):
        cost = bcrypt_cost(site.layout.htpasswd.read_text(), USER)
        print(f"auth: nginx with TLS; Basic user {USER} (bcrypt cost {cost}), a Bearer key; "
              f"{args.rounds} rounds, order rotated; {machine()} at the start")
        basic, bearer = site.basic(USER), f"Bearer {site.add_key('bench')}"
        rendered = site.layout.nginx_conf.read_text()
        unauthenticated = site.nginx_conf_with((AUTH_REQUEST, ""))
        naive = site.nginx_conf_with((V1_AUTH, V1_AUTH.replace(AUTH_REQUEST, NAIVE)))
        results = measure(site, load, args, SUSTAINED, [
            Column("none", NGINX_URL, None, unauthenticated),
            Column("basic", NGINX_URL, basic, rendered),
            Column("bearer", NGINX_URL, bearer, rendered),
        ], args.rounds)

        contrast = {}
        site.load_nginx_conf(unauthenticated)
        site.reload_nginx()  # fresh workers, as the two runs below get
        contrast["none"] = [run_once(site, load, args, CONTRAST, Column("none", NGINX_URL))]
        site.load_nginx_conf(rendered)
        site.add_key("cold")  # a credential change: new epoch, nginx reloaded by kit
        contrast["basic-cold"] = [run_once(site, load, args, CONTRAST,
                                           Column("basic-cold", NGINX_URL, basic))]
        site.load_nginx_conf(naive)
        contrast["naive"] = [run_once(site, load, args, CONTRAST,
                                      Column("naive", NGINX_URL, basic))]
    ok = report(SUSTAINED.describe(args), results, bars)
    report(CONTRAST.describe(args) + ", one run each after a reload (not judged)", contrast,
           contrast_bars)
    print(f"\nbars (basic and bearer vs none): {'all met' if ok else 'NOT all met'}; "
          f"{machine()} at the end")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
