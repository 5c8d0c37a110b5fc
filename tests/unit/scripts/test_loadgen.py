"""scripts/loadgen.py, the benchmarks' load client, on both protocols: HTTP/1.1 (a connection a
stream) and HTTP/2 (--h2: every stream on ONE connection), against the real rendered door
(Debian 13's nginx + njs and the vLLM stand-in, no Docker: tests/support/door_ns.py). The figures
must be counted the same way on both, and every way a stream can fail must count as failed.
The HTTP/2 framing's rarer paths (padding, CONTINUATION, PING, GOAWAY, window top-ups) are fed
to the client's connection as frames, without a server.
"""

from __future__ import annotations

import base64
import importlib.util
import re
import signal
import time
from collections.abc import Iterator
from types import ModuleType

import hpack
import pytest

from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import LOADGEN, Door, serving_door
from tests.support.sites import base_site

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
STREAMS = 32
TOKENS = 16


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("loadgen", LOADGEN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


loadgen = load_module()
needs_nginx = pytest.mark.skipif(nginx_ns.available() is not None,
                                 reason=str(nginx_ns.available()))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, list[str]]]:
    """The base site's rendered door with its verifier, limits out of the way; the
    Authorization values of the user ops (Basic) and of a Bearer key; the stand-in at 5 ms a
    token."""
    root = tmp_path_factory.mktemp("loadgen-door")
    site = base_site(root)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "read_timeout: 900}", "read_timeout: 900, rate_limit_per_ip: 100000, "
        "rate_limit_per_credential: 100000}"))
    password = render_site(Site.load(spec)).new_passwords[0].password
    added = run_kit("keys", "add", spec, "load", "--offline")
    assert added.exit_code == 0, added.output
    key = added.output.split("key load: ")[1].split()[0]
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b",
                      SERVED, HOST, STANDIN_TOKEN_INTERVAL_MS="5",
                      STANDIN_LOAD_SECONDS="0.1", verifier=True) as running:
        basic = base64.b64encode(f"ops:{password}".encode()).decode()
        yield running, [f"Basic {basic}", f"Bearer {key}"]


def options(keys: list[str], *, streams: int = STREAMS, tokens: int = TOKENS,
            requests: int = 1, h2: bool) -> list[str]:
    return ["--model", SERVED, "--streams", str(streams), "--tokens", str(tokens),
            "--requests", str(requests), *(f"--auth={k}" for k in keys),
            *(["--h2"] if h2 else [])]


def http2_lines(door: Door) -> int:
    door.flush_logs()
    time.sleep(0.3)
    return len(re.findall(r'"POST /v1/chat/completions HTTP/2\.0" 200',
                          door.access_log.read_text()))


@needs_nginx
@pytest.mark.parametrize("h2", [False, True], ids=["h1.1", "h2"])
def test_every_stream_is_counted_the_same_way_on_both_protocols(
        door: tuple[Door, list[str]], h2: bool) -> None:
    """32 slots x 2 requests each, Basic and Bearer in turn, over 32 connections or over ONE
    h2 connection: every token arrives, every request ok, the figures in the range a 5 ms/token
    stand-in allows."""
    running, keys = door
    before = http2_lines(running)
    figures = running.load(*options(keys, requests=2, h2=h2))
    assert (figures["ok"], figures["failed"]) == (2 * STREAMS, 0), figures
    assert figures["tokens"] == 2 * STREAMS * TOKENS
    assert figures["protocol"] == ("h2" if h2 else "http/1.1")
    assert figures["connections"] == (1 if h2 else STREAMS)
    assert 0 < figures["ttft_p50_ms"] < 2000 and 0 < figures["worst_gap_ms"] < 2000
    # two requests of 16 tokens at 5 ms, back to back: at least 0.16 s a slot
    assert 0 < figures["tokens_per_s"] <= 2 * STREAMS * TOKENS / 0.16
    assert http2_lines(running) - before == (2 * STREAMS if h2 else 0)
    if h2:  # the rendered http2_max_concurrent_streams, as the server's SETTINGS said
        conf = (running.work.parent / "site" / "nginx" / "nginx.conf").read_text()
        limit = int(re.search(r"http2_max_concurrent_streams (\d+);", conf)[1])
        assert figures["server_max_streams"] == limit


@needs_nginx
@pytest.mark.parametrize("h2", [False, True], ids=["h1.1", "h2"])
def test_a_refused_request_counts_as_failed(door: tuple[Door, list[str]], h2: bool) -> None:
    """Every other slot sends an unknown key: the door answers 401, so half the requests fail
    by their status, the other half are unaffected (on h2: streams of the same connection)."""
    running, keys = door
    figures = running.load(*options([keys[1], "Bearer sk-kit-unknown"], h2=h2))
    assert (figures["ok"], figures["failed"]) == (STREAMS // 2, STREAMS // 2), figures
    assert figures["failures"] == {"status 401": STREAMS // 2}


@needs_nginx
def test_streams_beyond_the_doors_limit_are_refused_and_counted(
        door: tuple[Door, list[str]]) -> None:
    """nginx allowed 8 concurrent streams a connection: of 32 sent at once, 24 are reset
    (REFUSED_STREAM) and count as failed; the client reports the server's limit."""
    running, keys = door
    conf = running.work.parent / "site" / "nginx" / "nginx.conf"
    rendered = conf.read_text()
    limited = re.sub(r"http2_max_concurrent_streams \d+;", "http2_max_concurrent_streams 8;",
                     rendered)
    running.reload(conf, limited)
    try:
        figures = running.load(*options(keys, h2=True))
    finally:
        running.reload(conf, rendered)
    assert figures["server_max_streams"] == 8
    assert (figures["ok"], figures["failed"]) == (8, STREAMS - 8), figures
    assert figures["failures"] == {"RST_STREAM REFUSED_STREAM": STREAMS - 8}


@needs_nginx
@pytest.mark.parametrize("h2", [False, True], ids=["h1.1", "h2"])
def test_streams_cut_by_the_backend_count_as_failed(door: tuple[Door, list[str]],
                                                   h2: bool) -> None:
    """The stand-in killed once every stream has its first token: every request fails, on one
    h2 connection as on 32 connections."""
    running, keys = door
    proc = running.loadgen(*options(keys, tokens=2000, h2=h2), "--announce")
    try:
        assert proc.stderr.readline().strip() == "streaming"
        running.standin.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        running.restart_standin()
    figures = loadgen.json.loads(stdout)
    assert (figures["ok"], figures["failed"]) == (0, STREAMS), figures
    assert 0 < figures["tokens"] < STREAMS * 2000


# ---- the HTTP/2 framing, frame by frame, without a server


def connection() -> tuple[ModuleType, object, list]:
    conn = loadgen.H2Connection(("127.0.0.1", 443), b"{}")
    slots = [loadgen.Stream(("127.0.0.1", 443), b"", 2, 1, conn) for _ in range(3)]
    conn.slots = slots
    for slot in slots:
        conn.submit(slot)
    conn.outbound.clear()
    return loadgen, conn, slots


def event(text: str) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


def test_frames_fill_the_same_accounting_as_http11() -> None:
    """Padded HEADERS split over CONTINUATION, padded DATA, events split across frames: the
    stream is ok with its two tokens; PING and SETTINGS are acknowledged."""
    lg, conn, (first, *_) = connection()
    block = hpack.Encoder().encode([(":status", "200"), ("content-type", "text/event-stream")])
    padded = bytes((3,)) + block[:2] + b"\0\0\0"
    body = event("a") + event("b") + b"data: [DONE]\n\n"
    frames = (lg.frame(lg.HEADERS, lg.PADDED, 1, padded)
              + lg.frame(lg.CONTINUATION, lg.END_HEADERS, 1, block[2:])
              + lg.frame(lg.DATA, lg.PADDED, 1, bytes((2,)) + body[:30] + b"\0\0")
              + lg.frame(lg.PING, 0, 0, b"12345678")
              + lg.frame(lg.SETTINGS, 0, 0, (3).to_bytes(2, "big") + (7).to_bytes(4, "big"))
              + lg.frame(lg.DATA, lg.END_STREAM, 1, body[30:]))
    ended = []
    for at in range(0, len(frames), 7):  # bytes as TLS records cut them
        ended += conn.received(frames[at:at + 7], time.perf_counter())
    assert ended == [first] and (first.ok, first.failures, first.chunks) == (1, [], 2)
    assert conn.max_streams == 7
    assert bytes(conn.outbound) == (lg.frame(lg.PING, lg.ACK, 0, b"12345678")
                                    + lg.frame(lg.SETTINGS, lg.ACK, 0))


def test_resets_and_goaway_fail_exactly_the_requests_they_hit() -> None:
    """RST_STREAM fails its stream's request; GOAWAY the streams above its last id, and every
    request submitted after it."""
    lg, conn, (first, second, third) = connection()
    ended = conn.received(lg.frame(lg.RST_STREAM, 0, 3, (7).to_bytes(4, "big"))
                          + lg.frame(lg.GOAWAY, 0, 0, (1).to_bytes(4, "big") + bytes(4)),
                          time.perf_counter())
    assert ended == [second, third]
    assert second.failures == ["RST_STREAM REFUSED_STREAM"]
    assert third.failures == ["GOAWAY NO_ERROR"]
    assert first.failures == [] and 1 in conn.open
    first.left = 2
    conn.submit(first)
    assert first.failures == ["GOAWAY NO_ERROR"] * 2 and first.state == "closed"


def test_windows_are_topped_up_before_they_run_low() -> None:
    """A stream and the connection are given back their window once it falls below half."""
    lg, conn, (first, *_) = connection()
    conn.receive_window = first.window = lg.REFILL_BELOW + 10
    conn.received(lg.frame(lg.DATA, 0, 1, event("x") * 2), time.perf_counter())
    used = len(event("x") * 2)
    assert bytes(conn.outbound) == (lg.window_update(0, lg.MAX_WINDOW - lg.REFILL_BELOW - 10 + used)
                                    + lg.window_update(1, lg.MAX_WINDOW - lg.REFILL_BELOW - 10
                                                       + used))
    assert conn.receive_window == first.window == lg.MAX_WINDOW


def test_a_request_waits_for_the_servers_window() -> None:
    """A body the connection's send window cannot take waits (its HEADERS too, keeping stream
    ids in order) until a WINDOW_UPDATE gives room."""
    lg, conn, (first, *_) = connection()
    conn.send_window = 1
    conn.submit(first)
    assert not conn.outbound and list(conn.blocked) == [first]
    conn.received(lg.window_update(0, 100), time.perf_counter())
    assert 7 in conn.open and conn.open[7] is first and not conn.blocked


def test_request_headers_are_plain_literals_any_hpack_decoder_reads() -> None:
    fields = [(":method", "POST"), ("authorization", "Bearer " + "k" * 300)]
    assert hpack.Decoder().decode(loadgen.header_block(fields)) == fields


def sse_response(*events: bytes) -> bytes:
    body = b"".join(events) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)


def chunk(text: bytes, *, completion: int | None = None, finish: bool = False) -> bytes:
    usage = b"" if completion is None else b',"usage":{"completion_tokens":%d}' % completion
    reason = b',"finish_reason":"length"' if finish else b""
    return b'data: {"choices":[{"delta":{"content":"%b"}%b}]%b}\n\n' % (text, reason, usage)


@pytest.mark.parametrize(("events", "ok", "tokens"), [
    ([chunk(b"a", completion=1), chunk(b"bcd", completion=4), chunk(b"e", completion=5)],
     True, 5),  # merged: the chunk's usage says how many
    ([chunk(b"a"), chunk(b"bcde", finish=True)], True, 5),  # merged into the last: the rest
    ([chunk(b"a"), chunk(b"b"), chunk(b"c")], False, 3),  # one token a chunk, 2 missing
])
def test_a_chunk_the_server_merged_counts_every_token_it_carries(
        events: list[bytes], ok: bool, tokens: int) -> None:
    """vLLM's output collector merges the tokens of a stream its API server has not sent yet
    into one chunk (the calibrated stand-in's API-server processes too): its usage
    (continuous_usage_stats) says how many, or, the last chunk (finish_reason "length", the
    client's ignore_eos), the rest of max_tokens; a response short of tokens still fails."""
    stream = loadgen.Stream(("127.0.0.1", 443), b"", 5, 1)
    stream.state = "head"
    try:
        stream.received(sse_response(*events), time.perf_counter())
        stream.response_ended()
    finally:
        stream.sock.close()
    assert (stream.ok, stream.received_tokens, stream.chunks) == (int(ok), tokens, len(events))
