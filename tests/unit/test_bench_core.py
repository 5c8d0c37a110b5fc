"""kit bench's pure core: vLLM's metric definitions, the SLO verdict, the boundary search on
synthetic curves, the recommendation."""

import random

import pytest

from kit.bench import (
    LAG_LIMIT_MS,
    BoundarySearch,
    Slo,
    binding_constraint,
    percentile,
    recommend,
    summarize,
)
from kit.bench_client import Outcome, StepRecord, has_choice

SLO = Slo(ttft_p95_ms=200, tpot_p95_ms=30)


def outcome(ttft_ms: float, tpot_ms: float, tokens: int = 11) -> Outcome:
    gaps = [tpot_ms / 1000] * (tokens - 1)
    return Outcome(ttft=ttft_ms / 1000, latency=ttft_ms / 1000 + sum(gaps), itl=gaps,
                   prompt_tokens=100, output_tokens=tokens)


def record(outcomes: list[Outcome], concurrency: int = 4, lag: float = 0.5) -> StepRecord:
    return StepRecord(concurrency, outcomes, duration_s=2.0, lag_p90_ms=lag, lag_max_ms=lag)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20], 95) == pytest.approx(19.5)
    assert percentile([], 99) == 0.0
    assert percentile([7], 99) == 7


def test_summary_follows_vllm_bench_serve_definitions():
    step = summarize(record([outcome(100, 20), outcome(120, 22, tokens=21)]), SLO)
    assert step.completed == 2 and step.failed == 0
    assert step.median_ttft_ms == 110
    # TPOT = (latency - TTFT) / (output tokens - 1), per request
    assert step.median_tpot_ms == 21
    assert step.median_itl_ms == 22  # 10 gaps of 20 ms, 20 gaps of 22 ms
    assert step.output_throughput == (11 + 21) / 2
    assert step.request_throughput == 1
    assert step.median_e2el_ms == pytest.approx((300 + 560) / 2)
    assert step.passed


def test_failures_are_counted_by_cause_and_fail_the_step():
    outcomes = [outcome(100, 20)] * 8 + [Outcome(cause="http 429")] * 2 + [
        Outcome(cause="timeout after 300 s")]
    step = summarize(record(outcomes), SLO)
    assert step.completed == 8 and step.failed == 3
    assert step.failures == {"http 429": 2, "timeout after 300 s": 1}
    assert not step.passed and step.violation(SLO) == "errors"


@pytest.mark.parametrize(("ttft", "tpot", "why"), [(250, 20, "ttft"), (100, 40, "tpot"),
                                                    (300, 31, "ttft"), (210, 60, "tpot")])
def test_the_worse_of_ttft_and_tpot_binds(ttft, tpot, why):
    step = summarize(record([outcome(ttft, tpot)] * 20), SLO)
    assert not step.passed and step.violation(SLO) == why


def test_a_lagging_client_is_not_trusted():
    step = summarize(record([outcome(100, 20)] * 20, lag=LAG_LIMIT_MS + 1), SLO)
    assert step.client_overloaded and not step.passed


def search(curve, limit: int = 4096) -> tuple[BoundarySearch, list[int]]:
    finder = BoundarySearch(limit)
    measured = []
    while (c := finder.next()) is not None:
        measured.append(c)
        finder.record(c, curve(c))
        assert len(measured) < 40, measured
    return finder, measured


def within_precision(finder: BoundarySearch) -> bool:
    low, high = finder.max_passing, finder.first_failing
    return high - low <= 1 or high <= low * 1.1


@pytest.mark.parametrize("k", [1, 3, 8, 24, 64, 100, 1000])
def test_cliff_is_found_within_ten_percent(k):
    finder, measured = search(lambda c: c <= k)
    assert finder.max_passing <= k < finder.first_failing
    assert within_precision(finder)
    assert measured[:3] == [1, 2, 4][: len(measured[:3])]


def test_linear_curve():  # TPOT grows 0.5 ms per stream from 10 ms: the SLO of 30 holds to 40
    finder, _ = search(lambda c: 10 + 0.5 * c <= 30)
    assert finder.max_passing <= 40 < finder.first_failing and within_precision(finder)


def test_flat_curve_always_met_stops_at_the_limit():
    finder, measured = search(lambda c: True, limit=256)
    assert finder.max_passing == 256 and finder.first_failing is None
    assert measured == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_never_met():
    finder, measured = search(lambda c: False)
    assert measured == [1]
    assert finder.max_passing is None and finder.first_failing == 1


def test_noisy_non_monotonic_curve_gives_a_conservative_answer():
    rng = random.Random(11)
    seen: dict[int, bool] = {}

    def noisy(c: int) -> bool:  # true limit 50; near it a pass or a fail is a coin toss
        seen[c] = c <= 40 or (c <= 60 and rng.random() < 0.5)
        return seen[c]

    finder, _ = search(noisy)
    assert seen[finder.max_passing] and not seen[finder.first_failing]
    assert not any(ok for c, ok in seen.items() if c >= finder.first_failing)
    assert within_precision(finder) and 20 <= finder.max_passing <= 60


def test_a_pass_above_a_failure_is_never_the_answer():
    finder = BoundarySearch(4096)
    for c, ok in [(1, True), (2, True), (4, False), (8, True)]:
        finder.record(c, ok)
    assert finder.max_passing == 2 and finder.first_failing == 4
    assert finder.next() == 3


def steps_for(levels: dict[int, tuple[float, float]], server: dict[int, dict] | None = None):
    return [summarize(record([outcome(t, p)] * 10, c), SLO, (server or {}).get(c))
            for c, (t, p) in levels.items()]


def test_recommendation_says_what_binds_and_what_would_buy_more():
    steps = steps_for({32: (100, 20), 36: (100, 40)})
    assert binding_constraint(steps, SLO, 36) == "tpot"
    advice = recommend(steps, SLO, 32, 36, replicas=1, configured_max_num_seqs=256)
    assert advice.max_num_seqs == 32 and "more replicas" in advice.reason

    full = steps_for({32: (100, 20), 36: (400, 20)}, {36: {"kv_cache_usage_perc": 0.97}})
    advice = recommend(full, SLO, 32, 36, replicas=1, configured_max_num_seqs=256)
    assert "max_model_len" in advice.reason and "97%" in advice.reason

    queued = steps_for({8: (100, 20), 9: (400, 20)}, {9: {"num_requests_waiting": 1.0}})
    advice = recommend(queued, SLO, 8, 9, replicas=2, configured_max_num_seqs=8)
    assert advice.max_num_seqs == 4 and "max_num_seqs (8) is the limit" in advice.reason


def test_recommendation_when_nothing_or_everything_passes():
    none = recommend(steps_for({1: (500, 20)}), SLO, None, 1, replicas=1,
                     configured_max_num_seqs=None)
    assert none.max_num_seqs is None and "even one stream" in none.reason
    every = recommend(steps_for({64: (100, 20)}), SLO, 64, None, replicas=1,
                      configured_max_num_seqs=None)
    assert every.max_num_seqs == 64 and "above what was measured" in every.reason
    assert not every.measured  # --write-spec writes only a measured boundary


@pytest.mark.parametrize(("message", "choice"), [
    (b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}', True),
    (b'{"id":"x","choices":[],"usage":{"completion_tokens":3}}', False),
    (b'{"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}', True),  # spaced JSON
    (b'{"id": "x", "choices": [], "usage": {"completion_tokens": 3}}', False),
])
def test_a_choice_is_recognised_with_or_without_parsing(message, choice):
    assert has_choice(message) is choice
