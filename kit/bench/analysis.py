"""`kit bench`'s pure core: a step's figures, the SLO verdict, the boundary search and the
recommendation. No I/O here, so each rule is tested on synthetic curves.

The figures and their names are `vllm bench serve`'s (its result file: `median_ttft_ms`,
`p99_itl_ms`, `output_throughput`, …) so a kit number and an upstream number mean the same thing;
percentiles interpolate linearly between samples as numpy.percentile does.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kit.bench.client import Outcome, StepRecord

PRECISION = 0.10  # the search stops when first failing / max passing − 1 is at most this
LAG_LIMIT_MS = 10.0  # client event-loop lag (p90) from which its timestamps are not trusted
KV_FULL = 0.9  # server KV cache usage from which the cache, not the scheduler, is the limit
TPOT_HEADROOM = 0.8  # TPOT p95 below this share of its SLO leaves room for a bigger batch


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation); 0 for no values, as vLLM reports."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    return percentile(values, 50)


@dataclass(frozen=True)
class SloBounds:
    ttft_p95_ms: float
    tpot_p95_ms: float


DEFAULT_SLO = SloBounds(ttft_p95_ms=1000, tpot_p95_ms=50)  # when neither the flag nor the spec says

@dataclass(frozen=True)
class StepResult:
    """One concurrency level: the client's figures (vLLM's names), failures by cause, the
    server's own gauges when kit could read them, and the verdict."""

    max_concurrency: int
    completed: int
    failed: int
    failures: dict[str, int]
    duration_s: float
    request_throughput: float
    output_throughput: float
    mean_input_tokens: float
    median_ttft_ms: float
    p95_ttft_ms: float
    p99_ttft_ms: float
    median_tpot_ms: float
    p95_tpot_ms: float
    median_itl_ms: float
    p99_itl_ms: float
    median_e2el_ms: float
    p99_e2el_ms: float
    client_lag_p90_ms: float
    passed: bool
    client_overloaded: bool
    server: dict[str, float] = field(default_factory=dict)
    direct: dict[str, float] | None = None
    arrival: str = "spread"
    request_rate: float | None = None

    @property
    def level(self) -> float:
        """What the search varies: streams in a closed loop, requests per second in poisson."""
        return self.request_rate if self.request_rate is not None else self.max_concurrency

    @property
    def label(self) -> str:
        if self.request_rate is None:
            return f"{self.max_concurrency} streams"
        return f"{self.request_rate:g} requests/s"

    def violation(self, slo: SloBounds) -> str | None:
        """Why this step fails the SLO — errors first, then the worse of TTFT and TPOT."""
        if self.failed:
            return "errors"
        over = {"ttft": self.p95_ttft_ms / slo.ttft_p95_ms,
                "tpot": self.p95_tpot_ms / slo.tpot_p95_ms}
        worst = max(over, key=over.__getitem__)
        return worst if over[worst] > 1 else None


def tpots_ms(done: list[Outcome]) -> list[float]:
    """TPOT of each request with more than one output token, as `vllm bench serve` computes it
    (calculate_metrics): (latency − TTFT) / (output tokens − 1), in ms."""
    return [(o.latency - o.ttft) * 1000 / (o.output_tokens - 1) for o in done
            if o.output_tokens > 1]


def summarize(record: StepRecord, slo: SloBounds, server: dict[str, float] | None = None,
              lag_limit_ms: float = LAG_LIMIT_MS) -> StepResult:
    """A step's figures as `vllm bench serve` computes them (calculate_metrics)."""
    done = [o for o in record.outcomes if o.ok]
    failures = Counter(o.cause for o in record.outcomes if not o.ok)
    ttfts = [o.ttft * 1000 for o in done]
    tpots = tpots_ms(done)
    itls = [gap * 1000 for o in done for gap in o.itl]
    e2els = [o.latency * 1000 for o in done]
    duration = max(record.duration_s, 1e-9)
    figures: dict[str, Any] = {
        "max_concurrency": record.concurrency,
        "completed": len(done),
        "failed": sum(failures.values()),
        "failures": dict(sorted(failures.items())),
        "duration_s": round(record.duration_s, 3),
        "request_throughput": round(len(done) / duration, 3),
        "output_throughput": round(sum(o.output_tokens for o in done) / duration, 2),
        "mean_input_tokens": round(sum(o.prompt_tokens for o in done) / max(len(done), 1), 1),
        "median_ttft_ms": median(ttfts), "p95_ttft_ms": percentile(ttfts, 95),
        "p99_ttft_ms": percentile(ttfts, 99),
        "median_tpot_ms": median(tpots), "p95_tpot_ms": percentile(tpots, 95),
        "median_itl_ms": median(itls), "p99_itl_ms": percentile(itls, 99),
        "median_e2el_ms": median(e2els), "p99_e2el_ms": percentile(e2els, 99),
    }
    figures = {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}
    overloaded = record.lag_p90_ms > lag_limit_ms
    draft = StepResult(**figures, client_lag_p90_ms=record.lag_p90_ms, passed=False,
                       client_overloaded=overloaded, server=server or {},
                       arrival=record.arrival, request_rate=record.request_rate)
    passed = not overloaded and draft.completed > 0 and draft.violation(slo) is None
    return StepResult(**{**draft.__dict__, "passed": passed})


class BoundarySearch:
    """Concurrency 1, 2, 4, … until the first failing step, then bisection between the highest
    pass and the lowest failure until they are within PRECISION (or adjacent). For a poisson
    load the levels are request rates: `start` r, 2r, 4r, … and `resolution` the finest step.

    Noise can make a curve non-monotonic; the search only ever looks below the lowest failure it
    has seen, so the answer is conservative: `max_passing` passed and everything measured above
    it up to `first_failing` failed.
    """

    def __init__(self, limit: float, start: float = 1, resolution: float = 1) -> None:
        self.limit = limit
        self.start = start
        self.resolution = resolution
        self.results: dict[float, bool] = {}

    @property
    def max_passing(self) -> float | None:
        below = [c for c, ok in self.results.items() if ok and c < (self.first_failing or math.inf)]
        return max(below, default=None)

    @property
    def first_failing(self) -> float | None:
        return min((c for c, ok in self.results.items() if not ok), default=None)

    def record(self, level: float, passed: bool) -> None:
        self.results[level] = passed

    def next(self) -> float | None:
        """The next concurrency to measure, or None when the boundary is known."""
        low, high = self.max_passing, self.first_failing
        if high is None:
            step = self.start if low is None else min(low * 2, self.limit)
            return None if step in self.results else step
        if low is None or high - low <= self.resolution or high <= low * (1 + PRECISION):
            return None
        middle = low + math.floor((high - low) / 2 / self.resolution) * self.resolution
        return middle if isinstance(middle, int) else round(middle, 6)

    @property
    def converged(self) -> bool:
        return self.next() is None


def binding_constraint(steps: list[StepResult], slo: SloBounds,
                       first_failing: float | None) -> str | None:
    failing = next((s for s in steps if s.level == first_failing), None)
    return failing.violation(slo) if failing else None


@dataclass(frozen=True)
class Recommendation:
    """`knob` names what the failing step showed to be the limit: max_num_seqs (sequence slots
    full), max_num_batched_tokens (requests waited with slots free: the prefill token budget),
    kv_cache (cache full, preemptions), gpu (no queue: each step itself got slower), deferred
    (vLLM deferred them: LoRA, KV transfer), errors, or none (no step failed)."""

    max_num_seqs: int | None
    reason: str
    knob: str = "none"
    # whether a failing step bounds it: without one the limit is only known to be higher, and
    # writing max_num_seqs would cap the service below what it carried (`--write-spec` refuses)
    measured: bool = True


def recommend(
    steps: list[StepResult],
    slo: SloBounds,
    max_passing: float | None,
    first_failing: float | None,
    *,
    replicas: int,
    configured_max_num_seqs: int | None,
) -> Recommendation:
    """The knob that matches the engine's own account of the failing step (its gauges: running,
    waiting by reason, KV cache usage, preemptions), claiming only what a step measured."""
    if max_passing is None:
        return _nothing_passed(steps, slo)
    passing = next(s for s in steps if s.level == max_passing)
    streams = passing.max_concurrency  # poisson: the most in flight at the passing rate
    per_replica = max(1, streams // replicas)
    keep = (f"; max_num_seqs {per_replica} per replica keeps the admitted requests within the "
            "SLO and queues the rest")
    if first_failing is None:
        return Recommendation(per_replica, f"every step up to {passing.label} met the SLO: the "
                              "limit is above what was measured; raise --concurrency, "
                              "--request-rate or the search limit to find it", "none",
                              measured=False)
    failing = next(s for s in steps if s.level == first_failing)
    kind = failing.violation(slo)
    at = f"at {failing.label}"
    over = _over_slo(failing, slo, kind)
    more = f"more replicas add ~{per_replica} streams each"
    server = failing.server
    waiting = server.get("num_requests_waiting", 0)
    running = server.get("num_requests_running")
    kv = server.get("kv_cache_usage_perc")
    preempted = server.get("num_preemptions", 0)
    slots_full = server.get("waiting_with_slots_full", 0)
    slots_free = server.get("waiting_with_free_slots", 0)
    deferred = server.get("num_requests_waiting_deferred", 0)
    if kind == "errors":
        return Recommendation(per_replica, f"requests failed {at} ({_failures(failing)}): fix "
                              "that first — a higher limit only adds failures", "errors")
    if preempted or (kv is not None and kv >= KV_FULL):
        cache = f"the KV cache was {kv or 0:.0%} full" + (
            f" and vLLM preempted requests {preempted:g} times" if preempted else "")
        return Recommendation(per_replica, f"{over} {at}: {cache} — the cache, not "
                              "max_num_seqs, limits the batch; a lower max_model_len, "
                              "--kv-cache-dtype fp8 or a higher gpu_memory_utilization make "
                              f"room; {more}" + keep, "kv_cache")
    if slots_full:
        seqs = configured_max_num_seqs
        tpot = (f"TPOT p95 {failing.p95_tpot_ms:.0f} ms of {slo.tpot_p95_ms:g} ms leaves room: "
                "a higher max_num_seqs admits more (each token slows as the batch grows)"
                if failing.p95_tpot_ms <= TPOT_HEADROOM * slo.tpot_p95_ms else
                f"TPOT p95 {failing.p95_tpot_ms:.0f} ms is near its {slo.tpot_p95_ms:g} ms: "
                "a bigger batch would miss it")
        return Recommendation(per_replica, f"{over} {at} while all {seqs} sequence slots ran "
                              f"and {slots_full:g} requests waited for one: max_num_seqs "
                              f"({seqs}) is the limit; {tpot}; {more}" + keep, "max_num_seqs")
    if slots_free:
        return Recommendation(per_replica, f"{over} {at} while {slots_free:g} requests waited "
                              f"with sequence slots free (at most {running or 0:g} of "
                              f"{configured_max_num_seqs or 'max_num_seqs'} ran): the prefill "
                              "token budget admits only so many prompt tokens per step; raise "
                              "--max-num-batched-tokens (extra_args; longer steps cost some "
                              f"TPOT) or shorten prompts; {more}" + keep,
                              "max_num_batched_tokens")
    if deferred:
        return Recommendation(per_replica, f"{over} {at} while vLLM deferred {deferred:g} "
                              "requests (LoRA budget, KV transfer): that constraint, not the "
                              "batch, is the limit" + keep, "deferred")
    if waiting:  # the slots' limit is not known: say what was seen
        return Recommendation(per_replica, f"{over} {at} while {waiting:g} requests waited "
                              f"(running peaked at {running or 0:g}); {more}" + keep,
                              "max_num_seqs")
    lowest = min(steps, key=lambda s: s.level)
    rise = (f"; TPOT p50 went from {lowest.median_tpot_ms:.1f} ms at {lowest.label} to "
            f"{failing.median_tpot_ms:.1f} ms" if lowest is not failing else "")
    queue = " (no request waited)" if "num_requests_waiting" in server else ""
    return Recommendation(per_replica, f"{over} {at}{queue}{rise}: the GPU itself is the "
                          f"limit — each step takes longer as the batch grows; {more}, or a "
                          "smaller or quantized model" + keep, "gpu")


def _nothing_passed(steps: list[StepResult], slo: SloBounds) -> Recommendation:
    """No step met the SLO: say so of the lowest load measured, and only of it."""
    if not steps:
        return Recommendation(None, "no step finished", "errors")
    lowest = min(steps, key=lambda s: s.level)
    why = lowest.violation(slo)
    detail = _over_slo(lowest, slo, why) if why in ("ttft", "tpot") else _failures(lowest)
    if lowest.request_rate is None and lowest.max_concurrency == 1:
        return Recommendation(None, f"even one stream misses the SLO ({detail}): a faster GPU, "
                              "a smaller model or a looser SLO is needed, not a setting",
                              "errors" if why == "errors" else "gpu")
    return Recommendation(None, f"the lowest load measured, {lowest.label}, misses the SLO "
                          f"({detail}); nothing lower was measured: run the search, or a grid "
                          "that starts lower, to find what passes", "none")


def _over_slo(step: StepResult, slo: SloBounds, kind: str | None) -> str:
    if kind == "tpot":
        return f"TPOT p95 {step.p95_tpot_ms:.0f} ms > {slo.tpot_p95_ms:g} ms"
    return f"TTFT p95 {step.p95_ttft_ms:.0f} ms > {slo.ttft_p95_ms:g} ms"


def _failures(step: StepResult | None) -> str:
    if step is None or not step.failures:
        return "no step finished"
    return ", ".join(f"{n} × {cause}" for cause, n in step.failures.items())
