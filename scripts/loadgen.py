#!/usr/bin/env python3
"""Concurrent streamed chat completions against one endpoint; prints one JSON line of figures.

stdlib only, so the same client runs inside a container of the stack's network (the benchmarks
aim it at nginx and straight at a vLLM service) and on the host (the e2e tests):

    python3 loadgen.py --url https://nginx:443 --host llm.example.com --ca ca.crt \
        --auth "Bearer sk-kit-…" --model llama-3.1-8b --streams 200 --tokens 64 \
        [--ramp 1.3 --requests 3]

One selector loop over non-blocking sockets, TLS done by the ssl module in C: an asyncio client
spends most of its CPU in its Python TLS layer, and on a 2-core machine the client's CPU is taken
from the server under test. Each of the --streams connections is opened (TCP + TLS handshake)
before the clock starts; then connection i sends its first request at i × ramp / streams
(--ramp 0: all at once, a burst) and each next one, on the same keep-alive connection, as soon
as the previous stream ended, or --pause seconds later (--requests per connection: the
concurrency holds). --duration stops starting new requests after that many seconds (a soak: the
--requests bound still holds). --auth may be given several times: connection i sends the
(i mod n)-th, so one run can be many distinct users.

Figures over all requests: connect p50/p99, TTFT (request written → first content chunk)
p50/p99, tokens/s (content chunks / time from the first request to the last stream's end), the
worst and p99 gap between two chunks of one stream. A request is ok when it got 200, every
requested token and `data: [DONE]`. --announce prints `streaming` to stderr once every
connection has had a first token (the tests change credentials under running streams), and
`between` once every connection has finished its first request (with --pause: the tests stop
nginx's workers in that pause).
"""

import argparse
import errno
import json
import selectors
import socket
import ssl
import statistics
import sys
import time
from collections import Counter, deque
from urllib.parse import urlsplit

READ_SIZE = 65536
DONE = b"[DONE]"
# `remaining` (bytes left of the chunk, or of the body when not chunked) in its special states:
AT_SIZE_LINE = -1  # chunked: the next bytes are a chunk-size line
COMPLETE = -2  # the whole response is in
UNTIL_CLOSE = -3  # neither chunked nor Content-Length: the body ends with the connection


class Stream:
    """One connection: handshake, then --requests streamed completions, one after the other."""

    def __init__(self, address: tuple[str, int], request: bytes, tokens: int, requests: int):
        self.next_at = 0.0  # when the next request on this connection is due (--pause)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.address = address
        self.request = request
        self.tokens = tokens
        self.left = requests  # requests not yet answered
        self.state = "connect"  # → handshake → ready → sending → head → body … → closed
        self.began = time.perf_counter()
        self.connect_s: float | None = None
        self.ok = 0
        self.failures: list[str] = []
        self.ttfts: list[float] = []
        self.gaps: list[float] = []
        self.received_tokens = 0
        self.buffer = bytearray()
        self.unsent = b""
        self.response_started()

    def response_started(self) -> None:
        """Parser state for the next response."""
        self.status: int | None = None
        self.chunked = False
        self.keep_alive = True
        self.remaining = AT_SIZE_LINE
        self.events = bytearray()  # de-chunked body not yet split into events
        self.done = False
        self.chunks = 0
        self.sent = 0.0
        self.last = 0.0

    def response_ended(self) -> None:
        if self.status == 200 and self.done and self.chunks == self.tokens:
            self.ok += 1
        elif self.status != 200:
            self.failures.append(f"status {self.status}")
        else:
            self.failures.append(f"{self.chunks} of {self.tokens} tokens, "
                                 f"[DONE] {'seen' if self.done else 'missing'}")
        self.left -= 1

    def fail(self, why: str) -> None:
        """The connection is lost: the request in flight and the ones not sent fail."""
        self.failures += [why] * self.left
        self.left = 0
        self.close()

    def close(self) -> None:
        self.state = "closed"
        self.sock.close()

    # ---- bytes in

    def received(self, data: bytes, now: float) -> None:
        self.buffer += data
        if self.state == "head":
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            del self.buffer[: end + 4]
            self.status = int(head[0].split()[1])
            fields = {k.strip().lower(): v.strip().lower()
                      for k, _, v in (line.partition(":") for line in head[1:])}
            self.chunked = fields.get("transfer-encoding") == "chunked"
            self.keep_alive = fields.get("connection") != "close"
            if not self.chunked:
                length = fields.get("content-length")
                self.remaining = int(length) if length else UNTIL_CLOSE
            self.state = "body"
        if self.chunked:
            self._dechunk()
        else:
            self._take_body()
        self._parse_events(now)

    def _take_body(self) -> None:
        if self.remaining == UNTIL_CLOSE:
            taken = len(self.buffer)
        else:
            taken = min(self.remaining, len(self.buffer))
            self.remaining -= taken
            if self.remaining == 0:
                self.remaining = COMPLETE
        self.events += self.buffer[:taken]
        del self.buffer[:taken]

    def _dechunk(self) -> None:
        buffer = self.buffer
        while buffer and self.remaining != COMPLETE:
            if self.remaining == AT_SIZE_LINE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";")[0], 16)
                if size == 0:
                    if len(buffer) < end + 4:  # the empty trailer's CRLF
                        return
                    del buffer[: end + 4]
                    self.remaining = COMPLETE
                    return
                del buffer[: end + 2]
                self.remaining = size + 2  # the data and its CRLF
            take = min(self.remaining, len(buffer))
            self.events += buffer[:take]
            del buffer[:take]
            self.remaining -= take
            if self.remaining == 0:
                del self.events[-2:]
                self.remaining = AT_SIZE_LINE

    def _parse_events(self, now: float) -> None:
        while (end := self.events.find(b"\n\n")) >= 0:
            payload = bytes(self.events[:end]).removeprefix(b"data: ")
            del self.events[: end + 2]
            if payload == DONE:
                self.done = True
            elif b'"content":"' in payload and b'"content":""' not in payload:
                if self.chunks == 0:
                    self.ttfts.append(now - self.sent)
                else:
                    self.gaps.append(now - self.last)
                self.chunks += 1
                self.received_tokens += 1
                self.last = now

    @property
    def response_complete(self) -> bool:
        return self.state == "body" and self.remaining == COMPLETE


class Run:
    """All connections of one run, driven by one selector."""

    def __init__(self, args: argparse.Namespace) -> None:
        url = urlsplit(args.url)
        host = args.host or url.hostname
        port = url.port or (443 if url.scheme == "https" else 80)
        self.context = ssl.create_default_context(cafile=args.ca) if url.scheme == "https" else None
        self.server_name = host
        addresses = [(socket.gethostbyname(name), port) for name in [url.hostname, *args.spread]]
        body = json.dumps({
            "model": args.model, "stream": True, "max_tokens": args.tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count slowly."}],
        }).encode()
        headers = [
            "POST /v1/chat/completions HTTP/1.1", f"Host: {host}",
            "Content-Type: application/json", "Accept: text/event-stream",
            f"Content-Length: {len(body)}",
        ]
        auths = [[f"Authorization: {auth}"] for auth in args.auth or []] or [[]]
        requests = [("\r\n".join(headers + auth) + "\r\n\r\n").encode() + body for auth in auths]
        self.streams = [Stream(addresses[i % len(addresses)], requests[i % len(requests)],
                               args.tokens, args.requests) for i in range(args.streams)]
        self.ramp = args.ramp
        self.pause = args.pause
        self.duration = args.duration
        self.between = args.announce and args.requests > 1
        self.waiting: list[Stream] = []  # between two requests (--pause)
        self.selector = selectors.DefaultSelector()
        self.deadline = time.perf_counter() + args.timeout
        self.announce = args.announce
        self.due: deque[tuple[float, Stream]] = deque()  # first requests not yet sent

    def execute(self) -> dict:
        for stream in self.streams:
            err = stream.sock.connect_ex(stream.address)
            if err not in (0, errno.EINPROGRESS):
                stream.fail(f"connect: {errno.errorcode.get(err, err)}")
            else:
                self.selector.register(stream.sock, selectors.EVENT_WRITE, stream)
        self.run_until(lambda: all(s.state in ("ready", "closed") for s in self.streams))
        began = time.perf_counter()
        ready = [s for s in self.streams if s.state == "ready"]
        self.due.extend((began + i * self.ramp / len(ready), s) for i, s in enumerate(ready))
        self.stop_at = began + self.duration if self.duration else None
        self.run_until(lambda: not self.due and not self.waiting
                       and all(s.state == "closed" for s in self.streams))
        wall = time.perf_counter() - began
        for stream in self.streams:
            if stream.state != "closed":
                stream.fail("timeout")
        return self.figures(wall)

    def run_until(self, finished) -> None:
        while not finished() and time.perf_counter() < self.deadline:
            now = time.perf_counter()
            while self.due and self.due[0][0] <= now:
                self.send(self.due.popleft()[1])
            for stream in [s for s in self.waiting if s.next_at <= now]:
                self.waiting.remove(stream)
                self.send(stream)
            wait = min(0.2, self.due[0][0] - now) if self.due else 0.2
            if self.waiting:
                wait = min(wait, min(s.next_at for s in self.waiting) - now)
            for key, _ in self.selector.select(timeout=max(wait, 0)):
                self.step(key.data)
            if self.announce and all(s.ttfts or s.state == "closed" for s in self.streams):
                print("streaming", file=sys.stderr, flush=True)
                self.announce = False
            if self.between and all(s.ok + len(s.failures) for s in self.streams):
                print("between", file=sys.stderr, flush=True)
                self.between = False

    def step(self, stream: Stream) -> None:
        try:
            if stream.state == "connect":
                err = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, errno.errorcode.get(err, str(err)))
                if self.context:
                    self.selector.unregister(stream.sock)
                    stream.sock = self.context.wrap_socket(
                        stream.sock, server_hostname=self.server_name,
                        do_handshake_on_connect=False)
                    self.selector.register(stream.sock, selectors.EVENT_READ, stream)
                    stream.state = "handshake"
                self.handshake(stream)
            elif stream.state == "handshake":
                self.handshake(stream)
            elif stream.state == "sending":
                self.write(stream)
            else:
                self.read(stream)
        except (OSError, ValueError, IndexError) as error:
            self.selector.unregister(stream.sock)
            stream.fail(f"{type(error).__name__}: {error}")

    def handshake(self, stream: Stream) -> None:
        if self.context:
            try:
                stream.sock.do_handshake()
            except ssl.SSLWantReadError:
                self.selector.modify(stream.sock, selectors.EVENT_READ, stream)
                return
            except ssl.SSLWantWriteError:
                self.selector.modify(stream.sock, selectors.EVENT_WRITE, stream)
                return
        stream.connect_s = time.perf_counter() - stream.began
        stream.state = "ready"
        self.selector.unregister(stream.sock)

    def send(self, stream: Stream) -> None:
        """Start the connection's next request (registered for writing until it is out)."""
        if stream.state in ("ready", "waiting"):
            self.selector.register(stream.sock, selectors.EVENT_WRITE, stream)
        else:
            self.selector.modify(stream.sock, selectors.EVENT_WRITE, stream)
        stream.state = "sending"
        stream.unsent = stream.request
        stream.sent = time.perf_counter()
        self.step(stream)

    def write(self, stream: Stream) -> None:
        try:
            written = stream.sock.send(stream.unsent)
        except (BlockingIOError, ssl.SSLWantWriteError):
            return
        stream.unsent = stream.unsent[written:]
        if not stream.unsent:
            stream.state = "head"
            self.selector.modify(stream.sock, selectors.EVENT_READ, stream)

    def read(self, stream: Stream) -> None:
        while stream.state in ("head", "body"):  # drain: TLS may hold bytes select cannot see
            try:
                data = stream.sock.recv(READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            if not data:
                self.selector.unregister(stream.sock)
                if stream.state == "body" and stream.remaining == UNTIL_CLOSE:
                    stream.response_ended()  # its body ran until the close
                    stream.fail("the server closed the connection")  # fails what is left
                else:
                    stream.fail("truncated" if stream.status else "closed without a response")
                return
            stream.received(data, time.perf_counter())
            if stream.response_complete:
                stream.response_ended()
                if self.stop_at is not None and time.perf_counter() >= self.stop_at:
                    stream.left = 0  # the soak is over: not a failure
                if stream.left and stream.keep_alive:
                    stream.response_started()
                    if self.pause:
                        stream.next_at = time.perf_counter() + self.pause
                        stream.state = "waiting"
                        self.selector.unregister(stream.sock)
                        self.waiting.append(stream)
                    else:
                        self.send(stream)
                    return
                self.selector.unregister(stream.sock)
                stream.fail("the server asked to close the connection")  # fails what is left

    def figures(self, wall: float) -> dict:
        streams = self.streams
        connects = [s.connect_s for s in streams if s.connect_s is not None]
        ttfts = [t for s in streams for t in s.ttfts]
        gaps = [g for s in streams for g in s.gaps]
        failures = Counter(f for s in streams for f in s.failures)
        tokens = sum(s.received_tokens for s in streams)
        return {
            "requests": sum(s.ok + len(s.failures) for s in streams),
            "ok": sum(s.ok for s in streams),
            "failed": failures.total(),
            "failures": dict(failures.most_common(5)),
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "connect_p50_ms": ms(percentile(connects, 0.5)),
            "connect_p99_ms": ms(percentile(connects, 0.99)),
            "ttft_p50_ms": ms(percentile(ttfts, 0.5)),
            "ttft_p99_ms": ms(percentile(ttfts, 0.99)),
            "gap_p99_ms": ms(percentile(gaps, 0.99)),
            "worst_gap_ms": ms(max(gaps, default=None)),
        }


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    if fraction == 0.5:
        return statistics.median(values)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="scheme://address:port of the endpoint")
    parser.add_argument("--host", help="Host header and TLS server name (default: URL host)")
    parser.add_argument("--ca", help="CA bundle to verify the server against")
    parser.add_argument("--auth", action="append",
                        help="Authorization header value (repeat: one per connection in turn)")
    parser.add_argument("--spread", action="append", default=[], metavar="HOST",
                        help="more hosts on the URL's port: connection i goes to the (i mod n)-th "
                             "of the URL's host and these (straight to every replica)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, default=200, help="concurrent connections")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--requests", type=int, default=1, help="requests per connection")
    parser.add_argument("--ramp", type=float, default=0, help="seconds over which to start them")
    parser.add_argument("--pause", type=float, default=0,
                        help="seconds between two requests of one connection")
    parser.add_argument("--duration", type=float, default=0,
                        help="start no new request after this many seconds (0: no limit)")
    parser.add_argument("--timeout", type=float, default=120, help="give up after (seconds)")
    parser.add_argument("--announce", action="store_true",
                        help="print 'streaming' to stderr once every stream has its first token")
    print(json.dumps(Run(parser.parse_args()).execute()))


if __name__ == "__main__":
    main()
