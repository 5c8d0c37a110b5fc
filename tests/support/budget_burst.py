"""Many concurrent streams of one credential with a token budget through the real door
(tests/support/door_ns.py), until the door says the budget is spent (docs/policy.md): how far
the tokens the engine counted passed the budget, and how many requests were admitted.

Each stream sends streamed chat completions one after another; a request the door refuses
while the credential's requests in flight may spend what is left (429 `RateLimitError`) is
sent again a moment later, as a client honouring the short Retry-After would; a 429
`insufficient_quota` (the budget is spent) ends the stream."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.support.door_ns import Door
from tests.support.door_sequential import usage_tokens
from tests.support.raw_http import parse_reply
from tests.support.raw_http import request as raw_request

RETRY_PAUSE_S = 0.05  # a refused-in-flight request is sent again after this


def stream_body(model: str, max_tokens: int) -> bytes:
    """The request every stream sends (its bytes: the door's estimate of its prompt)."""
    return json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "Count slowly."}]}).encode()


@dataclass
class Burst:
    budget: int
    reservation: int  # the most one request may cost, as the door reserves it
    admitted: int = 0
    tokens: int = 0  # prompt + completion of the admitted requests, as the engine counted them
    waited: int = 0  # refusals while requests in flight could spend the rest (sent again)
    others: list[str] = field(default_factory=list)  # any other answer: status and body

    @property
    def overshoot(self) -> int:
        return self.tokens - self.budget

    def describe(self) -> str:
        return (f"{self.admitted} admitted, {self.tokens} tokens for a budget of {self.budget}: "
                f"overshoot {self.overshoot} tokens (one request's reservation: "
                f"{self.reservation}); {self.waited} refused while in flight, sent again")


def spend_in_a_burst(door: Door, host: str, key: str, model: str, *, budget: int,
                     streams: int = 64, max_tokens: int = 40, timeout_s: float = 120) -> Burst:
    """`streams` threads, each streaming until the door says the budget is spent."""
    body = stream_body(model, max_tokens)
    headers = [("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")]
    request = raw_request("POST", "/v1/chat/completions", host, headers, body)
    burst = Burst(budget, len(body) + max_tokens)
    lock = threading.Lock()
    start = threading.Barrier(streams)
    deadline = time.monotonic() + timeout_s

    def stream() -> None:
        start.wait()
        while time.monotonic() < deadline:
            with door.inside():
                sock = door.connect()
            with sock:
                sock.sendall(request)
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            reply = parse_reply(data)
            kind = ""
            if reply.status == 429:
                kind = json.loads(reply.body)["error"]["type"]
            with lock:
                if reply.status == 200:
                    tokens = usage_tokens(reply)
                    assert tokens is not None, reply.body[-300:]
                    burst.admitted += 1
                    burst.tokens += tokens
                elif kind == "RateLimitError":
                    burst.waited += 1
                elif kind != "insufficient_quota":
                    burst.others.append(f"{reply.status} {reply.body[:200]!r}")
            if reply.status == 429 and kind == "RateLimitError":
                time.sleep(RETRY_PAUSE_S)
            elif reply.status != 200:
                return

    with ThreadPoolExecutor(streams) as pool:
        for running in [pool.submit(stream) for _ in range(streams)]:
            running.result(timeout=timeout_s + 30)
    return burst
