"""`kit bench` against a vLLM stand-in process on loopback (no Docker, no nginx): a stand-in for
bench_run.BenchDoor that sizes prompts by the stand-in's own token rule and reads the stand-in's
/metrics, and the count of chat completions the stand-in received (http_requests_total, which
counts every request it dispatched, whatever its answer)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

from kit.bench.client import Endpoint, Load, StepRecord, run_step
from kit.bench.run import parse_gauges, prompt_text
from tests.support.standin_process import serving

# the stand-in's chat template around one user message: <s> <|start|> user <|sep|> … <|end|>
# <|start|> assistant <|sep|>, plus the request number kit puts in front of the prompt
CHAT_OVERHEAD_TOKENS = 9


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def chat_requests_received(port: int) -> int:
    """Chat completions the stand-in received, by its http_requests_total."""
    pattern = re.compile(r'^http_requests_total\{handler="/v1/chat/completions",[^}]*\} (\S+)$')
    return int(sum(float(m.group(1)) for line in metrics_text(port).splitlines()
                   if (m := pattern.match(line))))


def local_door(port: int, model: Path, timeout_s: float = 60) -> type:
    """A BenchDoor class (bench_run builds it from the site and service) aimed at the stand-in
    on `port` serving `model`."""

    class LocalDoor:
        def __init__(self, site, service) -> None:
            self.service = service

        def sized_prompt(self, tokens: int) -> str:
            return prompt_text(max(1, tokens - CHAT_OVERHEAD_TOKENS))

        def endpoint(self, prompt: str, output_tokens: int) -> Endpoint:
            return Endpoint(address="127.0.0.1", port=port, host=f"127.0.0.1:{port}", tls=False,
                            ca_file=None, authorization=None, model=str(model), prompt=prompt,
                            output_tokens=output_tokens, timeout_s=timeout_s)

        def server_gauges(self) -> dict[str, float]:
            return parse_gauges(metrics_text(port))

    return LocalDoor


def stale_connection_run(model: Path, streams: int, requests: int, *, keep_alive_s: float,
                         tokens: int, interval_ms: float) -> tuple[StepRecord, int]:
    """`streams` spread over one warm-up (`tokens` × `interval_ms`) against a stand-in that
    closes connections idle for `keep_alive_s`: the step's record and the chat requests the
    stand-in received (the client sent `streams` warm-ups + `requests`)."""
    # no access log: nobody reads the stand-in's output pipe, which would fill and stop it
    with serving(str(model), "--disable-uvicorn-access-log",
                 STANDIN_TOKEN_INTERVAL_MS=f"{interval_ms:g}",
                 VLLM_HTTP_TIMEOUT_KEEP_ALIVE=f"{keep_alive_s:g}") as (port, _):
        endpoint = Endpoint(address="127.0.0.1", port=port, host=f"127.0.0.1:{port}", tls=False,
                            ca_file=None, authorization=None, model=str(model),
                            prompt="hello " * 40, output_tokens=tokens)
        record = asyncio.run(run_step(endpoint, Load("spread", streams), requests))
        return record, chat_requests_received(port)
