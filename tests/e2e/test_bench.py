"""`kit bench` end to end: the SLO search through the front door of a stack brought up by
`kit up`, the server's gauges, the outputs and --write-spec; then a poisson grid through the same
door, each step also run straight at the replica (--compare-direct: the same client and code
path whatever the arrival, so the grid's two short steps prove it, not the search's six). The
stand-in admits at most 4 requests (max_num_seqs), so the boundary is 4; short streams keep the
run to about a minute."""

import json

import pytest

from tests.support.live_stack import SERVICE, LiveSite

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TTFT, a boundary: alone (docs/testing.md)

K = 4
UNLIMITED = {"rate_limit_per_ip": 100000, "rate_limit_per_credential": 100000,
             "max_connections_per_ip": 4096}
# A stream lasts 100 + 32 x 20 = 740 ms: at 5 streams on 4 slots each request waits ~185 ms for
# one, far over the SLO's 150 ms of slack, which is wider than a busy machine's jitter.
PACE = {"STANDIN_TTFT_MS": "100", "STANDIN_TOKEN_INTERVAL_MS": "20"}
POISSON_REQUESTS = 8  # a step of the grid: what arrives in 2-4 s at 2 and 4 a second


def test_bench_finds_the_boundary_and_writes_the_spec(tmp_path, docker_client, test_images,
                                                      free_port, cleanup_project):
    site = LiveSite.create(tmp_path / "site", docker_client, free_port(), free_port(),
                           prefix="bench", proxy=UNLIMITED, env=PACE, max_num_seqs=K)
    cleanup_project(site.name)
    site.up()
    out = tmp_path / "out"
    result = site.kit("bench", "--slo-ttft-p95-ms", "250", "--slo-tpot-p95-ms", "60",
                      "--input-tokens", "64", "--output-tokens", "32", "--requests-per-step",
                      "16", "--max-client-lag-ms", "50",  # the suite loads the 2 cores
                      "--write-spec", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "bench.json").read_text())
    assert report["service"] == SERVICE
    assert report["max_passing_concurrency"] == K, result.stdout
    assert report["first_failing_concurrency"] == K + 1
    assert report["binding_constraint"] == "ttft"
    assert report["recommendation"]["max_num_seqs"] == K
    assert report["arrival"] == "spread" and report["search_variable"] == "max_concurrency"
    # all K slots ran while requests waited: the engine's own account names the knob
    assert report["recommendation"]["knob"] == "max_num_seqs", report["recommendation"]
    steps = {step["max_concurrency"]: step for step in report["steps"]}
    assert sorted(steps) == [1, 2, 4, 5, 6, 8]
    for step in steps.values():
        assert step["completed"] == 16 and step["failed"] == 0
        assert step["passed"] == (step["max_concurrency"] <= K)
        assert step["server"]["num_requests_running"] <= K  # the server's view, per step
    assert steps[8]["server"]["num_requests_waiting"] > 0
    assert steps[8]["server"]["waiting_with_slots_full"] > 0
    assert 100 <= steps[1]["median_ttft_ms"] < 250
    assert 60 <= steps[1]["mean_input_tokens"] <= 68
    for name in ("bench.csv", "bench.png", "bench-pareto.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "max_passing_concurrency 4" in result.stdout
    assert f"max_num_seqs: {K}" in site.spec_path.read_text()
    assert "kit render && kit up" in result.stdout
    assert "arrival: spread" in result.stdout

    # an open loop through the same door: a poisson grid of request rates, and each of its
    # steps again straight at the replica
    poisson_out = tmp_path / "poisson"
    result = site.kit("bench", "--request-rate", "2,4", "--input-tokens", "64",
                      "--output-tokens", "32", "--requests-per-step", str(POISSON_REQUESTS),
                      "--slo-ttft-p95-ms", "250", "--slo-tpot-p95-ms", "60",
                      "--max-client-lag-ms", "50", "--compare-direct", "--out", str(poisson_out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((poisson_out / "bench.json").read_text())
    assert report["arrival"] == "poisson" and report["search_variable"] == "request_rate"
    assert [step["request_rate"] for step in report["steps"]] == [2.0, 4.0]
    for step in report["steps"]:
        assert step["failed"] == 0 and step["completed"] == POISSON_REQUESTS, step
        assert step["direct"]["failed"] == 0 and step["direct"]["ratio_output_throughput"] > 0
    assert "arrival: poisson" in result.stdout
