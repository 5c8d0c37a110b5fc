"""The stand-in's costs calibrated on a real vLLM 0.20 on an H100 (issue 43;
tests/standin/vllm_standin/calibration.py and engine.py): the API server's CPU per streamed chunk
and more per chunk carrying usage (charged in virtual time; its processes:
test_calibration_api_servers.py), an engine step that lasts longer with every running sequence
and every prompt token it computes, vLLM's --long-prefill-token-threshold, and
`STANDIN_CALIBRATION=h100` setting the knobs' defaults (opt-in). Priority ordering without
preemption, also under chunked prefill: test_engine_priority.py."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import pytest

from tests.support.standin_process import LLAMA_8B, STANDIN, model_dir, run_standin, serving

sys.path.insert(0, str(STANDIN))
from vllm_standin import calibration  # noqa: E402
from vllm_standin.engine import Engine, Request  # noqa: E402

CHUNK_US, USAGE_US = 2000, 1000
COUNTER = re.compile(rb'^standin_api_server_cpu_seconds_total\{process="0"\} (\S+)$',
                     re.MULTILINE)


def stream(port: int, model: str, tokens: int, options: dict | None) -> bytes:
    body = {"model": model, "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hello"}]}
    if options is not None:
        body["stream_options"] = options
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    payload = conn.getresponse().read()
    conn.close()
    return payload


def charged(port: int) -> float | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    found = COUNTER.search(conn.getresponse().read())
    conn.close()
    return float(found.group(1)) if found else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(("options", "usage_chunks"), [
    (None, 0),  # no usage asked: the role chunk and 10 token chunks
    ({"include_usage": True}, 1),  # the last usage chunk only
    ({"include_usage": True, "continuous_usage_stats": True}, 12),  # usage on every chunk
])
def test_each_streamed_chunk_costs_the_api_server_cpu_and_usage_costs_more(
        tmp_path: Path, options: dict | None, usage_chunks: int) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    with serving(str(model), "--disable-uvicorn-access-log",
                 STANDIN_CHUNK_CPU_US=str(CHUNK_US), STANDIN_USAGE_CHUNK_CPU_US=str(USAGE_US),
                 STANDIN_TOKEN_INTERVAL_MS="1", STANDIN_API_SERVER_MERGE="0") as (port, proc):
        before, cpu = charged(port), cpu_seconds(proc.pid)
        requests = 10
        began = time.monotonic()
        for _ in range(requests):
            payload = stream(port, str(model), 10, options)
            assert payload.count(b"data: ") == 11 + (usage_chunks > 0) + 1  # ... [DONE]
        wall = time.monotonic() - began
        spent = charged(port) - before
        cpu = cpu_seconds(proc.pid) - cpu
    chunks = 11 + (usage_chunks > 0)
    assert spent == pytest.approx(requests * (chunks * CHUNK_US + usage_chunks * USAGE_US) / 1e6)
    # virtual time: the streams took at least the CPU charged (a core of its own, issue 43's
    # API-server processes), which the stand-in's own process did not burn
    assert wall >= spent
    assert cpu < 0.5 * spent, (cpu, spent)


def test_without_the_knobs_a_chunk_costs_nothing_extra(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    with serving(str(model), "--disable-uvicorn-access-log") as (port, _):
        stream(port, str(model), 4, {"include_usage": True, "continuous_usage_stats": True})
        assert charged(port) is None


def token_times(engine: Engine, requests: list[tuple[int, int]], until: int = 0
                ) -> list[list[float]]:
    """Each request's token times: (prompt tokens, max tokens) added at once; ran until the
    `until`-th request has all its tokens."""
    times: list[list[float]] = [[] for _ in requests]

    def tracked(n: int):
        def on_token(index: int, text: str, last: bool) -> None:
            times[n].append(time.monotonic())
        return on_token

    async def run() -> None:
        for n, (prompt, tokens) in enumerate(requests):
            engine.add(Request(prompt, tokens, tracked(n)))
        while len(times[until]) < requests[until][1]:
            await asyncio.sleep(0.001)
        engine.stop()

    asyncio.run(run())
    return times


def budget_engine(**options: float) -> Engine:
    return Engine(model_name="m", interval_s=0.005, max_num_seqs=64, kv_tokens=None,
                  block_size=16, cache_info={}, prefill_budget=options.pop("budget", 4096),
                  **options)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_a_step_lasts_longer_with_every_running_sequence() -> None:
    """5 ms + 2 ms per running sequence: one request alone steps every 7 ms, one of 16 every
    37 ms."""
    alone = gaps(token_times(budget_engine(per_seq_s=0.002), [(1, 12)])[0])
    crowd = gaps(token_times(budget_engine(per_seq_s=0.002), [(1, 12)] * 16)[0])
    assert 0.0065 <= statistics.median(alone) < 0.02, alone
    assert 0.036 <= statistics.median(crowd) < 0.06, crowd


def test_a_step_lasts_longer_with_every_prompt_token_it_computes() -> None:
    """Chunked prefill under a budget of 64 tokens a step at 0.5 ms a prompt token: a decoding
    request's steps last 5 + 63 x 0.5 ms while a 300-token prompt is computed beside it (chunks
    of 63, 63, 63, 63, 48), then 5 ms again; the long prompt's first token comes after its last
    chunk."""
    engine = budget_engine(budget=64, prefill_s_per_token=0.0005)
    decoding, long_prompt = token_times(engine, [(1, 40), (300, 2)], until=0)
    slow = [gap for gap in gaps(decoding) if gap >= 0.025]
    assert len(slow) >= 4, gaps(decoding)
    assert statistics.median(gaps(decoding)[-10:]) < 0.02, gaps(decoding)
    assert long_prompt[0] - decoding[0] >= 3 * 0.03


def test_a_long_prompt_is_chunked_at_the_long_prefill_threshold() -> None:
    """vLLM's --long-prefill-token-threshold 100 under a budget of 4096: a 300-token prompt is
    computed 100 tokens a step (each step 100 x 1 ms longer), not in one step of 300; without
    the threshold, in one."""
    for threshold, chunks in ((100, [100, 100, 100, 0]), (0, [300, 0, 0, 0])):
        engine = budget_engine(prefill_s_per_token=0.001, long_prefill_tokens=threshold)
        engine.waiting.append(Request(300, 2, lambda index, text, last: None))
        extra = [engine._budget_step(time.monotonic()) for _ in chunks]
        assert extra == pytest.approx([tokens * 0.001 for tokens in chunks])


def test_the_h100_calibration_sets_the_knobs_unless_the_environment_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STANDIN_TOKEN_INTERVAL_MS", raising=False)
    monkeypatch.delenv(calibration.CALIBRATION_ENV, raising=False)
    assert calibration.setting("STANDIN_CHUNK_CPU_US") is None  # off by default
    monkeypatch.setenv(calibration.CALIBRATION_ENV, "h100")
    assert calibration.setting_float("STANDIN_TOKEN_INTERVAL_MS", 20) == 6
    assert calibration.ApiServers.from_environment(1).usage_s == pytest.approx(17e-6)
    monkeypatch.setenv("STANDIN_TOKEN_INTERVAL_MS", "9")
    assert calibration.setting_float("STANDIN_TOKEN_INTERVAL_MS", 20) == 9


def test_an_unknown_calibration_is_refused_before_anything_starts(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    result = run_standin("serve", str(model), STANDIN_CALIBRATION="a100")
    assert result.returncode == 2
    assert "STANDIN_CALIBRATION='a100' is not a calibration the stand-in knows (one of: h100)" \
        in result.stderr
