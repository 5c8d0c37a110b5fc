"""The stand-in's `--api-server-count N` (issue 43): N API-server processes sharing the port, each
a core of its own in virtual time (tests/standin/vllm_standin/calibration.py, ApiServers), one
engine behind them; a new connection goes to the least loaded process; a process busy more than
100 % sends its streams' chunks late (merged, as vLLM's output collector merges them, unless
STANDIN_API_SERVER_MERGE=0) and begins new requests only when it has nothing left to send; the
flag's bounds as vLLM's serve command has them."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.docker_engine import pick_free_port
from tests.support.standin_process import (
    LLAMA_8B,
    STANDIN,
    model_dir,
    run_standin,
    serving,
    standin_env,
)

sys.path.insert(0, str(STANDIN))
from vllm_standin.calibration import ApiServers  # noqa: E402

BUSY = re.compile(rb'^standin_api_server_cpu_seconds_total\{process="(\d+)"\} (\S+)$',
                  re.MULTILINE)
MERGED = re.compile(rb'^standin_api_server_merged_tokens_total\{process="(\d+)"\} (\S+)$',
                    re.MULTILINE)


def stream(port: int, model: str, tokens: int) -> list[dict]:
    """A streamed chat asking usage on every chunk: its chunks (JSON), [DONE] left out."""
    body = {"model": model, "stream": True, "max_tokens": tokens,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "messages": [{"role": "user", "content": "hello"}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    payload = conn.getresponse().read().decode()
    conn.close()
    assert payload.endswith("data: [DONE]\n\n")
    return [json.loads(event.removeprefix("data: ")) for event in payload.split("\n\n")
            if event.startswith("data: {")]


def metrics(port: int, pattern: re.Pattern[bytes]) -> dict[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read()
    conn.close()
    return {int(process): float(value) for process, value in pattern.findall(text)}


def concurrent_streams(port: int, model: str, count: int, tokens: int
                       ) -> tuple[list[list[dict]], float]:
    """`count` streams at once, each on a connection of its own; their chunks and the wall
    time until the last ended."""
    results: list[list[dict]] = [[] for _ in range(count)]

    def one(index: int) -> None:
        results[index] = stream(port, model, tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.monotonic() - began


def content_chunks(chunks: list[dict]) -> list[dict]:
    return [c for c in chunks if c["choices"] and "role" not in c["choices"][0]["delta"]]


@pytest.mark.serial
@pytest.mark.parametrize(("count", "saturated"), [(1, True), (4, False)])
def test_the_chunks_cpu_is_spread_over_the_api_server_processes(
        tmp_path: Path, count: int, saturated: bool) -> None:
    """8 streams at once, a token every 5 ms each, 1 ms of API-server CPU a chunk: 8 ms of work
    every 5 ms. One process is saturated (busy ~100 % of the run, its streams late, every
    token still in a chunk of its own with STANDIN_API_SERVER_MERGE=0); four share it, 2 ms
    each every 5 ms (~40 %; a process that took 3 of the 8 connections ~60 %: which takes which
    depends on when each arrives), none saturated, and the streams keep the engine's pace."""
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    with serving(str(model), "--disable-uvicorn-access-log", "--api-server-count", str(count),
                 STANDIN_CHUNK_CPU_US="1000", STANDIN_TOKEN_INTERVAL_MS="5",
                 STANDIN_API_SERVER_MERGE="0") as (port, _):
        before = metrics(port, BUSY)
        results, wall = concurrent_streams(port, str(model), 8, 60)
        after = metrics(port, BUSY)
    assert sorted(before) == list(range(count))  # a series per process
    busy = [(after[p] - before.get(p, 0.0)) / wall for p in range(count)]
    for chunks in results:
        assert len(content_chunks(chunks)) == 60  # one token a chunk: nothing merged
        assert chunks[-1]["usage"]["completion_tokens"] == 60
    charged = sum(after.values()) - sum(before.values())
    assert charged == pytest.approx(8 * 62 / 1000, rel=0.05)  # role + 60 tokens + usage chunk
    if saturated:
        assert min(busy) > 0.75, busy
        assert wall > 8 * 62 / 1000  # the process, not the engine (60 x 5 ms), set the pace
    else:
        assert max(busy) < 0.75, busy
        assert wall < 8 * 62 / 1000  # sooner than one process could have sent it all


def test_a_lagging_process_merges_a_streams_tokens_into_its_waiting_chunk(
        tmp_path: Path) -> None:
    """One process, 3 ms a chunk, 8 streams of a token every 2 ms: it lags, and the tokens a
    stream gets while its chunk waits join that chunk (vLLM's output collector); the usage in
    each chunk counts every token so far, the text holds every token once, the last chunk the
    finish. With four processes the same streams lag less and merge less."""
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    merged: dict[int, float] = {}
    for count in (1, 4):
        with serving(str(model), "--disable-uvicorn-access-log", "--api-server-count",
                     str(count), STANDIN_CHUNK_CPU_US="3000",
                     STANDIN_TOKEN_INTERVAL_MS="2") as (port, _):
            results, _ = concurrent_streams(port, str(model), 8, 40)
            merged[count] = sum(metrics(port, MERGED).values())
        for chunks in results:
            content = content_chunks(chunks)
            counts = [c["usage"]["completion_tokens"] for c in content]
            assert counts == sorted(set(counts)) and counts[-1] == 40
            assert content[-1]["choices"][0]["finish_reason"] == "length"
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
            if count == 1:
                assert len(content) < 40  # tokens merged: fewer chunks than tokens
    assert merged[1] > 8 * 40 / 2  # most of the tokens rode in another's chunk
    assert merged[4] < merged[1]


def test_new_connections_go_to_the_least_loaded_process() -> None:
    """Idle processes take connections in turn (fewest connections first); a busy process
    (its clock ahead of now) is passed over for an idle one, whatever their counts."""
    servers = ApiServers(3, chunk_s=0.001)
    assert [servers.assign().index for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    servers.processes[0].free_at = time.monotonic() + 10  # busy for 10 s, 2 connections
    servers.processes[1].connections += 5  # 7
    assert [servers.assign().index for _ in range(2)] == [2, 2]  # 3, 4: 0 is busy
    servers.processes[0].free_at = 0.0  # idle again: it has the fewest
    assert servers.assign().index == 0


def test_a_process_does_its_work_in_order_when_its_clock_gets_there() -> None:
    """Work is done in the order it came, no sooner than its CPU is spent (chunks of 20 ms
    each leave 20 ms apart); a request read waits until the process has nothing left to send,
    even when it came before the last chunks."""
    servers = ApiServers(1, request_s=0.001, chunk_s=0.02)
    process = servers.processes[0]
    done: list[tuple[str, float]] = []

    async def run() -> None:
        began = time.monotonic()

        def mark(name: str):
            return lambda: done.append((name, time.monotonic() - began))

        process.run(0.02, mark("chunk 1"))
        process.run(0.02, mark("chunk 2"))
        process.read(0.001, mark("request"))
        process.run(0.02, mark("chunk 3"))
        while len(done) < 4:
            await asyncio.sleep(0.005)

    asyncio.run(run())
    assert [name for name, _ in done] == ["chunk 1", "chunk 2", "chunk 3", "request"]
    times = [at for _, at in done]
    assert times[0] >= 0.019 and times[1] >= 0.039 and times[2] >= 0.059 and times[3] >= 0.06
    assert process.busy_s == pytest.approx(0.061)


def test_without_costs_nothing_waits() -> None:
    """The default (no calibration): no process is charged, work runs at once."""
    servers = ApiServers(4)
    assert not servers.active
    done: list[int] = []
    servers.processes[0].run(0.0, lambda: done.append(1))
    assert done == [1]


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--api-server-count", "two"], 2,
     "argument --api-server-count/-asc: invalid int value: 'two'"),
    (["--api-server-count", "1.5"], 2,
     "argument --api-server-count/-asc: invalid int value: '1.5'"),
    (["--headless", "--api-server-count", "2"], 1,
     "ValueError: --api-server-count=2 cannot be used with --headless (no API servers are "
     "started in headless mode)."),
])
def test_the_flag_is_refused_as_vllm_refuses_it(tmp_path: Path, args: list[str], code: int,
                                                text: str) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    result = run_standin("serve", str(model), *args)
    assert result.returncode == code, result.stderr
    assert text in result.stderr


def test_runtime_lora_updates_are_refused_with_more_than_one_api_server(tmp_path: Path) -> None:
    """vLLM's run_multi_api_server: an adapter loaded at runtime would be known to one process
    only, so VLLM_ALLOW_RUNTIME_LORA_UPDATING with --api-server-count > 1 ends the start-up;
    with one process it serves."""
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    result = run_standin("serve", str(model), "--enable-lora", "--api-server-count", "2",
                         VLLM_ALLOW_RUNTIME_LORA_UPDATING="1")
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith(
        "ValueError: VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with api_server_count > 1")
    with serving(str(model), "--enable-lora", "--api-server-count", "1",
                 VLLM_ALLOW_RUNTIME_LORA_UPDATING="1") as (port, _):
        assert metrics(port, BUSY) == {}  # serving (uncalibrated: nothing charged)


@pytest.mark.parametrize("count", ["0", "-1"])
def test_a_count_below_one_runs_the_engine_headless(tmp_path: Path, count: str) -> None:
    """vLLM's serve: `--api-server-count` below 1 runs run_headless: the engine, no API
    server, so the port is never opened."""
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    port = pick_free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN / "vllm"), "serve", str(model), "--port", str(port),
         "--api-server-count", count], env=standin_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.stdout is not None:
            line = proc.stdout.readline()
            lines.append(line)
            if "Running headless" in line or not line:
                break
        assert any("no API server" in line for line in lines), lines
        with pytest.raises(OSError):
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
        assert proc.poll() is None  # it runs on, until stopped
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
