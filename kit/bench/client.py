"""The load client of `kit bench`: N concurrent streamed chat completions, timed chunk by chunk.

Stdlib only and free of kit imports on purpose: the very same file runs in kit's process against
the front door and, for `--compare-direct`, as `python3 -` inside a container on the stack's
network against one replica, so both sides of the comparison are measured by the same code.

Timing follows `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py): the clock
starts when the request is sent; TTFT ends at the first SSE message that has a choice; each later
message adds the gap since the previous one to ITL; latency ends at the last data message; the
output token count is the `usage.completion_tokens` the server reports. One asyncio loop carries
every stream, and a watchdog task measures how late the loop wakes up (p90 and max): when it
lags, timestamps are late by as much, so the step is flagged instead of reported as the server's
latency.

Three arrival processes (`Load.arrival`), each as another tool defines it so their figures can
be compared: `spread` (closed loop, the streams' starts spread over one request's duration: the
steady state of N users), `lockstep` (closed loop, every stream starts at once: `vllm bench serve
--max-concurrency N` with its default infinite rate, whose streams stay in step and collide in
prefill) and `poisson` (open loop: requests arrive at `rate` per second with exponential gaps,
`vllm bench serve --request-rate R --burstiness 1`, however many are already in flight).

Three workloads (`Endpoint.workload`, docs/benchmarks.md), what a prefix cache and the router
in front of it can or cannot use: `random` (every prompt its own, led by its request's number:
no shared prefix), `shared-prefix` (one system prompt of `system_words` words shared by every
request, then a question of `turn_words` words of its own: agents, RAG) and `multiturn` (each
stream is one user at a time: a conversation of `turns` turns on the shared system prompt, each
turn re-sending the conversation so far with the answers it got, then the next user; a
`hot_share` of the users start their conversation alike, a hot prefix).

Servers close keep-alive connections that stay idle (uvicorn, so vLLM: after 5 s). A request
written just as the server closes is never read, and the connection ends without an answer. So a
connection idle for more than IDLE_REUSE_S is replaced before sending, and a request whose
reused connection ended before one byte of an answer is written once more on a fresh connection
(it never started, so nothing is sent twice); anything answered is never re-sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

NUMBERS = itertools.count(1)
LAG_TICK_S = 0.005  # the watchdog's sleep: how often the loop's punctuality is sampled
IDLE_REUSE_S = 2.0  # an idle connection older than this is replaced (uvicorn closes at 5 s)
ARRIVALS = ("spread", "lockstep", "poisson")
WORKLOADS = ("random", "shared-prefix", "multiturn")
USERS = itertools.count(1)


@dataclass(frozen=True)
class Endpoint:
    """Where to send, how to trust it and what to ask (plain values: it crosses into a container
    as JSON)."""

    address: str  # connect here
    port: int
    host: str  # Host header, and SNI + certificate name with TLS
    tls: bool
    ca_file: str | None
    authorization: str | None
    model: str
    prompt: str
    output_tokens: int
    timeout_s: float = 300.0
    workload: str = "random"  # WORKLOADS
    system_words: int = 2000  # shared-prefix, multiturn: the shared system prompt
    turn_words: int = 50  # shared-prefix, multiturn: each question
    turns: int = 8  # multiturn: a user's turns
    hot_share: float = 0.0  # multiturn: the share of users whose first question is the same


@dataclass(frozen=True)
class Load:
    """How requests arrive: `concurrency` streams in a closed loop (spread or lockstep), or
    `rate` requests per second in an open loop (poisson, `seed` fixes its gaps)."""

    arrival: str
    concurrency: int = 0
    rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival {self.arrival!r}: one of {', '.join(ARRIVALS)}")
        if (self.arrival == "poisson") != (self.rate is not None):
            raise ValueError("a request rate is for, and needed by, the poisson arrival")
        if self.rate is None and self.concurrency < 1:
            raise ValueError("a closed loop needs at least one stream")


@dataclass
class Outcome:
    """One request as the client saw it; `cause` is empty when it succeeded."""

    cause: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    resent: bool = False  # written again on a fresh connection: the first was never answered

    @property
    def ok(self) -> bool:
        return not self.cause


@dataclass
class StepRecord:
    """Everything one step measured: the requests after the warm-up, the wall time they took
    and how late the client's event loop ran meanwhile. `concurrency` is the number of streams
    (closed loop) or the most requests in flight at once (poisson)."""

    concurrency: int
    outcomes: list[Outcome]
    duration_s: float
    lag_p90_ms: float
    lag_max_ms: float
    arrival: str = "spread"
    request_rate: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StepRecord:
        return cls(**{**data, "outcomes": [Outcome(**o) for o in data["outcomes"]]})


class RequestFailed(Exception):
    """A request ended without a whole stream; the message is its cause, as counted."""


class RequestRefused(RequestFailed):
    """An answer other than 200, read whole on a connection the server keeps open: the next
    request goes on it (a client retrying a 429 does not pay a new TLS handshake each time)."""


def numbered(number: int, prompt: str) -> str:
    """Each request's prompt starts with its own number: a prefix cache cannot serve one
    request's prefill from another's."""
    return f"{number} {prompt}"


def words(seed: str, count: int) -> str:
    """`count` words of plain text, the same for the same seed."""
    pick = random.Random(seed)
    return " ".join(pick.choice(TEXT_WORDS) for _ in range(count))


TEXT_WORDS = ("the", "model", "answers", "a", "question", "about", "data", "which", "kept",
              "in", "cache", "for", "every", "user", "turn", "of", "long", "prompt", "system",
              "tool", "call", "reads", "document", "shared", "by", "many", "agents", "and")


class Conversation:
    """What a stream sends next under its endpoint's workload; a multiturn user's messages grow
    with each answer (`answered`) and start again as a new user after `turns` turns."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.system = words("system", endpoint.system_words)
        self.messages: list[dict] = []
        self.turn = 0

    def next_messages(self, number: int) -> list[dict]:
        e = self.endpoint
        if e.workload == "random":
            return [{"role": "user", "content": numbered(number, e.prompt)}]
        system = {"role": "system", "content": self.system}
        if e.workload == "shared-prefix":
            return [system, {"role": "user", "content": words(f"q{number}", e.turn_words)}]
        if not self.messages or self.turn >= e.turns:
            user = next(USERS)
            hot = random.Random(user).random() < e.hot_share
            first = words("hot" if hot else f"user{user}", e.turn_words)
            self.messages, self.turn = [system, {"role": "user", "content": first}], 0
        else:
            self.messages.append({"role": "user", "content": words(f"t{number}", e.turn_words)})
        self.turn += 1
        return self.messages

    def answered(self, text: str) -> None:
        if self.endpoint.workload == "multiturn":
            self.messages.append({"role": "assistant", "content": text})


def request_body(endpoint: Endpoint, messages: list[dict]) -> bytes:
    return json.dumps({
        "model": endpoint.model,
        "messages": messages,
        "max_tokens": endpoint.output_tokens,
        "ignore_eos": True,  # vLLM: exactly max_tokens, as `vllm bench serve` asks
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()


class Stream:
    """One keep-alive connection that sends requests one after the other."""

    def __init__(self, endpoint: Endpoint, context: ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self.context = context
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.idle_since = 0.0  # when the connection last finished an answer (or opened)
        headers = ["POST /v1/chat/completions HTTP/1.1", f"Host: {endpoint.host}",
                   "User-Agent: kit-bench", "Content-Type: application/json",
                   "Accept: text/event-stream"]
        if endpoint.authorization:
            headers.append(f"Authorization: {endpoint.authorization}")
        self.head = "\r\n".join(headers)
        self.conversation = Conversation(endpoint)

    def request(self) -> bytes:
        body = request_body(self.endpoint, self.conversation.next_messages(next(NUMBERS)))
        return f"{self.head}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None

    async def send(self) -> Outcome:
        """One request; network trouble and bad answers become the Outcome's cause."""
        try:
            return await asyncio.wait_for(self._exchange(), self.endpoint.timeout_s)
        except TimeoutError:
            cause = f"timeout after {self.endpoint.timeout_s:g} s"
        except RequestRefused as refusal:
            self.idle_since = time.perf_counter()
            return Outcome(cause=str(refusal))
        except RequestFailed as failure:
            cause = str(failure)
        except ssl.SSLError as error:
            cause = f"tls: {error.reason or error}"
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as error:
            cause = f"connection: {type(error).__name__}"
        await self.close()
        return Outcome(cause=cause)

    async def _open(self) -> None:
        e = self.endpoint
        self.reader, self.writer = await asyncio.open_connection(
            e.address, e.port, ssl=self.context, server_hostname=e.host if self.context else None,
        )
        self.idle_since = time.perf_counter()

    async def _status_line(self, data: bytes) -> bytes:
        """The request written, the answer's first line read; b"" when the connection ended
        before a byte of it (a reset while writing or waiting counts the same)."""
        assert self.writer is not None and self.reader is not None  # _exchange opened it
        try:
            self.writer.write(data)
            return await self.reader.readline()
        except (ConnectionResetError, BrokenPipeError):
            return b""

    async def _exchange(self) -> Outcome:
        if self.writer is not None and time.perf_counter() - self.idle_since > IDLE_REUSE_S:
            await self.close()  # the server may be closing it at this very moment
        reused = self.writer is not None
        if not reused:
            await self._open()
        data = self.request()
        started = time.perf_counter()
        status_line = await self._status_line(data)
        resent = not status_line and reused
        if resent:  # closed under the request, unanswered: it never reached the server's app
            await self.close()
            await self._open()
            started = time.perf_counter()
            status_line = await self._status_line(data)
        reader = self.reader
        assert reader is not None  # opened above, and _status_line does not close it
        if not status_line:
            raise RequestFailed("connection: closed before an answer")
        status = int(status_line.split()[1])
        headers = await _headers(reader)
        if status != 200:
            await _body(reader, headers)  # read it so the connection stays usable
            if headers.get("connection", "").lower() == "close":
                await self.close()
            raise RequestRefused(f"http {status}")
        outcome = Outcome(resent=resent)
        answer = []
        last = started
        done = False
        pending = b""
        async for data in _body_chunks(reader, headers):
            pending += data
            *events, pending = pending.split(b"\n\n")
            for event in events:
                message = event.strip().removeprefix(b"data: ")
                if not message:
                    continue
                if message == b"[DONE]":
                    done = True
                    continue
                now = time.perf_counter()
                if has_choice(message):
                    if self.endpoint.workload == "multiturn":  # the next turn re-sends it
                        answer.append(content_of(message))
                    if outcome.ttft == 0.0:
                        outcome.ttft = now - started
                    else:
                        outcome.itl.append(now - last)
                elif usage := json.loads(message).get("usage"):
                    outcome.output_tokens = usage.get("completion_tokens") or 0
                    outcome.prompt_tokens = usage.get("prompt_tokens") or 0
                last = now
        self.idle_since = time.perf_counter()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        if not done:
            raise RequestFailed("stream ended without [DONE]")
        if outcome.output_tokens != self.endpoint.output_tokens:
            raise RequestFailed("fewer tokens than asked" if outcome.output_tokens else
                                "no usage in the stream")
        outcome.latency = last - started
        self.conversation.answered("".join(answer))
        return outcome


def has_choice(message: bytes) -> bool:
    """Whether an SSE message carries a choice. vLLM writes compact JSON, so a content chunk is
    recognised without parsing it (at 500 streams parsing every chunk made the client late);
    anything else is parsed."""
    if b'"choices":[{' in message:
        return True
    if b'"choices":[]' in message:
        return False
    return bool(json.loads(message).get("choices"))


def content_of(message: bytes) -> str:
    """A content chunk's text (parsed: only a multiturn stream keeps its answers)."""
    choice = json.loads(message)["choices"][0]
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The body as it arrives: chunked transfer decoded, or up to Content-Length."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()  # the empty trailer
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        yield await reader.readexactly(int(headers.get("content-length", "0")))


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    return b"".join([part async for part in _body_chunks(reader, headers)])


class LagWatch:
    """How late the event loop wakes a task that asked to sleep LAG_TICK_S."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_TICK_S)
            self.lags.append(loop.time() - asked - LAG_TICK_S)

    def start(self) -> None:
        self.lags.clear()
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> tuple[float, float]:
        """p90 and max lag in ms since start: a loop that is behind one wake-up in ten cannot
        keep up; a rarer late wake-up is the OS scheduling another process (seen as the max)."""
        if self._task is not None:
            self._task.cancel()
        if not self.lags:
            return 0.0, 0.0
        ordered = sorted(self.lags)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return round(max(0.0, p90) * 1000, 2), round(max(0.0, ordered[-1]) * 1000, 2)


def tls_context(endpoint: Endpoint) -> ssl.SSLContext | None:
    if not endpoint.tls:
        return None
    context = ssl.create_default_context(cafile=endpoint.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def run_step(
    endpoint: Endpoint,
    load: Load,
    requests: int,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> StepRecord:
    """`requests` counted requests arriving as `load` says, after an uncounted warm-up (one
    request per stream, all at once, which also opens the connections; one request for
    poisson)."""
    context = tls_context(endpoint)
    outcomes: list[Outcome] = []
    watch = LagWatch()

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    streams = [Stream(endpoint, context) for _ in range(max(load.concurrency, 1))]
    try:
        warming = time.perf_counter()
        await asyncio.gather(*(stream.send() for stream in streams))
        warm_up = time.perf_counter() - warming
        watch.start()
        started = time.perf_counter()
        if load.arrival == "poisson":
            peak = await _open_loop(streams, load, requests, done)
        else:
            # spread: stream i starts counting i/N of a warm-up's duration later, so the streams
            # overlap as on a busy server; lockstep: all at once, as vllm bench serve starts them
            spread = warm_up / len(streams) if load.arrival == "spread" else 0.0
            await _closed_loop(streams, spread, requests, done)
            peak = len(streams)
        duration = time.perf_counter() - started
        lag_p90, lag_max = watch.stop()
    finally:
        watch.stop()
        for stream in streams:
            await stream.close()
    return StepRecord(peak, outcomes, duration, lag_p90, lag_max, load.arrival, load.rate)


async def _closed_loop(streams: list[Stream], spread: float, requests: int,
                       done: Callable[[Outcome], None]) -> None:
    """Each stream sends its next request as soon as its previous one ended."""
    left = requests

    async def drive(stream: Stream, delay: float) -> None:
        nonlocal left
        await asyncio.sleep(delay)
        while left > 0:
            left -= 1
            done(await stream.send())

    await asyncio.gather(*(drive(stream, i * spread) for i, stream in enumerate(streams)))


async def _open_loop(streams: list[Stream], load: Load, requests: int,
                     done: Callable[[Outcome], None]) -> int:
    """Requests at exponential gaps of mean 1/rate (vLLM's gamma with shape 1), each on an idle
    connection or a new one; returns the most in flight at once. `streams` holds the warm-up's
    connection and collects every one opened, so the caller closes them all."""
    rate = load.rate
    assert rate is not None  # Load: the poisson arrival has a rate
    gaps = random.Random(load.seed)
    idle = list(streams)
    in_flight = peak = 0

    async def one(stream: Stream) -> None:
        nonlocal in_flight
        outcome = await stream.send()
        in_flight -= 1
        done(outcome)
        idle.append(stream)

    tasks = []
    clock = time.perf_counter()
    due = clock
    for _ in range(requests):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if idle:
            stream = idle.pop()  # the one that finished last: the least likely to be stale
        else:
            stream = Stream(streams[0].endpoint, streams[0].context)
            streams.append(stream)
        in_flight += 1
        peak = max(peak, in_flight)
        tasks.append(asyncio.create_task(one(stream)))
        due += gaps.expovariate(rate)
    await asyncio.gather(*tasks)
    return peak


def main() -> None:
    """In a container: argv[1] is {"endpoint": {...}, "load": {...}, "requests": N}; prints
    the StepRecord as JSON."""
    job = json.loads(sys.argv[1])
    record = asyncio.run(run_step(Endpoint(**job["endpoint"]), Load(**job["load"]),
                                  job["requests"]))
    print(json.dumps(record.to_json()))


if __name__ == "__main__":
    main()
