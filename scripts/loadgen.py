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
p50/p99, tokens/s (tokens / time from the first request to the last stream's end: a content
chunk is one token, unless the server merged several into it, its usage or its finish saying
how many), the worst and p99 gap between two chunks of one stream. A request is ok when it got
200, every requested token and `data: [DONE]`. --announce prints `streaming` to stderr once every
connection has had a first token (the tests change credentials under running streams), and
`between` once every connection has finished its first request (with --pause: the tests stop
nginx's workers in that pause).

--h2: HTTP/2 (ALPN "h2" on the same TLS) with ONE connection carrying every request as a stream
of its own: the --streams slots keep their schedule (ramp, --requests, --pause, --auth in turn)
and their figures are counted exactly as above, so the two protocols are compared by the same
client. Small on purpose (RFC 9113): the preface, SETTINGS (push off, the largest stream window)
and a connection WINDOW_UPDATE, so flow control never holds the server back, with WINDOW_UPDATEs
sent again should a window run low; requests as HPACK literals (no shared state); responses'
header blocks decoded with the `hpack` package (the one non-stdlib import, for --h2 only);
SETTINGS and PING acknowledged. A stream reset (RST_STREAM) fails its request, a GOAWAY the
requests it did not take and every later one. The server's SETTINGS_MAX_CONCURRENT_STREAMS is not
obeyed but reported: streams beyond it are refused by the server and count as failed.
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import selectors
import socket
import ssl
import statistics
import sys
import time
from collections import Counter, deque
from urllib.parse import urlsplit

try:
    import hpack  # HTTP/2 header blocks (--h2 only: the h2 package's HPACK)
except ImportError:
    hpack = None

READ_SIZE = 65536
DONE = b"[DONE]"
# `remaining` (bytes left of the chunk, or of the body when not chunked) in its special states:
COMPLETION_TOKENS = b'"completion_tokens":'
AT_SIZE_LINE = -1  # chunked: the next bytes are a chunk-size line
COMPLETE = -2  # the whole response is in
UNTIL_CLOSE = -3  # neither chunked nor Content-Length: the body ends with the connection

# HTTP/2 (RFC 9113): frame types, flags, settings, error codes by number
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 5, 6, 7, 8, 9)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20
ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x2, 0x3, 0x4
ERROR_CODES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
               "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL",
               "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY",
               "HTTP_1_1_REQUIRED")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65535  # every window's size before SETTINGS or WINDOW_UPDATE says otherwise
MAX_WINDOW = 2**31 - 1
REFILL_BELOW = 2**30  # a receive window below this is topped up again to MAX_WINDOW
MAX_FRAME = 16384  # the frame size both sides accept without a setting


class Stream:
    """One connection: handshake, then --requests streamed completions, one after the other
    (--h2: one slot of the shared connection, each request a new stream of it)."""

    def __init__(self, address: tuple[str, int], request: bytes, tokens: int, requests: int,
                 conn: H2Connection | None = None):
        self.next_at = 0.0  # when the next request on this connection is due (--pause)
        self.conn = conn  # --h2: the connection carrying this slot's requests (request: HPACK)
        self.sock = new_socket() if conn is None else None
        self.window = 0  # --h2: what the server may still send on the slot's current stream
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
        self.got = 0  # tokens of this response so far (a chunk may carry several)
        self.sent = 0.0
        self.last = 0.0

    def response_ended(self) -> None:
        if self.status == 200 and self.done and self.got == self.tokens:
            self.ok += 1
        elif self.status != 200:
            self.failures.append(f"status {self.status}")
        else:
            self.failures.append(f"{self.got} of {self.tokens} tokens, "
                                 f"[DONE] {'seen' if self.done else 'missing'}")
        self.left -= 1

    def fail(self, why: str) -> None:
        """The connection is lost: the request in flight and the ones not sent fail."""
        self.failures += [why] * self.left
        self.left = 0
        self.close()

    def close(self) -> None:
        self.state = "closed"
        if self.conn is None:
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
                tokens = self._tokens_in(payload)
                self.got += tokens
                self.received_tokens += tokens
                self.last = now

    def _tokens_in(self, payload: bytes) -> int:
        """The tokens of a content chunk: one, unless the server merged several into it (vLLM's
        output collector does while its API server lags): then the usage in the chunk says how
        many (continuous_usage_stats), or the last chunk (finish_reason "length": the engine made
        max_tokens, this client's ignore_eos) brings the rest."""
        at = payload.find(COMPLETION_TOKENS)
        if at >= 0:
            digits = re.match(rb"\d+", payload[at + len(COMPLETION_TOKENS):])
            if digits:
                return int(digits.group()) - self.got
        if b'"finish_reason":"length"' in payload:
            return self.tokens - self.got
        return 1

    @property
    def response_complete(self) -> bool:
        return self.state == "body" and self.remaining == COMPLETE


def new_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class H2Error(ValueError):
    """The server broke HTTP/2 for the whole connection."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream_id.to_bytes(4, "big") + payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def hpack_length(value: int) -> bytes:
    """An HPACK integer with a 7-bit prefix, Huffman bit clear (RFC 7541 5.1)."""
    if value < 127:
        return bytes((value,))
    out = bytearray((127,))
    value -= 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def header_block(fields: list[tuple[str, str]]) -> bytes:
    """Each field a literal without indexing, new name, no Huffman (RFC 7541 6.2.2): the same
    bytes for every request, no table shared with the server."""
    block = bytearray()
    for name, value in fields:
        name_bytes, value_bytes = name.encode(), value.encode()
        block += (b"\x00" + hpack_length(len(name_bytes)) + name_bytes
                  + hpack_length(len(value_bytes)) + value_bytes)
    return bytes(block)


def error_name(code: int) -> str:
    return ERROR_CODES[code] if code < len(ERROR_CODES) else f"error 0x{code:x}"


class H2Connection:
    """--h2: one TLS connection; each slot's request is a stream of it. Frames in are parsed
    into the slots' SSE accounting; what has to go out (requests, acknowledgements, window
    updates) collects in `outbound` for the event loop to write."""

    def __init__(self, address: tuple[str, int], body: bytes) -> None:
        if hpack is None:
            raise SystemExit("--h2 needs the hpack package (pip install h2)")
        if len(body) > MAX_FRAME:
            raise SystemExit(f"--h2 sends a request body in one DATA frame (<= {MAX_FRAME} bytes)")
        self.sock = new_socket()
        self.address = address
        self.body = body
        self.slots: list[Stream] = []
        self.state = "connect"  # → handshake → settings (the server's SETTINGS and its ACK
        self.began = time.perf_counter()  # of ours awaited) → open → closed
        self.connect_s: float | None = None
        self.decoder = hpack.Decoder()
        self.inbound = bytearray()
        self.outbound = bytearray()
        self.writing = False  # registered for EVENT_WRITE too (outbound did not all go)
        self.open: dict[int, Stream] = {}  # stream id → the slot whose request it carries
        self.next_id = 1
        self.blocked: deque[Stream] = deque()  # requests waiting for the server's window
        self.send_window = DEFAULT_WINDOW  # the connection's: what we may still send
        self.stream_window = DEFAULT_WINDOW  # a new stream's (the server's INITIAL_WINDOW_SIZE)
        self.receive_window = MAX_WINDOW  # the connection's: what the server may still send
        self.max_streams: int | None = None  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        self.peer_settings = self.settings_acked = False
        self.goaway: str | None = None  # once received: why no new stream may start
        self.block = bytearray()  # a header block until END_HEADERS
        self.block_stream = self.block_ends = 0

    def start(self) -> None:
        """After the TLS handshake: ALPN checked, our preface and settings queued."""
        if self.sock.selected_alpn_protocol() != "h2":
            raise H2Error("the server did not choose h2 in ALPN")
        settings = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in
                            ((ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, MAX_WINDOW)))
        self.outbound += (PREFACE + frame(SETTINGS, 0, 0, settings)
                          + window_update(0, MAX_WINDOW - DEFAULT_WINDOW))
        self.state = "settings"

    @property
    def settled(self) -> bool:
        return self.state == "settings" and self.peer_settings and self.settings_acked

    def submit(self, stream: Stream) -> None:
        """The slot's next request: a new stream now, or once the server's window has room."""
        if self.goaway:
            stream.fail(self.goaway)
        elif self.blocked or len(self.body) > min(self.send_window, self.stream_window):
            self.blocked.append(stream)
        else:
            self._open(stream)

    def _open(self, stream: Stream) -> None:
        stream_id, self.next_id = self.next_id, self.next_id + 2
        self.open[stream_id] = stream
        stream.window = MAX_WINDOW
        self.outbound += (frame(HEADERS, END_HEADERS, stream_id, stream.request)
                          + frame(DATA, END_STREAM, stream_id, self.body))
        self.send_window -= len(self.body)

    def _unblock(self) -> None:
        while self.blocked and len(self.body) <= min(self.send_window, self.stream_window):
            self._open(self.blocked.popleft())

    def received(self, data: bytes, now: float) -> list[Stream]:
        """Parse the frames in; the slots whose request ended (judged: ok or failed)."""
        self.inbound += data
        buffer, at, ended = self.inbound, 0, []
        while len(buffer) - at >= 9:
            length = int.from_bytes(buffer[at:at + 3], "big")
            if len(buffer) - at - 9 < length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream_id = int.from_bytes(buffer[at + 5:at + 9], "big") & MAX_WINDOW
            payload = bytes(buffer[at + 9:at + 9 + length])
            at += 9 + length
            self._frame(kind, flags, stream_id, payload, now, ended)
        del buffer[:at]
        return ended

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, now: float,
               ended: list[Stream]) -> None:
        if kind == DATA:
            self._data(flags, stream_id, payload, now, ended)
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                payload = unpadded(flags, payload)
                self.block[:] = payload[5:] if flags & PRIORITY else payload
                self.block_stream, self.block_ends = stream_id, flags & END_STREAM
            else:
                self.block += payload
            if flags & END_HEADERS:
                self._headers(ended)
        elif kind == RST_STREAM:
            self._reset(stream_id, f"RST_STREAM {error_name(int.from_bytes(payload, 'big'))}",
                        ended)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == PING and not flags & ACK:
            self.outbound += frame(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            last = int.from_bytes(payload[:4], "big") & MAX_WINDOW
            self.goaway = f"GOAWAY {error_name(int.from_bytes(payload[4:8], 'big'))}"
            for stream_id in [i for i in self.open if i > last]:
                self._reset(stream_id, self.goaway, ended)
            for stream in self.blocked:
                stream.fail(self.goaway)
            self.blocked.clear()
        elif kind == WINDOW_UPDATE:
            if stream_id == 0:
                self.send_window += int.from_bytes(payload, "big") & MAX_WINDOW
                self._unblock()
        elif kind == PUSH_PROMISE:
            raise H2Error("PUSH_PROMISE although push was disabled")
        # PRIORITY and unknown frame types: nothing to do (RFC 9113 5.5)

    def _data(self, flags: int, stream_id: int, payload: bytes, now: float,
              ended: list[Stream]) -> None:
        self.receive_window -= len(payload)  # flow control counts the padding too
        if self.receive_window < REFILL_BELOW:
            self.outbound += window_update(0, MAX_WINDOW - self.receive_window)
            self.receive_window = MAX_WINDOW
        stream = self.open.get(stream_id)
        if stream is None:
            return  # a stream already given up (GOAWAY)
        stream.window -= len(payload)
        stream.events += unpadded(flags, payload)
        stream._parse_events(now)
        if flags & END_STREAM:
            del self.open[stream_id]
            stream.response_ended()
            ended.append(stream)
        elif stream.window < REFILL_BELOW:
            self.outbound += window_update(stream_id, MAX_WINDOW - stream.window)
            stream.window = MAX_WINDOW

    def _headers(self, ended: list[Stream]) -> None:
        try:  # every block is decoded: the server's HPACK table changes with each
            fields = dict(self.decoder.decode(bytes(self.block)))
        except hpack.HPACKError as error:
            raise H2Error(f"HPACK: {error}") from error
        stream = self.open.get(self.block_stream)
        if stream is None:
            return
        if stream.status is None and not fields.get(":status", "").startswith("1"):
            stream.status = int(fields[":status"])
        if self.block_ends:
            del self.open[self.block_stream]
            stream.response_ended()
            ended.append(stream)

    def _reset(self, stream_id: int, why: str, ended: list[Stream]) -> None:
        stream = self.open.pop(stream_id, None)
        if stream is not None:
            stream.failures.append(why)
            stream.left -= 1
            ended.append(stream)

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            self.settings_acked = True
            return
        for at in range(0, len(payload) - 5, 6):
            key = int.from_bytes(payload[at:at + 2], "big")
            value = int.from_bytes(payload[at + 2:at + 6], "big")
            if key == MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif key == INITIAL_WINDOW_SIZE:
                self.stream_window = value
        self.outbound += frame(SETTINGS, ACK, 0)
        self.peer_settings = True
        self._unblock()

    def fail(self, why: str) -> None:
        """The connection is lost: every slot's request in flight and those not sent fail."""
        for stream in self.slots:
            if stream.state != "closed":
                stream.fail(why)
        self.close()

    def close(self) -> None:
        self.state = "closed"
        self.sock.close()


def unpadded(flags: int, payload: bytes) -> bytes:
    return payload[1:len(payload) - payload[0]] if flags & PADDED else payload


class Run:
    """All connections of one run, driven by one selector."""

    def __init__(self, args: argparse.Namespace) -> None:
        url = urlsplit(args.url)
        host = args.host or url.hostname
        port = url.port or (443 if url.scheme == "https" else 80)
        self.context = ssl.create_default_context(cafile=args.ca) if url.scheme == "https" else None
        self.server_name = host
        addresses = [(socket.gethostbyname(name), port) for name in [url.hostname, *args.spread]]
        request = {
            "model": args.model, "stream": True, "max_tokens": args.tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count slowly." + " one" * args.prompt_words}],
        }
        if args.continuous_usage:  # usage in every chunk, as the door's ledger asks vLLM
            request["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body = json.dumps(request).encode()
        self.h2: H2Connection | None = None
        if args.h2:
            self.context.set_alpn_protocols(["h2"])
            fields = [(":method", "POST"), (":scheme", "https"), (":authority", host),
                      (":path", "/v1/chat/completions"), ("content-type", "application/json"),
                      ("accept", "text/event-stream"), ("content-length", str(len(body)))]
            auths = [[("authorization", auth)] for auth in args.auth or []] or [[]]
            requests = [header_block(fields + auth) for auth in auths]
            self.h2 = H2Connection(addresses[0], body)
        else:
            headers = [
                "POST /v1/chat/completions HTTP/1.1", f"Host: {host}",
                "Content-Type: application/json", "Accept: text/event-stream",
                f"Content-Length: {len(body)}",
            ]
            auth_lines = [[f"Authorization: {auth}"] for auth in args.auth or []] or [[]]
            requests = [("\r\n".join(headers + auth) + "\r\n\r\n").encode() + body
                        for auth in auth_lines]
        self.streams = [Stream(addresses[i % len(addresses)], requests[i % len(requests)],
                               args.tokens, args.requests, self.h2) for i in range(args.streams)]
        if self.h2:
            self.h2.slots = self.streams
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
        for conn in [self.h2] if self.h2 else self.streams:
            err = conn.sock.connect_ex(conn.address)
            if err not in (0, errno.EINPROGRESS):
                conn.fail(f"connect: {errno.errorcode.get(err, err)}")
            else:
                self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)
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
        if self.h2 and self.h2.state != "closed":
            self.h2.close()
        return self.figures(wall)

    def run_until(self, finished) -> None:
        while not finished() and time.perf_counter() < self.deadline:
            now = time.perf_counter()
            while self.due and self.due[0][0] <= now:
                self.send(self.due.popleft()[1])
            for stream in [s for s in self.waiting if s.next_at <= now]:
                self.waiting.remove(stream)
                self.send(stream)
            self.flush()
            wait = min(0.2, self.due[0][0] - now) if self.due else 0.2
            if self.waiting:
                wait = min(wait, min(s.next_at for s in self.waiting) - now)
            for key, _ in self.selector.select(timeout=max(wait, 0)):
                self.step(key.data)
            self.flush()
            if self.announce and all(s.ttfts or s.state == "closed" for s in self.streams):
                print("streaming", file=sys.stderr, flush=True)
                self.announce = False
            if self.between and all(s.ok + len(s.failures) for s in self.streams):
                print("between", file=sys.stderr, flush=True)
                self.between = False

    def step(self, stream: Stream | H2Connection) -> None:
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
            elif isinstance(stream, H2Connection):
                self.read_h2(stream)
            elif stream.state == "sending":
                self.write(stream)
            else:
                self.read(stream)
        except (OSError, ValueError, IndexError) as error:
            self.selector.unregister(stream.sock)
            stream.fail(f"{type(error).__name__}: {error}")

    def handshake(self, stream: Stream | H2Connection) -> None:
        if self.context:
            try:
                stream.sock.do_handshake()
            except ssl.SSLWantReadError:
                self.selector.modify(stream.sock, selectors.EVENT_READ, stream)
                return
            except ssl.SSLWantWriteError:
                self.selector.modify(stream.sock, selectors.EVENT_WRITE, stream)
                return
        if isinstance(stream, H2Connection):
            self.selector.modify(stream.sock, selectors.EVENT_READ, stream)
            stream.start()  # ready once the settings are exchanged (read_h2)
            return
        stream.connect_s = time.perf_counter() - stream.began
        stream.state = "ready"
        self.selector.unregister(stream.sock)

    def send(self, stream: Stream) -> None:
        """Start the connection's next request (registered for writing until it is out)."""
        if stream.conn:
            stream.state = "sending"
            stream.sent = time.perf_counter()
            stream.conn.submit(stream)
            return
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

    def flush(self) -> None:
        """--h2: what the connection has to send, written as far as the socket takes it."""
        conn = self.h2
        if conn is None or conn.state in ("connect", "handshake", "closed"):
            return
        try:
            while conn.outbound:
                try:
                    written = conn.sock.send(conn.outbound)
                except (BlockingIOError, ssl.SSLWantWriteError):
                    break
                del conn.outbound[:written]
        except OSError as error:
            self.selector.unregister(conn.sock)
            conn.fail(f"{type(error).__name__}: {error}")
            return
        if conn.writing != bool(conn.outbound):
            conn.writing = bool(conn.outbound)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self.selector.modify(conn.sock, events, conn)

    def read_h2(self, conn: H2Connection) -> None:
        while conn.state != "closed":  # drain: TLS may hold bytes select cannot see
            try:
                data = conn.sock.recv(READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not data:
                self.selector.unregister(conn.sock)
                conn.fail("the server closed the connection")
                return
            for stream in conn.received(data, time.perf_counter()):
                self.next_request(stream)
        if conn.settled:
            conn.state = "open"
            conn.connect_s = time.perf_counter() - conn.began
            for stream in conn.slots:
                stream.connect_s = conn.connect_s
                if stream.state == "connect":
                    stream.state = "ready"

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
                self.next_request(stream)
                return

    def next_request(self, stream: Stream) -> None:
        """After a response (or a reset stream): the slot's next request, now or after
        --pause, or its end."""
        if self.stop_at is not None and time.perf_counter() >= self.stop_at:
            stream.left = 0  # the soak is over: not a failure
        if stream.left and stream.keep_alive:
            stream.response_started()
            if self.pause:
                stream.next_at = time.perf_counter() + self.pause
                stream.state = "waiting"
                if stream.conn is None:
                    self.selector.unregister(stream.sock)
                self.waiting.append(stream)
            else:
                self.send(stream)
        elif stream.conn is None:
            self.selector.unregister(stream.sock)
            stream.fail("the server asked to close the connection")  # fails what is left
        else:
            stream.state = "closed"
            conn = stream.conn
            if conn.state != "closed" and all(s.state == "closed" for s in conn.slots):
                self.selector.unregister(conn.sock)
                conn.close()

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
            "protocol": "h2" if self.h2 else "http/1.1",
            "connections": 1 if self.h2 else len(streams),
            # --h2: the server's SETTINGS_MAX_CONCURRENT_STREAMS (streams beyond it are refused)
            "server_max_streams": self.h2.max_streams if self.h2 else None,
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
    parser.add_argument("--streams", type=int, default=200,
                        help="concurrent connections (--h2: concurrent streams of one connection)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--prompt-words", type=int, default=0,
                        help="words added to the prompt (each about one token)")
    parser.add_argument("--continuous-usage", action="store_true",
                        help="ask for usage in every chunk (stream_options continuous_usage_stats)")
    parser.add_argument("--requests", type=int, default=1, help="requests per connection")
    parser.add_argument("--ramp", type=float, default=0, help="seconds over which to start them")
    parser.add_argument("--pause", type=float, default=0,
                        help="seconds between two requests of one connection")
    parser.add_argument("--duration", type=float, default=0,
                        help="start no new request after this many seconds (0: no limit)")
    parser.add_argument("--timeout", type=float, default=120, help="give up after (seconds)")
    parser.add_argument("--announce", action="store_true",
                        help="print 'streaming' to stderr once every stream has its first token")
    parser.add_argument("--h2", action="store_true",
                        help="HTTP/2: one connection carrying every stream (https URL only)")
    args = parser.parse_args()
    if args.h2 and (not args.url.startswith("https:") or args.spread):
        parser.error("--h2 takes an https URL (ALPN) and no --spread (one connection)")
    print(json.dumps(Run(args).execute()))


if __name__ == "__main__":
    main()
