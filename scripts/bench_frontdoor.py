#!/usr/bin/env python3
"""What the front door costs a stream (issue 3): through nginx (TLS + Bearer auth) vs direct.

Brings up its own site in a temp folder (kit render + kit up on the local test images: the vLLM
STAND-IN pacing tokens at a fixed interval behind the rendered nginx), runs the same client
(scripts/loadgen.py, in a container on the stack's backend network) against nginx and straight
against the stand-in, alternately, in one run, prints the medians over the rounds and the
comparison with the bars, and tears everything down. Needs a Docker engine
(scripts/dockerd.sh start); builds the test images when needed.

    python3 scripts/bench_frontdoor.py [--streams 200] [--tokens 64] [--interval-ms 20]
                                       [--rounds N] [--h2 | --ledger | --policy | --mix]
                                       [--calibrated] [--prompt-words N] [--mix-seconds S]

Two load shapes, both with --streams connections opened before the clock starts:
  sustained  connection i sends its first request at i/N of one stream's duration, then two
             more back to back: the streams overlap as a busy server sees them (judged);
  burst      every connection sends its request in the same millisecond (shown, not judged).
Bars (sustained): tokens/s nginx/direct ≥ 0.97; TTFT p50 added ≤ 10 ms; worst gap added
≤ 50 ms. Exit status 1 when one is not met or a stream failed.

--h2: HTTP/2 against HTTP/1.1 through the same door (issue 29), alternately in one run, both
shapes: the SAME client (loadgen.py) speaks HTTP/1.1 with a connection a stream, or HTTP/2 with
ONE connection carrying every stream (--streams of them at the sustained load's peak). The door
is the no-Docker one of --ledger below (the same nginx binary + njs as the test image: Debian
13's 1.26.3 + njs 0.8.9, the site's rendered nginx.conf unmodified, its
http2_max_concurrent_streams = max_connections_per_ip, here 4096, and its verifier checking the
Basic passwords); slot i sends Basic (user ops, bcrypt in the verifier, the verdict cached by
the door) when i is even, the Bearer key when odd: both kinds on the one h2 connection.
Bars (sustained): tokens/s h2/h1.1 ≥ 0.99; TTFT p50 added ≤ 1 ms. Exit status 1 when one is
not met or a request failed.

--ledger: the usage ledger on vs off (issue 24), the same nginx.conf rendered with and without
`usage`, loaded alternately into one nginx (a reload, then a warm-up run) in one run, the
sustained shape. No Docker: the real nginx + njs (Debian 13's, tests/support/nginx_ns.py) and
the stand-in as a process, in a network namespace of their own (tests/support/door_ns.py), the
load client (loadgen.py) in that namespace. Bars: tokens/s on/off ≥ 0.99; TTFT p50 added
≤ 1 ms; worst gap added ≤ 5 ms.

--policy: per-credential policy on vs off (issue 25), the door of --ledger (the ledger on in
both: budgets count its tokens) with nginx/auth/door-policy.json holding 1,000 keys' budgets
(tokens a day and a month, requests a minute; the bench key's among them, set too high to
refuse) vs no policy, loaded alternately (a reload, then a warm-up run) in one run, the
sustained shape. Bars: tokens/s on/off ≥ 0.99; TTFT p50 added ≤ 1 ms.

--calibrated (with --ledger, --h2, --policy, --mix): the stand-in with the costs a real vLLM
0.20 showed on an H100 (STANDIN_CALIBRATION=h100, tests/standin/README.md: the API server's CPU
per streamed chunk and more per chunk carrying usage, a step that grows with what runs) and
max(256, --streams) slots. --ledger then also runs the ledger on with the bench key under a token
budget it never reaches (`budget`: the door asks usage on every chunk for a budgeted credential,
as it did for every credential before issue 43) and the ledger off with the client asking usage
in every chunk (`usage`, the H100's diagnostic: what per-chunk usage costs the engine without
the door). --api-servers N: the stand-in runs vLLM's `--api-server-count N` (N API-server
processes, each a core of its own in the stand-in's virtual time; default 1, as on the H100);
the tables then add the busiest process's busy fraction. --prompt-words N lengthens each
prompt by N words (the H100 run's had ~109 tokens).

--mix: `kit bench --mix` (kit/bench/mix.py) through the no-Docker door with a batch key: 4
interactive streams (~490-token prompts x 32 tokens) beside a batch flood at twice the service's
slots (~955-token prompts x 128 tokens), the H100 run's shapes; prints interactive TTFT p50/p95
idle and beside batch, batch's share of what interactive leaves, the H100's figures, and issue
43's goals (p95 <= x2 of idle, share >= 50 %); --mix-seconds each phase, --rounds (default 1).

Rounds: 3 by default; 11 for --ledger and --policy, whose TTFT bar (+1 ms) is within one
round's spread (a configuration's TTFT p50 varies by 1-4 ms round to round on a quiet machine):
their verdict compares the medians of 11 rounds each (docs/benchmarks.md).

CPUs, --h2, --ledger and --policy (tests/support/cpus.py DoorSplit, printed at the start):
nginx (the door's and its verifier's masters and workers) alone on one CPU, the client and the
stand-in on the other, as a real server has remote clients and an engine on cores of its own.
The tables add each run's CPU time of nginx's workers and of the client.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.bench.analysis import percentile  # noqa: E402
from kit.bench.client import Endpoint  # noqa: E402
from kit.bench.mix import BATCH_KEY_ENV, MixOptions, mix_report, run_mix  # noqa: E402
from kit.bench.run import prompt_text  # noqa: E402
from kit.credentials.policy import door_policy  # noqa: E402
from kit.plan.build import VLLM_PORT, build_plan  # noqa: E402
from kit.plan.host import load_spec  # noqa: E402
from kit.render.site_files import render_site, render_template, template_context  # noqa: E402
from kit.site import Site  # noqa: E402
from kit.spec.replicas import replica_host  # noqa: E402
from tests.support import nginx_ns  # noqa: E402
from tests.support.cli import run_kit  # noqa: E402
from tests.support.cpus import DoorSplit  # noqa: E402
from tests.support.docker_engine import BUILD, pick_free_port  # noqa: E402
from tests.support.door_ns import Door, serving_door  # noqa: E402
from tests.support.live_stack import (  # noqa: E402
    DOMAIN,
    SERVICE,
    LiveSite,
    LoadClient,
    cpu_seconds,
    running_site,
)
from tests.support.raw_http import request as raw_request  # noqa: E402
from tests.support.sites import base_site  # noqa: E402

# Rounds of --ledger and --policy by default: enough that the medians resolve their 1-ms bar.
FINE_ROUNDS = 11
NGINX_URL = "https://nginx:443"  # nginx's name on the backend network; the domain goes in SNI
UNLIMITED = {"rate_limit_per_ip": 100000, "rate_limit_per_credential": 100000}

# Rows of the table: loadgen's (or run_once's) field and its label.
METRICS = (
    ("tokens_per_s", "tokens/s"),
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("worst_gap_ms", "worst gap between chunks (ms)"),
    ("gap_p99_ms", "gap p99 (ms)"),
    ("connect_p50_ms", "connect p50, TCP+TLS (ms)"),
    ("nginx_cpu_s", "nginx CPU (s)"),
    ("client_cpu_s", "client CPU (s)"),  # --h2, --ledger: loadgen's own
    # --calibrated: the busiest API-server process's busy fraction (its virtual CPU / the run)
    ("api_busy", "API server busy, max process"),
    ("failed", "failed requests"),
)


@dataclass(frozen=True)
class Shape:
    """How the requests start (see the module's docstring)."""

    name: str
    ramp_durations: float  # the start of the connections spread over this many stream durations
    requests: int  # per connection, back to back

    def options(self, args: argparse.Namespace) -> dict:
        duration = args.tokens * args.interval_ms / 1000
        return {"ramp": round(self.ramp_durations * duration, 3), "requests": self.requests}

    def describe(self, args: argparse.Namespace) -> str:
        options = self.options(args)
        pace = ("the stand-in calibrated on an H100" if getattr(args, "calibrated", False)
                else f"stand-in at {args.interval_ms} ms/token")
        words = getattr(args, "prompt_words", 0)  # the no-Docker door's options
        prompt = f" (prompts +{words} words)" if words else ""
        return (f"{self.name}: {args.streams} connections x {options['requests']} streamed "
                f"completions x {args.tokens} tokens{prompt}, {pace}, starts spread over "
                f"{options['ramp']} s")


SUSTAINED = Shape("sustained", 1.0, 3)
BURST = Shape("burst", 0.0, 1)


@dataclass(frozen=True)
class Column:
    """One column of the table: where the client goes, with what, and under which nginx.conf."""

    label: str
    url: str
    auth: str | None = None
    conf: str | None = None  # nginx.conf text to load first; None: whatever is loaded
    spread: tuple[str, ...] = ()  # more hosts on the URL's port (connection i: the i mod n-th)

    @property
    def host(self) -> str | None:
        return DOMAIN if self.url.startswith("https:") else None


@dataclass(frozen=True)
class Bar:
    """`subject` against `baseline` on `metric`: its ratio at least / at most `limit`
    (kind "min_ratio" / "max_ratio"), or its increase at most `limit` ms ("max_added")."""

    subject: str
    baseline: str
    metric: str
    kind: str
    limit: float

    def value(self, medians: dict[str, dict[str, float]]) -> float:
        subject, baseline = medians[self.subject][self.metric], medians[self.baseline][self.metric]
        return subject - baseline if self.kind == "max_added" else subject / baseline

    def met(self, medians: dict[str, dict[str, float]]) -> bool:
        value = self.value(medians)
        return value >= self.limit if self.kind == "min_ratio" else value <= self.limit

    def describe(self, medians: dict[str, dict[str, float]]) -> str:
        value = self.value(medians)
        figure, bar = {
            "min_ratio": (f"x{value:.3f}", f">= x{self.limit:g}"),
            "max_ratio": (f"x{value:.3f}", f"<= x{self.limit:g}"),
            "max_added": (f"{value:+.1f} ms", f"<= +{self.limit:g} ms"),
        }[self.kind]
        verdict = "met" if self.met(medians) else "NOT met"
        return (f"  {dict(METRICS)[self.metric]}, {self.subject} vs {self.baseline}: {figure} "
                f"(bar {bar}) {verdict}")


def arguments(description: str, rounds: int | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--interval-ms", type=int, default=20, help="the stand-in's token pace")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--timeout", type=float, default=300, help="per load run (seconds)")
    return parser


def machine() -> str:
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load} (1/5/15 min)"


@contextmanager
def bench_stack(args: argparse.Namespace, prefix: str, *, proxy: dict | None = None,
                users: tuple[str, ...] = ("ops",),
                replicas: int = 1) -> Iterator[tuple[LiveSite, LoadClient]]:
    """A site with limits out of the way of the load (or these `proxy` settings), and the load
    client in its network; the service in `replicas` replicas (one GPU each)."""
    built = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"{BUILD} failed (a Docker engine? scripts/dockerd.sh start):\n{built.stderr}")
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as folder, running_site(
        Path(folder), client, pick_free_port(), pick_free_port(), prefix=prefix, users=users,
        proxy=UNLIMITED if proxy is None else proxy,
        env={"STANDIN_TOKEN_INTERVAL_MS": str(args.interval_ms)},
        max_num_seqs=max(256, args.streams),
        overrides={SERVICE: {"gpus": list(range(replicas)), "tensor_parallel": 1}},
    ) as site:
        load = LoadClient(site)
        try:
            yield site, load
        finally:
            load.remove()


def measure(site: LiveSite, load: LoadClient, args: argparse.Namespace, shape: Shape,
            targets: list[Column], rounds: int) -> dict[str, list[dict]]:
    """`rounds` rounds over the targets, the order rotating every round; a target is warmed up
    (one run not counted) the first time and whenever its nginx.conf had to be loaded again:
    new workers start with no upstream keep-alive connections and no TLS session cache."""
    results: dict[str, list[dict]] = {target.label: [] for target in targets}
    warm: set[str] = set()
    for number in range(rounds):
        shift = number % len(targets)
        for target in targets[shift:] + targets[:shift]:
            if target.conf is not None and target.conf != site.layout.nginx_conf.read_text():
                site.load_nginx_conf(target.conf)
                warm.clear()
            if target.label not in warm:
                run_once(site, load, args, shape, target)
                warm.add(target.label)
            results[target.label].append(run_once(site, load, args, shape, target))
    return results


def run_once(site: LiveSite, load: LoadClient, args: argparse.Namespace, shape: Shape,
             target: Column) -> dict:
    nginx = site.nginx
    before = cpu_seconds(nginx)
    figures = load.run(target.url, host=target.host, auth=target.auth, streams=args.streams,
                       tokens=args.tokens, timeout=args.timeout, spread=target.spread,
                       **shape.options(args))
    figures["nginx_cpu_s"] = round(cpu_seconds(nginx) - before, 2)
    return figures


def report(title: str, results: dict[str, list[dict]], bars: list[Bar],
           judged: int | None = None) -> bool:
    """Print the per-round figures, the medians and the bars; True when no request failed and
    the first `judged` bars (default: all) are met."""
    labels = list(results)
    metrics = [(key, name) for key, name in METRICS if key in results[labels[0]][0]]
    table = {label: {key: statistics.median(r[key] for r in runs) for key, _ in metrics}
             for label, runs in results.items()}
    print(f"\n{title}")
    for label in labels:
        rounds = " | ".join(
            f"{r['tokens_per_s']:.0f} tok/s, TTFT {r['ttft_p50_ms']}, gap {r['worst_gap_ms']}"
            for r in results[label]
        )
        print(f"  {label:<8} {rounds}")
    width = max(len(name) for _, name in metrics)
    print(f"{'median of the rounds':<{width}}" + "".join(f"{label:>11}" for label in labels))
    for key, name in metrics:
        print(f"{name:<{width}}" + "".join(f"{table[label][key]:>11.1f}" for label in labels))
    failures = {label: r["failures"] for label in labels for r in results[label] if r["failed"]}
    for label, failed in failures.items():
        print(f"FAILED requests ({label}): {failed}")
    for bar in bars:
        print(bar.describe(table))
    return not failures and all(bar.met(table) for bar in bars[:judged])


LEDGER_SITE = ("llama8b", "llama-3.1-8b", "llm.test.internal")  # tests/support/sites.py's base
LEDGER_SPEC_PROXY = ("read_timeout: 900}", "read_timeout: 900, rate_limit_per_ip: 100000, "
                     "rate_limit_per_credential: 100000, max_connections_per_ip: 4096}")


def ledger_confs(spec: Path) -> tuple[str, str, dict[str, str]]:
    """The site's nginx.conf with the usage ledger (as kit renders it) and without; the
    passwords the render made."""
    rendered = render_site(Site.load(spec))
    on = (spec.parent / "nginx" / "nginx.conf").read_text()
    context = {**template_context(build_plan(load_spec(spec)), spec.name), "usage": None}
    off = render_template("nginx.conf.j2", context).decode()
    assert on != off and "kit_usage" not in off
    return on, off, {new.user: new.password for new in rendered.new_passwords}


@dataclass
class BenchDoor:
    """The no-Docker door of --ledger and --h2, its credentials and where its processes run."""

    door: Door
    spec: Path  # its site.yaml
    confs: dict[str, str]  # the rendered nginx.conf with the usage ledger ("on") and without
    keys: dict[str, str]  # Authorization values: "bearer" (a key), "basic" (user ops), "batch"
    split: DoorSplit

    @property
    def conf(self) -> Path:
        return self.spec.parent / "nginx" / "nginx.conf"


@contextmanager
def bench_door(args: argparse.Namespace, batch: bool = False) -> Iterator[BenchDoor]:
    """The base test site rendered (limits out of the way, a Bearer key, the user ops; with
    `batch`, a key of class batch too, "batch", and the stand-in on vLLM's priority scheduler,
    as kit up runs it then) and served by the real nginx + njs with its verifier and the
    stand-in behind it, split over the CPUs (tests/support/cpus.py)."""
    problem = nginx_ns.available()
    if problem:
        sys.exit(f"cannot run nginx here: {problem}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        spec = base_site(root) / "site.yaml"
        text = spec.read_text().replace(*LEDGER_SPEC_PROXY)
        text = text.replace("max_num_seqs: 64", f"max_num_seqs: {max(256, args.streams)}")
        if args.api_servers > 1:  # the door then asks every stream usage on every chunk
            text = text.replace("max_num_seqs:", f"api_servers: {args.api_servers}\n"
                                                  "    max_num_seqs:", 1)
        spec.write_text(text)
        on, off, passwords = ledger_confs(spec)
        key = run_kit("keys", "add", spec, "bench", "--offline").output.split(
            "key bench: ")[1].split()[0]
        basic = base64.b64encode(f"ops:{passwords['ops']}".encode()).decode()
        keys = {"basic": f"Basic {basic}", "bearer": f"Bearer {key}"}
        pacing = standin_pacing(args)
        if batch:
            keys["batch"] = "Bearer " + run_kit("keys", "add", spec, "batch", "--offline",
                                                "--class", "batch").output.split(
                "key batch: ")[1].split()[0]
            render_site(Site.load(spec))  # the door's batch cap, as kit render makes it
            on = (spec.parent / "nginx" / "nginx.conf").read_text()
            pacing["standin_args"] = (*pacing.get("standin_args", ()),
                                      "--scheduling-policy", "priority")
        (root / "work").mkdir()
        service, served, domain = LEDGER_SITE
        with serving_door(spec.parent / "nginx", root / "work", [service], root / "models" /
                          "llama-8b", served, domain, verifier=True,
                          **pacing, STANDIN_LOAD_SECONDS="0.1") as door, \
                DoorSplit(door.nginx_processes(), door.standin.pid) as split:
            yield BenchDoor(door, spec, {"on": on, "off": off}, keys, split)


def standin_pacing(args: argparse.Namespace) -> dict:
    """serving_door's stand-in options: its token pace, or --calibrated's H100 costs
    (tests/standin/README.md) with the site's slots, as kit renders them."""
    processes = ("--api-server-count", str(args.api_servers))
    if not args.calibrated:
        return {"STANDIN_TOKEN_INTERVAL_MS": str(args.interval_ms), "standin_args": processes}
    return {"STANDIN_CALIBRATION": "h100",
            "standin_args": ("--max-num-seqs", str(max(256, args.streams)), *processes)}


def door_load(door: Door, keys: list[str], args: argparse.Namespace, shape: Shape,
              h2: bool = False, continuous_usage: bool = False) -> dict:
    """loadgen.py in the door's namespace against nginx (slot i with the (i mod n)-th of
    `keys`); its figures, its CPU time and nginx's workers'."""
    options = shape.options(args)
    before = sum(process_cpu_seconds(pid) for pid in door.workers())
    client = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, began = api_server_cpu(door), time.monotonic()
    figures = door.load("--model", LEDGER_SITE[1], "--streams", str(args.streams), "--tokens",
                        str(args.tokens), "--ramp", str(options["ramp"]), "--requests",
                        str(options["requests"]), *(f"--auth={key}" for key in keys),
                        "--prompt-words", str(args.prompt_words),
                        *(["--h2"] if h2 else []),
                        *(["--continuous-usage"] if continuous_usage else []),
                        timeout=args.timeout)
    if busy:  # calibrated: each API-server process's busy fraction over the run
        wall = time.monotonic() - began
        figures["api_busy"] = round(max((spent - busy[process]) / wall for process, spent
                                        in api_server_cpu(door).items()), 3)
    figures["nginx_cpu_s"] = round(sum(process_cpu_seconds(pid) for pid in door.workers())
                                   - before, 2)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures["client_cpu_s"] = round(after.ru_utime + after.ru_stime - client.ru_utime
                                    - client.ru_stime, 2)
    return figures


def api_server_cpu(door: Door) -> dict[bytes, float]:
    """The calibrated stand-in's CPU charged to each API-server process so far (its own
    series, tests/standin/README.md); empty when it charges none."""
    reply = door.exchange(raw_request("GET", "/metrics", "vllm"), direct=True)
    return {process: float(value) for process, value in re.findall(
        rb'^standin_api_server_cpu_seconds_total\{process="(\d+)"\} (\S+)$', reply.body,
        re.MULTILINE)}


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare_ledger(args: argparse.Namespace) -> bool:
    """--ledger: rounds of the door with the usage ledger on and off, alternately; True when
    no request failed and the bars are met."""
    # --calibrated: also the ledger on with the bench key under a token budget it never reaches
    # (the door then asks vLLM usage on every chunk, as it did for every credential before the
    # door asked only the final usage), and the ledger off with the client asking usage in every
    # chunk, the H100's diagnostic (what the engine's API server pays for per-chunk usage)
    labels = ("off", "on", "budget", "usage") if args.calibrated else ("off", "on")
    results: dict[str, list[dict]] = {label: [] for label in labels}
    with bench_door(args) as bench:
        door = bench.door
        policy_file = bench.conf.parent / "auth" / "door-policy.json"
        policies = {"budget": budget_policies(1), "none": door_policy({}, set())}
        print(f"usage ledger on vs off: {SUSTAINED.describe(args)}; TLS + Bearer key; one nginx "
              f"reloaded between the two configs (then a warm-up run); {args.rounds} rounds, "
              f"order alternating; {bench.split.describe()}; {machine()} at the start")
        if args.calibrated:
            print("the stand-in calibrated on vLLM 0.20 on an H100 (STANDIN_CALIBRATION=h100); "
                  "budget = the ledger on, the key with a token budget (the door asks usage on "
                  "every chunk); usage = the ledger off, the client asking "
                  "continuous_usage_stats")
        for number in range(args.rounds):
            for label in labels if number % 2 == 0 else labels[::-1]:
                policy_file.write_bytes(policies["budget" if label == "budget" else "none"])
                door.reload(bench.conf, bench.confs["on" if label in ("on", "budget") else "off"])
                run = [bench.keys["bearer"]], args, SUSTAINED, False, label == "usage"
                door_load(door, *run)  # warm-up: new workers
                results[label].append(door_load(door, *run))
        door.flush_logs()
        time.sleep(1)
        spooled = len(door.spool.read_text().splitlines())
    bars = [Bar("on", "off", "tokens_per_s", "min_ratio", 0.99),
            Bar("on", "off", "ttft_p50_ms", "max_added", 1),
            Bar("on", "off", "worst_gap_ms", "max_added", 5)]
    if args.calibrated:  # shown beside the bars: the H100 had x0.924 and x0.872 here
        bars += [Bar("budget", "off", "tokens_per_s", "min_ratio", 0.99),
                 Bar("budget", "off", "ttft_p50_ms", "max_added", 1),
                 Bar("usage", "off", "tokens_per_s", "min_ratio", 0.99)]
    ok = report(SUSTAINED.describe(args) + ", usage ledger on vs off", results, bars,
                judged=3)
    print(f"\nspool lines written: {spooled}; bars {'all met' if ok else 'NOT all met'}; "
          f"{machine()} at the end")
    return ok


POLICY_KEYS = 1000


def budget_policies(count: int) -> bytes:
    """nginx/auth/door-policy.json with `count` keys' budgets, the bench key's (key:bench) among
    them with limits it never reaches: every request is looked up, checked and counted."""
    limits = {"tokens_per_day": 10**12, "tokens_per_month": 10**13,
              "requests_per_minute": 10**9}
    policies = {f"key:user{n:04d}": {"tokens_per_day": 1000 + n, "tokens_per_month": 30000 + n,
                                    "requests_per_minute": 60} for n in range(count - 1)}
    policies["key:bench"] = limits
    return door_policy(policies, set(policies))


def compare_policy(args: argparse.Namespace) -> bool:
    """--policy: rounds of the door with 1,000 keys' budgets and with no policy, alternately;
    True when no request failed and the bars are met."""
    results: dict[str, list[dict]] = {"off": [], "on": []}
    with bench_door(args) as bench:
        door = bench.door
        policy_file = bench.conf.parent / "auth" / "door-policy.json"
        modules = {"off": door_policy({}, set()), "on": budget_policies(POLICY_KEYS)}
        print(f"policy on ({POLICY_KEYS} keys with budgets) vs off: {SUSTAINED.describe(args)}; "
              f"TLS + Bearer key; one nginx reloaded between the two (then a warm-up run); "
              f"{args.rounds} rounds, order alternating; {bench.split.describe()}; "
              f"{machine()} at the start")
        for number in range(args.rounds):
            for label in (("off", "on") if number % 2 == 0 else ("on", "off")):
                policy_file.write_bytes(modules[label])
                door.reload(bench.conf, bench.confs["on"])
                door_load(door, [bench.keys["bearer"]], args, SUSTAINED)  # warm-up: new workers
                results[label].append(door_load(door, [bench.keys["bearer"]], args, SUSTAINED))
    bars = [Bar("on", "off", "tokens_per_s", "min_ratio", 0.99),
            Bar("on", "off", "ttft_p50_ms", "max_added", 1)]
    ok = report(SUSTAINED.describe(args) + f", policy with {POLICY_KEYS} budgets vs none",
                results, bars)
    print(f"\nbars {'all met' if ok else 'NOT all met'}; {machine()} at the end")
    return ok


def compare_protocols(args: argparse.Namespace) -> bool:
    """--h2: rounds of HTTP/1.1 (a connection a stream) and HTTP/2 (every stream on ONE
    connection) through the same door, alternately; True when no request failed and the
    bars on the sustained load are met."""
    results: dict[Shape, dict[str, list[dict]]] = {}
    with bench_door(args) as bench:
        keys = list(bench.keys.values())
        print(f"front door over HTTP/2 vs HTTP/1.1: the rendered door (nginx 1.26 + njs 0.8, "
              f"TLS; {' and '.join(bench.keys)} in turn, slot by slot), the same client "
              f"(loadgen.py) on both: h1.1 a connection a stream, h2 ONE connection for every "
              f"stream; {args.rounds} rounds, order alternating; {bench.split.describe()}; "
              f"{machine()} at the start")
        for shape in (SUSTAINED, BURST):
            runs: dict[str, list[dict]] = {"h1.1": [], "h2": []}
            for label in runs:  # warm-up: TLS session cache, upstream keep-alive
                door_load(bench.door, keys, args, shape, h2=label == "h2")
            for number in range(args.rounds):
                for label in (("h1.1", "h2") if number % 2 == 0 else ("h2", "h1.1")):
                    runs[label].append(door_load(bench.door, keys, args, shape,
                                                 h2=label == "h2"))
            results[shape] = runs
        server_streams = results[SUSTAINED]["h2"][0]["server_max_streams"]
    bars = [Bar("h2", "h1.1", "tokens_per_s", "min_ratio", 0.99),
            Bar("h2", "h1.1", "ttft_p50_ms", "max_added", 1)]
    ok = report(SUSTAINED.describe(args) + ", HTTP/2 vs HTTP/1.1", results[SUSTAINED], bars)
    report(BURST.describe(args) + ", HTTP/2 vs HTTP/1.1 (not judged)", results[BURST], bars)
    print(f"\nnginx's http2_max_concurrent_streams (its SETTINGS): {server_streams}; bars on the "
          f"sustained load {'all met' if ok else 'NOT all met'}; {machine()} at the end")
    return ok


# Issue 43's goal for the batch class beside a flood at 2x the slots, and the H100's figures
MIX_TTFT_GOAL = 2.0  # interactive TTFT p95 with the flood <= this x idle
MIX_SHARE_GOAL = 0.5  # batch keeps at least this share of what interactive leaves
H100_MIX = ("H100, vLLM 0.20 (4 interactive streams, ~490-token prompts x 32 tokens; a batch key "
            "offering 256 streams of ~955-token prompts x 128 tokens, 128 admitted): interactive "
            "TTFT p50/p95 62/82 ms idle, 551/811 ms beside batch (x8.9/x9.9); batch 3,420-3,490 "
            "tokens/s")


def compare_mix(args: argparse.Namespace) -> bool:
    """--mix: `kit bench --mix` (kit/bench/mix.py) through the no-Docker door: 4 interactive
    streams (~490-token prompts x 32 tokens) and a batch key at twice the service's slots
    (~955-token prompts x 128 tokens), the shapes of the H100 run; True when no request failed
    and issue 43's goals are met."""
    with bench_door(args, batch=True) as bench:
        door = bench.door
        site = Site.load(bench.spec)
        service, served, domain = LEDGER_SITE
        print(f"batch flood beside interactive: {args.rounds} round(s) of 3 phases x "
              f"{args.mix_seconds:g} s; {bench.split.describe()}; {machine()} at the start")
        if args.calibrated:
            print("the stand-in calibrated on vLLM 0.20 on an H100 (STANDIN_CALIBRATION=h100), "
                  "--scheduling-policy priority")
        interactive = Endpoint(address="127.0.0.1", port=443, host=domain, tls=True,
                               ca_file=str(door.ca_file), authorization=bench.keys["bearer"],
                               model=served, prompt=prompt_text(490), output_tokens=32)
        os.environ[BATCH_KEY_ENV] = bench.keys["batch"].removeprefix("Bearer ")
        with door.inside():
            result = run_mix(site, service, interactive,
                             MixOptions(args.mix_seconds, 4, args.rounds), print,
                             {"prompt": prompt_text(955), "output_tokens": 128})
    print("\n" + mix_report(result))
    idle, mixed = result.idle, result.interactive_mixed
    p50 = [percentile([o.ttft for o in part.outcomes], 50) * 1000 for part in (idle, mixed)]
    p95 = [part.ttft_p95_ms() for part in (idle, mixed)]
    ok = (not result.failed and result.ttft_ratio <= MIX_TTFT_GOAL
          and result.batch_share >= MIX_SHARE_GOAL)
    print(f"\ninteractive TTFT p50/p95: idle {p50[0]:.0f}/{p95[0]:.0f} ms, beside batch "
          f"{p50[1]:.0f}/{p95[1]:.0f} ms: x{p50[1] / p50[0]:.1f}/x{p95[1] / p95[0]:.1f} "
          f"(goal p95 <= x{MIX_TTFT_GOAL:g}); batch share of what interactive leaves "
          f"{result.batch_share:.0%} (goal >= {MIX_SHARE_GOAL:.0%}); "
          f"{'goals met' if ok else 'goals NOT met'}")
    print(f"{H100_MIX}\n{machine()} at the end")
    return ok


def edit(text: str) -> tuple[str, str]:
    """--variant's OLD=>NEW."""
    old, arrow, new = text.partition("=>")
    if not arrow or not old:
        raise argparse.ArgumentTypeError(f"expected OLD=>NEW, got {text!r}")
    return old.replace("\\n", "\n"), new.replace("\\n", "\n")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], rounds=None)
    parser.add_argument(
        "--variant", type=edit, action="append", default=[], metavar="OLD=>NEW",
        help="also measure nginx with this edit of the rendered nginx.conf (repeatable; \\n for "
             "a newline), e.g. 'keepalive 64;=>keepalive 256;'",
    )
    parser.add_argument("--replicas", type=int, default=1,
                        help="replicas of the service behind nginx (direct: connection i to "
                             "the (i mod n)-th)")
    parser.add_argument("--h2", action="store_true",
                        help="compare HTTP/2 with HTTP/1.1 through the front door instead")
    parser.add_argument("--ledger", action="store_true",
                        help="compare the usage ledger on and off instead (no Docker)")
    parser.add_argument("--policy", action="store_true",
                        help="compare 1,000 keys' budgets with no policy instead (no Docker)")
    parser.add_argument("--prompt-words", type=int, default=0,
                        help="--ledger, --h2, --policy: words added to each prompt (about a "
                             "token each; the H100 run's prompts had ~109 tokens)")
    parser.add_argument("--calibrated", action="store_true",
                        help="--ledger, --h2, --policy, --mix: the stand-in with the H100's "
                             "costs (STANDIN_CALIBRATION=h100) and max(256, --streams) slots")
    parser.add_argument("--api-servers", type=int, default=1, metavar="N",
                        help="--calibrated: the stand-in's API-server processes (vLLM's "
                             "--api-server-count N; default 1, as the H100 ran)")
    parser.add_argument("--mix", action="store_true",
                        help="interactive TTFT beside a batch flood at 2x the slots, and idle "
                             "(kit bench --mix through the no-Docker door)")
    parser.add_argument("--mix-seconds", type=float, default=20, help="--mix: each phase")
    args = parser.parse_args()
    if args.api_servers < 1 or (args.api_servers != 1 and not args.calibrated):
        parser.error("--api-servers N needs --calibrated and N >= 1 (vLLM's --api-server-count "
                     "below 1 runs no API server)")
    if args.mix:
        args.rounds = args.rounds or 1
        sys.exit(0 if compare_mix(args) else 1)
    if args.rounds is None:
        args.rounds = FINE_ROUNDS if args.ledger or args.policy else 3
    if args.policy:
        sys.exit(0 if compare_policy(args) else 1)
    if args.h2:
        sys.exit(0 if compare_protocols(args) else 1)
    if args.ledger:
        sys.exit(0 if compare_ledger(args) else 1)
    hosts = [replica_host(SERVICE, i, args.replicas) for i in range(args.replicas)]
    direct = Column("direct", f"http://{hosts[0]}:{VLLM_PORT}", spread=tuple(hosts[1:]))
    print(f"front door: nginx = the rendered nginx.conf, TLS + Bearer key, {args.replicas} "
          f"replica(s); direct = the stand-in{'s' if args.replicas > 1 else ''} "
          f"({', '.join(hosts)}) on the backend network; {args.rounds} rounds, order rotated; "
          f"{machine()} at the start")
    bars = [Bar("nginx", "direct", "tokens_per_s", "min_ratio", 0.97),
            Bar("nginx", "direct", "ttft_p50_ms", "max_added", 10),
            Bar("nginx", "direct", "worst_gap_ms", "max_added", 50)]
    judged = len(bars)  # a variant's bars are shown for comparison
    with bench_stack(args, "benchfd", replicas=args.replicas) as (site, load):
        key = f"Bearer {site.add_key('bench')}"
        rendered = site.layout.nginx_conf.read_text()
        targets = [direct, Column("nginx", NGINX_URL, key, rendered)]
        if args.variant:
            print("variant = nginx with " + "; ".join(f"{old!r} -> {new!r}"
                                                      for old, new in args.variant))
            targets.append(Column("variant", NGINX_URL, key, site.nginx_conf_with(*args.variant)))
            bars += [Bar("variant", "direct", bar.metric, bar.kind, bar.limit) for bar in bars]
        results = {shape: measure(site, load, args, shape, targets, args.rounds)
                   for shape in (SUSTAINED, BURST)}
    ok = report(SUSTAINED.describe(args), results[SUSTAINED], bars, judged)
    report(BURST.describe(args) + " (not judged)", results[BURST], bars)
    print(f"\nbars on the sustained load: {'all met' if ok else 'NOT all met'}; {machine()} "
          "at the end")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
