"""Concurrent streams spending one credential's token budget (docs/policy.md), and what they
show: when the count crossed the budget, which requests were admitted around it, and the
tokens in flight then. A request the door refuses while the credential's requests in flight
may spend what is left (429 `RateLimitError`, Retry-After 1: their reservations) is sent again
a moment later; the budget spent (429 `insufficient_quota`) ends a stream."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import openai

from tests.support.live_stack import SERVED_NAME, LiveSite

IN_FLIGHT = "RateLimitError"  # the door's refusal while requests in flight hold the rest
RETRY_PAUSE_S = 0.05


@dataclass
class Attempt:
    start: float  # monotonic
    end: float
    status: int
    tokens: int = 0  # prompt + completion, as the engine counted them (the stream's usage)
    error_type: str = ""
    retry_after: str = ""

    @property
    def final(self) -> bool:
        """A refusal that ends the stream (not one sent again)."""
        return self.status != 200 and self.error_type != IN_FLIGHT


def spend_until_refused(site: LiveSite, key: str, streams: int,
                        max_tokens: int) -> list[Attempt]:
    """`streams` threads, each streaming completions back to back until the door refuses one."""
    attempts: list[Attempt] = []
    lock = threading.Lock()

    def stream() -> None:
        client = site.openai(key)
        while True:
            start = time.monotonic()
            try:
                chunks = client.chat.completions.create(
                    model=SERVED_NAME, max_tokens=max_tokens, stream=True,
                    stream_options={"include_usage": True},
                    messages=[{"role": "user", "content": "Count to ten."}])
                usage = [chunk.usage for chunk in chunks if chunk.usage][-1]
                attempt = Attempt(start, time.monotonic(), 200, usage.total_tokens)
            except openai.APIStatusError as error:
                body = error.body if isinstance(error.body, dict) else {}
                attempt = Attempt(start, time.monotonic(), error.status_code,
                                  error_type=str(body.get("type", "")),
                                  retry_after=error.response.headers.get("retry-after", ""))
            with lock:
                attempts.append(attempt)
            if attempt.final:
                return
            if attempt.status != 200:
                time.sleep(RETRY_PAUSE_S)

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return attempts


@dataclass
class Crossing:
    """The admitted request whose tokens took the count past the budget (by end time)."""

    at: float  # when it ended: the door counts it as it logs it
    admitted_after: list[Attempt]  # admitted though they started after it ended
    refused_before: list[Attempt]  # refused for good though they started before it ended
    in_flight_tokens: int  # the tokens of the requests running when it ended


def crossing(attempts: list[Attempt], budget: int, slack_s: float) -> Crossing:
    """`slack_s`: the moment between a stream's last byte and the door's log phase."""
    admitted = sorted((a for a in attempts if a.status == 200), key=lambda a: a.end)
    spent = 0
    for attempt in admitted:
        spent += attempt.tokens
        if spent >= budget:
            at = attempt.end
            break
    else:
        raise AssertionError(f"the admitted requests spent {spent} of {budget}")
    return Crossing(
        at,
        [a for a in admitted if a.start > at + slack_s],
        [a for a in attempts if a.final and a.start < at - slack_s],
        sum(a.tokens for a in admitted if a.start < at < a.end),
    )
