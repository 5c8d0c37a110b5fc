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

from kit.bench_client import StepRecord

PRECISION = 0.10  # the search stops when first failing / max passing − 1 is at most this
LAG_LIMIT_MS = 10.0  # client event-loop lag (p90) from which its timestamps are not trusted
KV_FULL = 0.9  # server KV cache usage from which the cache, not the scheduler, is the limit


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
class Slo:
    ttft_p95_ms: float
    tpot_p95_ms: float


DEFAULT_SLO = Slo(ttft_p95_ms=1000, tpot_p95_ms=50)  # when neither the flag nor the spec says

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

    def violation(self, slo: Slo) -> str | None:
        """Why this step fails the SLO — errors first, then the worse of TTFT and TPOT."""
        if self.failed:
            return "errors"
        over = {"ttft": self.p95_ttft_ms / slo.ttft_p95_ms,
                "tpot": self.p95_tpot_ms / slo.tpot_p95_ms}
        worst = max(over, key=over.__getitem__)
        return worst if over[worst] > 1 else None


def summarize(record: StepRecord, slo: Slo, server: dict[str, float] | None = None,
              lag_limit_ms: float = LAG_LIMIT_MS) -> StepResult:
    """A step's figures as `vllm bench serve` computes them (calculate_metrics): TPOT per request
    with more than one output token = (latency − TTFT) / (output tokens − 1)."""
    done = [o for o in record.outcomes if o.ok]
    failures = Counter(o.cause for o in record.outcomes if not o.ok)
    ttfts = [o.ttft * 1000 for o in done]
    tpots = [(o.latency - o.ttft) * 1000 / (o.output_tokens - 1) for o in done
             if o.output_tokens > 1]
    itls = [gap * 1000 for o in done for gap in o.itl]
    e2els = [o.latency * 1000 for o in done]
    duration = max(record.duration_s, 1e-9)
    figures = {
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
                       client_overloaded=overloaded, server=server or {})
    passed = not overloaded and draft.completed > 0 and draft.violation(slo) is None
    return StepResult(**{**draft.__dict__, "passed": passed})


class BoundarySearch:
    """Concurrency 1, 2, 4, … until the first failing step, then bisection between the highest
    pass and the lowest failure until they are within PRECISION (or adjacent).

    Noise can make a curve non-monotonic; the search only ever looks below the lowest failure it
    has seen, so the answer is conservative: `max_passing` passed and everything measured above
    it up to `first_failing` failed.
    """

    def __init__(self, limit: int, start: int = 1) -> None:
        self.limit = limit
        self.start = start
        self.results: dict[int, bool] = {}

    @property
    def max_passing(self) -> int | None:
        below = [c for c, ok in self.results.items() if ok and c < (self.first_failing or math.inf)]
        return max(below, default=None)

    @property
    def first_failing(self) -> int | None:
        return min((c for c, ok in self.results.items() if not ok), default=None)

    def record(self, concurrency: int, passed: bool) -> None:
        self.results[concurrency] = passed

    def next(self) -> int | None:
        """The next concurrency to measure, or None when the boundary is known."""
        low, high = self.max_passing, self.first_failing
        if high is None:
            step = self.start if low is None else min(low * 2, self.limit)
            return None if step in self.results else step
        if low is None or high - low <= 1 or high <= low * (1 + PRECISION):
            return None
        return (low + high) // 2

    @property
    def converged(self) -> bool:
        return self.next() is None


def binding_constraint(steps: list[StepResult], slo: Slo, first_failing: int | None) -> str | None:
    failing = next((s for s in steps if s.max_concurrency == first_failing), None)
    return failing.violation(slo) if failing else None


@dataclass(frozen=True)
class Recommendation:
    max_num_seqs: int | None
    reason: str
    # whether a failing step bounds it: without one the limit is only known to be higher, and
    # writing max_num_seqs would cap the service below what it carried (`--write-spec` refuses)
    measured: bool = True


def recommend(
    steps: list[StepResult],
    slo: Slo,
    max_passing: int | None,
    first_failing: int | None,
    *,
    replicas: int,
    configured_max_num_seqs: int | None,
) -> Recommendation:
    """What to set, and whether more replicas or a shorter max_model_len would buy more, from
    what the failing step showed (client figures and the server's gauges)."""
    if max_passing is None:
        step = steps[0] if steps else None
        why = step.violation(slo) if step else None
        detail = _over(step, slo) if step and why in ("ttft", "tpot") else _failures(step)
        return Recommendation(None, f"even one stream misses the SLO ({detail}): a faster GPU, "
                              "a smaller model or a looser SLO is needed, not a setting")
    per_replica = max(1, max_passing // replicas)
    if first_failing is None:
        return Recommendation(per_replica, f"every step up to {max_passing} concurrent streams "
                              "met the SLO: the limit is above what was measured; raise "
                              "--concurrency or the search limit to find it", measured=False)
    failing = next(s for s in steps if s.max_concurrency == first_failing)
    kind = failing.violation(slo)
    kv = failing.server.get("kv_cache_usage_perc")
    waiting = failing.server.get("num_requests_waiting", 0)
    queued = configured_max_num_seqs is not None and waiting > 0
    if kind == "errors":
        reason = (f"requests failed at {first_failing} streams ({_failures(failing)}): fix that "
                  "first — a higher limit only adds failures")
    elif kv is not None and kv >= KV_FULL:
        reason = (f"the KV cache was {kv:.0%} full at {first_failing} streams: a lower "
                  "max_model_len leaves room for more sequences per replica; more replicas add "
                  f"~{per_replica} streams each")
    elif kind == "tpot":
        reason = (f"TPOT p95 {failing.p95_tpot_ms:.0f} ms > {slo.tpot_p95_ms:g} ms at "
                  f"{first_failing} streams: each token slows as the batch grows, so one replica "
                  f"carries {per_replica}; more replicas add ~{per_replica} streams each")
    elif queued:
        reason = (f"TTFT p95 {failing.p95_ttft_ms:.0f} ms > {slo.ttft_p95_ms:g} ms at "
                  f"{first_failing} streams while {waiting:g} requests waited for a slot: "
                  f"max_num_seqs ({configured_max_num_seqs}) is the limit; TPOT p95 "
                  f"{failing.p95_tpot_ms:.0f} ms of {slo.tpot_p95_ms:g} ms — more replicas "
                  f"add ~{per_replica} streams each")
    else:
        reason = (f"TTFT p95 {failing.p95_ttft_ms:.0f} ms > {slo.ttft_p95_ms:g} ms at "
                  f"{first_failing} streams: prefill is the limit; more replicas add "
                  f"~{per_replica} streams each")
    return Recommendation(per_replica, f"{reason}; max_num_seqs {per_replica} per replica keeps "
                          "the admitted requests within the SLO and queues the rest")


def _over(step: StepResult, slo: Slo) -> str:
    return (f"TTFT p95 {step.p95_ttft_ms:.0f} ms of {slo.ttft_p95_ms:g}, TPOT p95 "
            f"{step.p95_tpot_ms:.0f} ms of {slo.tpot_p95_ms:g}")


def _failures(step: StepResult | None) -> str:
    if step is None or not step.failures:
        return "no step finished"
    return ", ".join(f"{n} × {cause}" for cause, n in step.failures.items())
