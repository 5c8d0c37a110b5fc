"""kit bench's client against a local stand-in process (no Docker): vLLM's timing of a stream,
the stand-in's capacity model (programmed TTFT, a limit with a queue, a pace that slows with the
batch), failures by cause, event-loop lag, and Ctrl-C keeping the finished steps."""

import asyncio
import math
import time
from pathlib import Path

import pytest

from kit.bench import client as bench_client
from kit.bench import run as bench_run
from kit.bench.analysis import LAG_LIMIT_MS, SloBounds, summarize
from kit.bench.client import Endpoint, Load, run_step
from kit.bench.run import BenchOptions, run_bench
from kit.site import Site
from tests.support.bench_door import stale_connection_run
from tests.support.standin_process import LLAMA_8B, model_dir, serving

SLO = SloBounds(ttft_p95_ms=1000, tpot_p95_ms=100)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return model_dir(tmp_path_factory.mktemp("bench"), "tiny", LLAMA_8B)


def endpoint(port: int, model: Path, tokens: int = 16, name: str | None = None) -> Endpoint:
    return Endpoint(address="127.0.0.1", port=port, host=f"127.0.0.1:{port}", tls=False,
                    ca_file=None, authorization=None, model=name or str(model),
                    prompt="hello " * 40, output_tokens=tokens, timeout_s=20)


def measure(port: int, model: Path, concurrency: int, requests: int, arrival: str = "spread",
            **options):
    load = Load(arrival, concurrency=concurrency)
    record = asyncio.run(run_step(endpoint(port, model, **options), load, requests))
    return summarize(record, SLO)


def close(measured: float, programmed: float) -> bool:
    """Within 5 % or 5 ms: the definitions, on a shared 2-core machine (the 3 % / 2 ms fidelity
    bar is measured by scripts/bench_bars.py, on a quiet stack)."""
    return abs(measured - programmed) <= max(0.05 * programmed, 5.0)


def test_programmed_ttft_and_pace_are_what_the_client_reports(model):
    with serving(str(model), STANDIN_TTFT_MS="60", STANDIN_TOKEN_INTERVAL_MS="10") as (port, _):
        for concurrency in (1, 8):
            step = measure(port, model, concurrency, 16)
            assert step.completed == 16 and step.failed == 0
            assert close(step.median_ttft_ms, 60), step
            assert close(step.median_tpot_ms, 10), step
            assert step.mean_input_tokens > 40


def test_at_most_max_num_seqs_run_and_the_rest_queue(model):
    with serving(str(model), "--max-num-seqs", "4", STANDIN_TTFT_MS="20",
                 STANDIN_TOKEN_INTERVAL_MS="10") as (port, _):
        within = measure(port, model, 4, 12)
        beyond = measure(port, model, 8, 24)
    assert close(within.median_ttft_ms, 20)
    # 8 streams on 4 slots: half of each stream's time is spent waiting for a slot
    assert beyond.median_ttft_ms > 20 + 100
    assert close(beyond.median_tpot_ms, 10)


def test_the_pace_slows_with_the_batch(model):
    with serving(str(model), STANDIN_TTFT_MS="20", STANDIN_TOKEN_INTERVAL_MS="10",
                 STANDIN_TOKEN_INTERVAL_PER_SEQ_MS="2") as (port, _):
        alone = measure(port, model, 1, 4)
        eight = measure(port, model, 8, 16)
    assert close(alone.median_tpot_ms, 12)
    assert close(eight.median_tpot_ms, 26)  # 10 + 2 x 8 running


def test_failures_are_counted_by_cause(model):
    with serving(str(model)) as (port, _):
        wrong = measure(port, model, 2, 4, name="no-such-model")
    assert wrong.failures == {"http 404": 4} and wrong.completed == 0 and not wrong.passed
    with serving(str(model)) as (port, _):
        pass  # the port is closed again
    refused = measure(port, model, 1, 2)
    assert refused.failures == {"connection: ConnectionRefusedError": 2}


def test_a_client_that_cannot_keep_up_says_so(model):
    def busy(_outcome) -> None:
        time.sleep(0.03)  # work that blocks the loop, as too many streams for one core would

    with serving(str(model), STANDIN_TOKEN_INTERVAL_MS="5") as (port, _):
        # short streams: the loop is mostly blocked, so most of the watchdog's wake-ups are late
        record = asyncio.run(run_step(endpoint(port, model, tokens=2), Load("spread", 4), 24,
                                      busy))
    step = summarize(record, SLO)
    assert record.lag_p90_ms > LAG_LIMIT_MS and step.client_overloaded and not step.passed


def test_ctrl_c_keeps_the_finished_steps(site: Path, model, monkeypatch):
    with serving(str(model), STANDIN_TOKEN_INTERVAL_MS="2") as (port, _):
        class Door:
            def __init__(self, site, service) -> None:
                self.service = service

            def sized_prompt(self, tokens: int) -> str:
                return "hello"

            def endpoint(self, prompt: str, output_tokens: int) -> Endpoint:
                return endpoint(port, model, tokens=output_tokens)

            def server_gauges(self) -> None:
                return None

        real = bench_run.bench_client.run_step
        calls = []

        async def interrupted_third(*args, **kwargs):
            calls.append(args[1])
            if len(calls) == 3:
                raise KeyboardInterrupt
            return await real(*args, **kwargs)

        monkeypatch.setattr(bench_run, "BenchDoor", Door)
        monkeypatch.setattr(bench_run.bench_client, "run_step", interrupted_third)
        options = BenchOptions(service=None, slo=SLO, input_tokens=8, output_tokens=4,
                               concurrency=None, requests_per_step=4, max_minutes=1,
                               compare_direct=False)
        run = run_bench(Site.load(site / "site.yaml"), options, lambda line: None)
    assert [s.max_concurrency for s in run.steps] == [1, 2]
    assert run.stopped == "interrupted during the step at 4 streams" and not run.answered
    assert run.max_passing == 2 and run.first_failing is None


@pytest.mark.parametrize("reuse_s", [bench_client.IDLE_REUSE_S, math.inf])
def test_idle_connections_closed_by_the_server_lose_nothing_and_send_nothing_twice(
        model, monkeypatch, reuse_s):
    """64 streams staggered over ~3 s against a server closing idle connections after 1 s (as
    uvicorn does after 5 s): each stream's first counted request goes out on a connection idle
    for up to 3 s. With no idle bound at all (inf) every one of those is saved by the resend."""
    monkeypatch.setattr(bench_client, "IDLE_REUSE_S", reuse_s)
    record, received = stale_connection_run(model, 64, 64, keep_alive_s=1, tokens=60,
                                            interval_ms=50)
    step = summarize(record, SLO)
    assert step.failures == {} and step.completed == 64
    assert received == 64 + 64  # warm-ups + counted: nothing was sent twice
    resent = sum(o.resent for o in record.outcomes)
    if reuse_s == math.inf:
        assert resent > 10  # the server did close connections under the requests


def test_arrivals_spread_lockstep_and_poisson(model):
    """Prefills cost 1 ms per prompt token (49 tokens: ~49 ms) and share the steps: the lockstep
    burst of 16 computes 16 prompts in one long step before anyone's first token (TTFT grows
    with the streams, as vllm bench serve measures on a GPU), the same 16 streams spread find
    about one prompt per step; a poisson load runs at its rate, whatever is in flight."""
    env = {"STANDIN_TOKEN_INTERVAL_MS": "20", "STANDIN_PREFILL_BUDGET": "1",
           "STANDIN_PREFILL_US_PER_TOKEN": "1000"}
    with serving(str(model), **env) as (port, _):
        spread = [measure(port, model, c, 2 * c, "spread") for c in (2, 16)]
        lockstep = [measure(port, model, c, 2 * c, "lockstep") for c in (2, 16)]
        load = Load("poisson", rate=10.0, seed=3)
        record = asyncio.run(run_step(endpoint(port, model), load, 40))
    poisson = summarize(record, SLO)
    assert lockstep[1].median_ttft_ms > lockstep[0].median_ttft_ms + 300  # 16 prompts collide
    assert spread[1].median_ttft_ms < spread[0].median_ttft_ms + 100
    assert lockstep[1].median_ttft_ms > spread[1].median_ttft_ms + 300
    assert poisson.arrival == "poisson" and poisson.request_rate == 10.0
    assert 5 < poisson.request_throughput < 15 and poisson.failed == 0
    assert poisson.max_concurrency >= 2  # in flight at once: the open loop does not wait


def test_a_refused_request_keeps_its_connection_for_the_next(model):
    """An answer other than 200, read whole on a connection the server keeps open: the next
    request goes on that connection (kit bench --mix sends the door's 429s again; a new TLS
    handshake for each took the CPU the interactive streams' timing shares)."""
    async def refused_then_served(port: int) -> tuple[str, bool, bool]:
        stream = bench_client.Stream(endpoint(port, model, name="no-such-model"), None)
        refused = await stream.send()
        kept = stream.writer
        stream.endpoint = endpoint(port, model)
        served = await stream.send()
        same = kept is not None and stream.writer is kept
        await stream.close()
        return refused.cause, served.ok, same

    with serving(str(model)) as (port, _):
        assert asyncio.run(refused_then_served(port)) == ("http 404", True, True)
