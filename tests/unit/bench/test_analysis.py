"""kit bench's pure core: vLLM's metric definitions, the SLO verdict, the boundary search on
synthetic curves, the recommendation."""

import random

import pytest

from kit.bench.analysis import (
    LAG_LIMIT_MS,
    BoundarySearch,
    SloBounds,
    binding_constraint,
    percentile,
    recommend,
    summarize,
)
from kit.bench.client import Outcome, StepRecord, has_choice
from kit.bench.run import GaugeWatch, parse_gauges

SLO = SloBounds(ttft_p95_ms=200, tpot_p95_ms=30)


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


# /metrics of vLLM 0.33 as the engine exports them (label values from vllm/v1/metrics/loggers.py:
# reason is "capacity" or "deferred"), two engines of one replica to show the sums
METRICS = """\
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
"""


def test_the_engines_gauges_are_read_with_their_reasons():
    assert parse_gauges(METRICS) == {
        "num_requests_running": 8.0, "num_requests_waiting": 4.0,
        "num_requests_waiting_capacity": 3.0, "num_requests_waiting_deferred": 1.0,
        "kv_cache_usage_perc": 0.25, "num_preemptions": 7.0}


def watched(samples: list[dict[str, float]], slots: int | None = 8) -> dict[str, float]:
    watch = GaugeWatch(door=None, slots=slots)
    for sample in samples:
        watch.add(sample)
    return watch.peak


def test_waiting_is_judged_against_the_slots_within_each_sample():
    peak = watched([
        {"num_requests_running": 8, "num_requests_waiting_capacity": 2, "num_preemptions": 3},
        {"num_requests_running": 5, "num_requests_waiting_capacity": 6, "num_preemptions": 5},
        {"num_requests_running": 8, "num_requests_waiting_capacity": 0, "num_preemptions": 5},
    ])
    assert peak["waiting_with_slots_full"] == 2 and peak["waiting_with_free_slots"] == 6
    assert peak["num_preemptions"] == 2  # during the step, not since the server started
    assert "waiting_with_slots_full" not in watched([{"num_requests_running": 3,
                                                       "num_requests_waiting": 2}], slots=None)


def steps_for(levels: dict[int, tuple[float, float]], server: dict[int, dict] | None = None):
    return [summarize(record([outcome(t, p)] * 10, c), SLO, (server or {}).get(c))
            for c, (t, p) in levels.items()]


def advice(levels, server, passing, failing, seqs=8, replicas=1):
    steps = steps_for(levels, server)
    return recommend(steps, SLO, passing, failing, replicas=replicas,
                     configured_max_num_seqs=seqs)


def test_sequence_slots_full():  # running = max_num_seqs while requests waited
    gauges = watched([{"num_requests_running": 8, "num_requests_waiting_capacity": 4,
                       "kv_cache_usage_perc": 0.3}])
    got = advice({8: (100, 20), 12: (400, 20)}, {12: gauges}, 8, 12, replicas=2)
    assert got.knob == "max_num_seqs" and got.max_num_seqs == 4
    assert "all 8 sequence slots ran" in got.reason
    assert "max_num_seqs (8) is the limit" in got.reason
    assert "leaves room" in got.reason  # TPOT 20 of 30 ms


def test_kv_cache_full():  # usage near 100 % and preemptions, with slots to spare
    gauges = watched([{"num_requests_running": 5, "num_requests_waiting_capacity": 3,
                       "kv_cache_usage_perc": 0.99, "num_preemptions": 10},
                      {"num_requests_running": 5, "num_requests_waiting_capacity": 3,
                       "kv_cache_usage_perc": 0.98, "num_preemptions": 14}])
    got = advice({4: (100, 20), 6: (400, 20)}, {6: gauges}, 4, 6, seqs=64)
    assert got.knob == "kv_cache"
    assert "99% full" in got.reason and "preempted requests 4 times" in got.reason
    assert "max_model_len" in got.reason


def test_prefill_budget():  # waiting while running < max_num_seqs, cache not full
    gauges = watched([{"num_requests_running": 30, "num_requests_waiting_capacity": 16,
                       "kv_cache_usage_perc": 0.1}], slots=256)
    got = advice({28: (300, 20), 30: (718, 20)}, {30: gauges}, 28, 30, seqs=256)
    assert got.knob == "max_num_batched_tokens" and "--max-num-batched-tokens" in got.reason
    assert "with sequence slots free (at most 30 of 256 ran)" in got.reason
    assert "max_num_seqs (256) is the limit" not in got.reason


def test_the_gpu_itself():  # TPOT rising with no queue
    quiet = {"num_requests_running": 16, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.2}
    got = advice({2: (100, 12), 8: (100, 24), 16: (110, 40)}, {16: watched([quiet])}, 8, 16,
                 seqs=64)
    assert got.knob == "gpu" and "no request waited" in got.reason
    assert binding_constraint(steps_for({16: (110, 40)}), SLO, 16) == "tpot"
    assert "TPOT p50 went from 12.0 ms at 2 streams to 40.0 ms" in got.reason


def test_deferred_and_errors():
    deferred = watched([{"num_requests_running": 2, "num_requests_waiting_capacity": 0,
                         "num_requests_waiting_deferred": 5}])
    assert advice({2: (100, 20), 4: (400, 20)}, {4: deferred}, 2, 4).knob == "deferred"
    steps = steps_for({2: (100, 20)}) + [summarize(record([Outcome(cause="http 502")] * 4, 4),
                                                   SLO)]
    got = recommend(steps, SLO, 2, 4, replicas=1, configured_max_num_seqs=8)
    assert got.knob == "errors" and "4 × http 502" in got.reason


def test_recommendation_when_nothing_or_everything_passes():
    none = recommend(steps_for({1: (500, 20)}), SLO, None, 1, replicas=1,
                     configured_max_num_seqs=None)
    assert none.max_num_seqs is None and "even one stream" in none.reason
    every = recommend(steps_for({64: (100, 20)}), SLO, 64, None, replicas=1,
                      configured_max_num_seqs=None)
    assert every.max_num_seqs == 64 and "above what was measured" in every.reason
    assert not every.measured  # --write-spec writes only a measured boundary


def test_a_grid_without_one_stream_claims_nothing_about_one_stream():
    failing = recommend(steps_for({16: (500, 20), 64: (900, 20)}), SLO, None, 16, replicas=1,
                        configured_max_num_seqs=256)
    assert "one stream" not in failing.reason and failing.max_num_seqs is None
    assert "the lowest load measured, 16 streams, misses the SLO" in failing.reason
    passing = recommend(steps_for({16: (100, 20), 64: (100, 40)}), SLO, 16, 64, replicas=1,
                        configured_max_num_seqs=256)
    assert "one stream" not in passing.reason and passing.max_num_seqs == 16


def test_a_rate_search_bisects_between_rates():
    finder = BoundarySearch(limit=0.5 * 4096, start=0.5, resolution=0.5 / 8)
    measured = []
    while (rate := finder.next()) is not None:
        measured.append(rate)
        finder.record(rate, rate <= 5.3)
    assert measured[:5] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert finder.max_passing <= 5.3 < finder.first_failing <= finder.max_passing * 1.1


@pytest.mark.parametrize(("message", "choice"), [
    (b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}', True),
    (b'{"id":"x","choices":[],"usage":{"completion_tokens":3}}', False),
    (b'{"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}', True),  # spaced JSON
    (b'{"id": "x", "choices": [], "usage": {"completion_tokens": 3}}', False),
])
def test_a_choice_is_recognised_with_or_without_parsing(message, choice):
    assert has_choice(message) is choice
