"""`kit bench` against a live site: the SLO search (or a grid) through the front door, with the
server's gauges per step and, optionally, the same steps straight at one replica.

The front door is reached as the probe reaches it (kit/front_door/client.py: the published port, TLS
checked against the site CA, kit's probe identity — or a Bearer key from KIT_BENCH_API_KEY). Each
step runs in its own event loop, so Ctrl-C ends the running step and keeps the finished ones.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kit.bench import client as bench_client
from kit.bench.analysis import (
    DEFAULT_SLO,
    LAG_LIMIT_MS,
    BoundarySearch,
    Recommendation,
    SloBounds,
    StepResult,
    binding_constraint,
    percentile,
    recommend,
    summarize,
)
from kit.bench.client import Endpoint, Load, Outcome, StepRecord
from kit.errors import BadInput, KitError
from kit.front_door.client import (
    DoorClient,
    ProbeFailure,
    basic_header,
    probe_password,
    target_for,
)
from kit.layout import PROBE_USER
from kit.plan.build import VLLM_PORT, ServicePlan, build_plan
from kit.site import Site
from kit.spec.model import Service
from kit.spec.vllm_flags import GENERATE

API_KEY_ENV = "KIT_BENCH_API_KEY"
SEARCH_LIMIT = 4096  # the search doubles up to this many streams
CALIBRATION_WORDS = 8
GAUGE_EVERY_S = 0.2
SERVER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total")
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # vLLM 0.33: capacity | deferred
CALIBRATION_REQUESTS = 3  # one stream's requests that set a poisson search's first rate
# A prompt of plain words; each is one token or two in common tokenizers, and the exact count
# is taken from the usage the server reports.
WORDS = ("river", "stone", "apple", "cloud", "music", "paper", "garden", "window", "silver",
         "yellow", "forest", "orange", "letter", "island", "winter", "summer", "valley", "bridge",
         "candle", "market")


@dataclass(frozen=True)
class BenchOptions:
    service: str | None
    slo: SloBounds
    input_tokens: int
    output_tokens: int
    concurrency: tuple[int, ...] | None  # a grid; None: the search
    requests_per_step: int | None  # None: max(100, 5 × concurrency)
    max_minutes: float
    compare_direct: bool
    max_client_lag_ms: float = LAG_LIMIT_MS
    limit: int = SEARCH_LIMIT
    arrival: str = "spread"
    request_rates: tuple[float, ...] | None = None  # a poisson grid; None: the search
    workload: str = "random"  # kit.bench.client.WORKLOADS: what the prompts share


@dataclass
class BenchRun:
    """What a run found so far; written out even when it stopped early."""

    service: str
    slo: SloBounds
    input_tokens: int
    output_tokens: int
    gpus: int
    replicas: int
    configured_max_num_seqs: int | None
    arrival: str = "spread"
    steps: list[StepResult] = field(default_factory=list)
    max_passing: float | None = None
    first_failing: float | None = None
    stopped: str | None = None  # why the run ended before it could answer
    recommendation: Recommendation | None = None

    @property
    def answered(self) -> bool:
        return self.stopped is None

    def to_json(self) -> dict:
        slo = self.slo
        return {
            "service": self.service,
            "slo": {"ttft_p95_ms": slo.ttft_p95_ms, "tpot_p95_ms": slo.tpot_p95_ms},
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "arrival": self.arrival,
            "search_variable": "request_rate" if self.arrival == "poisson" else "max_concurrency",
            "gpus": self.gpus,
            "replicas": self.replicas,
            "steps": [step.__dict__ for step in self.steps],
            # poisson: requests per second; otherwise streams
            "max_passing_concurrency": self.max_passing,
            "first_failing_concurrency": self.first_failing,
            "binding_constraint": binding_constraint(self.steps, slo, self.first_failing),
            "recommendation": (
                {"max_num_seqs": self.recommendation.max_num_seqs,
                 "knob": self.recommendation.knob,
                 "reason": self.recommendation.reason} if self.recommendation else None
            ),
            "stopped": self.stopped,
        }


def pick_service(site: Site, name: str | None) -> Service:
    """The service to load: the one named, else the only generative one (the bench streams
    completions; an embedding model has none to stream)."""
    services = [s for s in site.spec.services if s.task == GENERATE]
    others = [s.name for s in site.spec.services if s.task != GENERATE]
    if name in others or not services:
        what = f"{name} is" if name in others else f"{site.spec_path} has only"
        raise BadInput(f"{what} an embedding model: kit bench measures streamed completions",
                       fix="bench a generative service" + (
                           f" ({', '.join(s.name for s in services)})" if services else ""))
    if name is None:
        if len(services) == 1:
            return services[0]
        raise BadInput(f"{site.spec_path} has {len(services)} generative services",
                       fix="name one with --service (" + ", ".join(s.name for s in services) + ")")
    for service in services:
        if service.name == name:
            return service
    raise BadInput(f"no service {name!r} in {site.spec_path}",
                   fix="use one of: " + ", ".join(s.name for s in services))


class BenchDoor:
    """The site's front door as the bench client uses it, and the probe client for the rest
    (prompt sizing, /metrics/<service>)."""

    def __init__(self, site: Site, service: Service) -> None:
        self.target = target_for(site.spec, site.layout, None, timeout=30)
        self.client = DoorClient(self.target, probe_password(site.layout))
        key = os.environ.get(API_KEY_ENV)
        self.authorization = f"Bearer {key}" if key else basic_header(
            PROBE_USER, probe_password(site.layout))
        self.service = service

    def endpoint(self, prompt: str, output_tokens: int) -> Endpoint:
        t = self.target
        return Endpoint(address=t.address, port=t.https_port, host=t.domain, tls=True,
                        ca_file=str(t.ca_file) if t.ca_file else None,
                        authorization=self.authorization, model=self.service.api_name,
                        prompt=prompt, output_tokens=output_tokens)

    def prompt_tokens(self, words: int) -> int:
        """What the server counts for a prompt of `words` words (one 1-token completion)."""
        content = bench_client.numbered(1000, prompt_text(words))  # as the bench sends it
        body = {"model": self.service.api_name, "max_tokens": 1,
                "messages": [{"role": "user", "content": content}]}
        try:
            reply = self.client.fetch("POST", "/v1/chat/completions", body=body,
                                    credentials=self.authorization)
        except ProbeFailure as failure:
            raise KitError(f"sizing the prompt: {failure}", fix="check the site: kit probe") \
                from failure
        if reply.status != 200:
            raise KitError(f"sizing the prompt: /v1/chat/completions answered {reply.status}",
                           fix="check the site: kit probe")
        return int(reply.json()["usage"]["prompt_tokens"])

    def sized_prompt(self, tokens: int) -> str:
        """A prompt the server counts as `tokens` tokens, found from two measured lengths (the
        chat template adds a fixed count) and checked once more."""
        base = self.prompt_tokens(CALIBRATION_WORDS)
        more = self.prompt_tokens(CALIBRATION_WORDS * 4)
        per_word = max((more - base) / (CALIBRATION_WORDS * 3), 0.1)
        words = max(1, CALIBRATION_WORDS + round((tokens - base) / per_word))
        words = max(1, words + round((tokens - self.prompt_tokens(words)) / per_word))
        return prompt_text(words)

    def server_gauges(self) -> dict[str, float] | None:
        """The replica's vLLM gauges through /metrics/<service>; None when not readable."""
        try:
            reply = self.client.fetch("GET", f"/metrics/{self.service.name}",
                                    credentials=self.client.credentials)
        except ProbeFailure:
            return None
        return parse_gauges(reply.body.decode(errors="replace")) if reply.status == 200 else None


def prompt_text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def parse_gauges(text: str) -> dict[str, float]:
    """The SERVER_GAUGES summed over engines/replicas, names without the `vllm:` prefix (and
    without `_total`); waiting by reason as num_requests_waiting_<reason>."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(vllm:[a-z_]+)(?:\{([^}]*)\})? (\S+)$", line)
        if not match:
            continue
        name, labels, value = match.groups()
        if name in SERVER_GAUGES:
            key = name.removeprefix("vllm:").removesuffix("_total")
        elif name == WAITING_BY_REASON and (reason := re.search(r'reason="([a-z_]+)"',
                                                                labels or "")):
            key = f"num_requests_waiting_{reason.group(1)}"
        else:
            continue
        found[key] = found.get(key, 0.0) + float(value)
    return found


class GaugeWatch:
    """Samples the server's gauges during a step (every GAUGE_EVERY_S, once more at its end);
    keeps the highest of each, the preemptions during the step, and the most requests that
    waited for capacity while every sequence slot ran (`waiting_with_slots_full`) or while some
    were free (`waiting_with_free_slots`), judged within each sample."""

    def __init__(self, door: BenchDoor, slots: int | None = None) -> None:
        self.door = door
        self.slots = slots  # max_num_seqs × replicas, when known
        self.peak: dict[str, float] = {}
        self.preemptions: list[float] = []
        self.task: asyncio.Task | None = None

    def add(self, gauges: dict[str, float]) -> None:
        for key, value in gauges.items():
            self.peak[key] = max(self.peak.get(key, value), value)
        if "num_preemptions" in gauges:
            self.preemptions.append(gauges["num_preemptions"])
            self.peak["num_preemptions"] = self.preemptions[-1] - self.preemptions[0]
        waiting = gauges.get("num_requests_waiting_capacity",
                             gauges.get("num_requests_waiting", 0))
        if waiting and self.slots:
            full = gauges.get("num_requests_running", 0) >= self.slots
            key = "waiting_with_slots_full" if full else "waiting_with_free_slots"
            self.peak[key] = max(self.peak.get(key, 0), waiting)

    async def _sample(self) -> None:
        while True:
            gauges = await asyncio.to_thread(self.door.server_gauges)
            self.add(gauges or {})
            await asyncio.sleep(GAUGE_EVERY_S)

    async def during(self, work) -> StepRecord:
        self.task = asyncio.get_running_loop().create_task(self._sample())
        try:
            record = await work
        finally:
            self.task.cancel()
        gauges = await asyncio.to_thread(self.door.server_gauges)
        self.add(gauges or {})  # the step's end
        return record


class StepProgress:
    """One status line on stderr while a step runs: requests done, running p95s, ETA."""

    def __init__(self, stream=sys.stderr, every_s: float = 0.5) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every_s if self.tty else 5.0
        self.done: list[Outcome] = []
        self.label = ""
        self.total = 0
        self.started = self.shown = 0.0

    def begin(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, []
        self.started = self.shown = time.monotonic()

    def __call__(self, outcome: Outcome) -> None:
        self.done.append(outcome)
        now = time.monotonic()
        if now - self.shown >= self.every or len(self.done) == self.total:
            self.shown = now
            self.stream.write(("\r" if self.tty else "") + self.line(now) +
                              ("" if self.tty else "\n"))
            self.stream.flush()

    def line(self, now: float) -> str:
        ok = [o for o in self.done if o.ok]
        ttft = percentile([o.ttft * 1000 for o in ok], 95)
        tpot = percentile([(o.latency - o.ttft) * 1000 / (o.output_tokens - 1) for o in ok
                           if o.output_tokens > 1], 95)
        n = len(self.done)
        eta = (now - self.started) / n * (self.total - n)
        failed = n - len(ok)
        return (f"{self.label}: {n}/{self.total} requests, p95 TTFT {ttft:.0f} ms, p95 TPOT "
                f"{tpot:.1f} ms" + (f", {failed} failed" if failed else "") +
                f", step ETA {eta:.0f} s   ")

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")


def requests_for(streams: float, options: BenchOptions) -> int:
    """`streams`: a closed loop's, or a poisson rate × one request's latency (Little's law)."""
    return options.requests_per_step or max(100, math.ceil(5 * streams))


def load_for(level: float, arrival: str) -> Load:
    if arrival == "poisson":
        return Load("poisson", rate=level)
    return Load(arrival, concurrency=int(level))


def one_stream_rate(endpoint: Endpoint) -> tuple[float, float]:
    """(requests per second one stream sustains, one request's latency in s): where a poisson
    search starts, rounded to two significant digits."""
    record = asyncio.run(bench_client.run_step(endpoint, Load("lockstep", concurrency=1),
                                               CALIBRATION_REQUESTS))
    latencies = [o.latency for o in record.outcomes if o.ok]
    if not latencies:
        causes = ", ".join(sorted({o.cause for o in record.outcomes}))
        raise KitError(f"one stream's requests failed: {causes}", fix="check the site: kit probe")
    latency = sorted(latencies)[len(latencies) // 2]
    return float(f"{1 / latency:.2g}"), latency


def slo_for(service: Service, ttft_p95_ms: float | None, tpot_p95_ms: float | None) -> SloBounds:
    """The SLO a step is judged by: the flag, else the service's `slo:` in the spec (the one
    its dashboards and alerts use), else kit's default."""
    written = service.slo
    return SloBounds(
        ttft_p95_ms or (written and written.ttft_p95_ms) or DEFAULT_SLO.ttft_p95_ms,
        tpot_p95_ms or (written and written.tpot_p95_ms) or DEFAULT_SLO.tpot_p95_ms,
    )


def run_bench(site: Site, options: BenchOptions, say: Callable[[str], None],
              progress: StepProgress | None = None) -> BenchRun:
    """The search (or grid) until answered, interrupted (Ctrl-C), out of time or limited by the
    client itself; the finished steps are kept in every case."""
    service = pick_service(site, options.service)
    plan = next(s for s in build_plan(site.spec).services if s.name == service.name)
    door = BenchDoor(site, service)
    replicas = len(plan.replicas)
    poisson = options.arrival == "poisson"
    run = BenchRun(service.name, options.slo, options.input_tokens, options.output_tokens,
                   gpus=len(service.gpus), replicas=replicas,
                   configured_max_num_seqs=plan.max_num_seqs, arrival=options.arrival)
    prompt = door.sized_prompt(options.input_tokens)
    # shared-prefix and multiturn share a system prompt of as many words as the prompt's tokens
    endpoint = replace(door.endpoint(prompt, options.output_tokens), workload=options.workload,
                       system_words=options.input_tokens)
    direct = DirectClient(site, plan, endpoint) if options.compare_direct else None
    chosen = options.request_rates if poisson else options.concurrency
    latency = 0.0
    if poisson:  # the search's levels are rates, from what one stream sustains up
        start, latency = one_stream_rate(endpoint)
        search = BoundarySearch(start * options.limit, start=start, resolution=start / 8)
    else:
        search = BoundarySearch(options.limit)
    grid = list(chosen or ())
    slots = plan.max_num_seqs * replicas if plan.max_num_seqs else None

    def next_level() -> float | None:
        if chosen:
            return grid.pop(0) if grid else None
        return search.next()

    deadline = time.monotonic() + options.max_minutes * 60
    progress = progress or StepProgress()
    while (level := next_level()) is not None:
        if time.monotonic() > deadline:
            run.stopped = f"--max-minutes {options.max_minutes:g} reached"
            break
        load = load_for(level, options.arrival)
        total = requests_for(level * latency if poisson else level, options)
        label = f"{level:g} requests/s" if poisson else f"{level} streams"
        progress.begin(f"step {len(run.steps) + 1}, {label}", total)
        watch = GaugeWatch(door, slots)
        try:
            record = asyncio.run(watch.during(
                bench_client.run_step(endpoint, load, total, progress)))
        except KeyboardInterrupt:
            progress.end()
            run.stopped = f"interrupted during the step at {label}"
            break
        progress.end()
        step = summarize(record, options.slo, {k: round(v, 3) for k, v in watch.peak.items()},
                         options.max_client_lag_ms)
        if direct is not None:
            step = replace(step, direct=direct.compare(step, load, total))
        run.steps.append(step)
        say(step_line(step))
        if step.client_overloaded:
            run.stopped = (f"the client could not keep up at {label} (event loop "
                           f"{step.client_lag_p90_ms:.1f} ms late at p90): its latencies would "
                           "be wrong; run kit bench on a less loaded machine")
            break
        search.record(level, step.passed)
    if chosen:
        passing = [s.level for s in run.steps if s.passed]
        failing = [s.level for s in run.steps if not s.passed]
        run.first_failing = min(failing, default=None)
        run.max_passing = max((c for c in passing if c < (run.first_failing or math.inf)),
                              default=None)
    else:
        run.max_passing, run.first_failing = search.max_passing, search.first_failing
        if run.stopped is None and not search.converged:
            run.stopped = "the search did not converge"
    run.recommendation = recommend(run.steps, options.slo, run.max_passing, run.first_failing,
                                   replicas=replicas, configured_max_num_seqs=plan.max_num_seqs)
    return run


def step_line(step: StepResult) -> str:
    verdict = "pass" if step.passed else "FAIL"
    failed = f", {step.failed} failed" if step.failed else ""
    return (f"{step.label:>16}  {verdict}  TTFT p95 {step.p95_ttft_ms:.0f} ms, "
            f"TPOT p95 {step.p95_tpot_ms:.1f} ms, {step.output_throughput:.0f} tok/s{failed}")


class DirectClient:
    """The same steps run by the same client file inside the replica's container, straight at
    the replica over the stack network (no TLS, no nginx): what the front door costs."""

    def __init__(self, site: Site, service: ServicePlan, front: Endpoint) -> None:
        from kit.engine.docker_api import connect

        self.engine = connect(site.engine_url)
        host = service.replicas[0].host  # one replica: the direct figures are per replica
        running = [c for c in site.observe(self.engine, with_images=False).containers
                   if c.service == host and c.running]
        if not running:
            raise KitError(f"no running container of {service.name}: --compare-direct needs "
                           "the stack up", fix="run kit up")
        self.container = running[0].id
        self.endpoint = replace(front, address=host, port=VLLM_PORT, host=f"{host}:{VLLM_PORT}",
                                tls=False, ca_file=None, authorization=None)
        self.source = Path(bench_client.__file__).read_text()

    def compare(self, step: StepResult, load: Load, requests: int) -> dict[str, float]:
        """The direct step's key figures and front door / direct ratios."""
        job = {"endpoint": self.endpoint.__dict__, "load": load.__dict__, "requests": requests}
        code, output = self.engine.exec(self.container,
                                        ["python3", "-c", self.source, json.dumps(job)])
        lines = output.strip().splitlines()
        if code != 0 or not lines:
            raise KitError(f"the direct client in {self.container[:12]} exited {code}: "
                           f"{output[-300:]}", fix="check that the image has python3")
        direct = summarize(StepRecord.from_json(json.loads(lines[-1])), SloBounds(1e9, 1e9))
        keys = ("output_throughput", "median_ttft_ms", "p95_ttft_ms", "median_tpot_ms",
                "p95_tpot_ms", "median_itl_ms")
        figures: dict[str, float] = {key: getattr(direct, key) for key in keys}
        figures["failed"] = direct.failed
        for key in keys:
            base = getattr(direct, key)
            figures[f"ratio_{key}"] = round(getattr(step, key) / base, 3) if base else 0.0
        return figures
