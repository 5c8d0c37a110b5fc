"""`kit bench` on a vLLM stand-in process (no Docker) taught each limit a real engine has, and
the knob it recommends from the engine's own gauges: sequence slots full, KV cache full, the
prefill token budget, the GPU itself; and a grid without one stream that claims nothing about
one stream. Small grids and short streams keep each scenario to seconds."""

from pathlib import Path

import pytest

from kit.bench import run as bench_run
from kit.bench.analysis import SloBounds
from kit.bench.run import BenchOptions, run_bench
from kit.site import Site
from tests.support.bench_door import local_door
from tests.support.standin_process import LLAMA_8B, model_dir, serving

# name: stand-in flags and environment, the spec's max_num_seqs, the grid, output tokens, SLO
SCENARIOS = {
    # 4 slots, a stream lasts 100 + 15 x 20 ms: at 8 streams each request waits ~400 ms
    "max_num_seqs": (["--max-num-seqs", "4"], {"STANDIN_TTFT_MS": "100"}, 4, (2, 8), 16,
                     SloBounds(250, 100)),
    # 20 blocks of 16 tokens: 64-token prompts growing to 96 tokens, so 3 or 4 fit; preemptions
    "kv_cache": (["--max-num-seqs", "64"], {"STANDIN_TTFT_MS": "100",
                                            "STANDIN_KV_TOKENS": "320"}, 64, (2, 8), 32,
                 SloBounds(250, 100)),
    # 128 tokens a step, a decode token each first: about one 64-token prompt a step
    "max_num_batched_tokens": (["--max-num-seqs", "64", "--max-num-batched-tokens", "128"],
                               {"STANDIN_PREFILL_BUDGET": "1",
                                "STANDIN_PREFILL_US_PER_TOKEN": "500"}, 64, (4, 32), 16,
                               SloBounds(250, 100)),
    # each step 10 ms + 5 ms per running request: TPOT 20 ms at 2 streams, 90 at 16
    "gpu": (["--max-num-seqs", "64"], {"STANDIN_TTFT_MS": "50", "STANDIN_TOKEN_INTERVAL_MS":
                                       "10", "STANDIN_TOKEN_INTERVAL_PER_SEQ_MS": "5"}, 64,
            (2, 16), 16, SloBounds(1000, 60)),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return model_dir(tmp_path_factory.mktemp("scenarios"), "tiny", LLAMA_8B)


def bench(site: Path, model: Path, monkeypatch, name: str, grid: tuple[int, ...] | None = None):
    flags, env, seqs, levels, tokens, slo = SCENARIOS[name]
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("max_num_seqs: 64", f"max_num_seqs: {seqs}"))
    with serving(str(model), *flags, **env) as (port, _):
        monkeypatch.setattr(bench_run, "BenchDoor", local_door(port, model))
        options = BenchOptions(service=None, slo=slo, input_tokens=64, output_tokens=tokens,
                               concurrency=grid or levels,
                               requests_per_step=2 * max(grid or levels),
                               max_minutes=5, compare_direct=False,
                               max_client_lag_ms=50)  # the suite loads the 2 cores
        return run_bench(Site.load(spec), options, lambda line: None)


@pytest.mark.parametrize("knob", list(SCENARIOS))
def test_each_limit_recommends_its_knob(site: Path, model, monkeypatch, knob):
    run = bench(site, model, monkeypatch, knob)
    low, high = SCENARIOS[knob][3]
    steps = {s.max_concurrency: s for s in run.steps}
    assert steps[low].passed and not steps[high].passed, [s.__dict__ for s in run.steps]
    assert run.max_passing == low and run.first_failing == high
    advice = run.recommendation
    assert advice.knob == knob, advice.reason
    assert "one stream" not in advice.reason
    server = steps[high].server
    if knob == "max_num_seqs":
        assert server["waiting_with_slots_full"] > 0
    elif knob == "kv_cache":
        assert server["num_preemptions"] > 0 and server["kv_cache_usage_perc"] >= 0.9
    elif knob == "max_num_batched_tokens":
        assert server["waiting_with_free_slots"] > 0 and server["num_requests_running"] < 64
    else:
        assert server["num_requests_waiting"] == 0


def test_a_grid_without_one_stream_never_speaks_of_one_stream(site: Path, model, monkeypatch):
    run = bench(site, model, monkeypatch, "gpu", grid=(16,))
    assert run.max_passing is None and run.first_failing == 16
    assert "one stream" not in run.recommendation.reason
    assert "the lowest load measured, 16 streams, misses the SLO" in run.recommendation.reason
