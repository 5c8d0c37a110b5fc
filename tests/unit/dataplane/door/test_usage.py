"""The usage ledger at the front door (docs/usage.md), through the real nginx + njs and the
vLLM stand-in, without Docker: what a client receives is what vLLM would have sent it, and every
request leaves one spool line whose tokens are the engine's own counts.

One door (nginx and a stand-in, tests/support/door_ns.py) serves the whole module.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx2
import openai
import pytest

from kit.credentials.material import gate_mark
from kit.dataplane.collector import usage_ledger
from kit.front_door.client import basic_header
from kit.layout import SiteLayout
from kit.render.site_files import render_site
from kit.render.usage import ledger_routes
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, read_events, serving_door
from tests.support.raw_http import RawReply
from tests.support.raw_http import request as raw_request
from tests.support.sites import REPO, base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
KEYS = ("golden", "sdk", "counted", "refused", "limited", "aborts", "dies", "together")
PASSWORD = "a-long-enough-password-41"  # the Basic user ann's
BUDGETED = "charged"  # a key with a token budget (too large to be reached here)
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "Say something long."}]}
COMPLETION = {"model": SERVED, "prompt": "Once upon a time"}
ROUTES = {"chat": ("/v1/chat/completions", CHAT), "completions": ("/v1/completions", COMPLETION)}
# what differs between two answers to the same request: ids, times, the random text
VARYING = re.compile(rb'("id":"|"created":|"content":"|"text":")[^",}]*')


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, dict[str, str]]]:
    """The rendered door of the base site (one service, Bearer keys, 30 requests a minute per
    key) and one key per test; the stand-in paces tokens at 5 ms."""
    root = tmp_path_factory.mktemp("usage-door")
    site = base_site(root)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "read_timeout: 900}", "read_timeout: 900, rate_limit_per_credential: 30}"))
    render_site(Site.load(spec))
    keys = {}
    for name in KEYS:
        added = run_kit("keys", "add", spec, name, "--offline")
        assert added.exit_code == 0, added.output
        keys[name] = added.output.split(f"key {name}: ")[1].split()[0]
    added = run_kit("users", "add", spec, "ann", "--password-stdin", "--offline",
                    stdin=PASSWORD + "\n")
    assert added.exit_code == 0, added.output
    added = run_kit("keys", "add", spec, BUDGETED, "--offline", "--tokens-per-day", "10000000")
    assert added.exit_code == 0, added.output
    keys[BUDGETED] = added.output.split(f"key {BUDGETED}: ")[1].split()[0]
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b",
                      SERVED, HOST, verifier=True, STANDIN_TOKEN_INTERVAL_MS="5",
                      STANDIN_LOAD_SECONDS="0.1") as running:
        yield running, keys


def post(path: str, body: dict | bytes, key: str | None, agent: str, *,
         authorization: str | None = None, method: str = "POST") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [("Content-Type", "application/json"), ("User-Agent", agent)]
    if key or authorization:
        headers.append(("Authorization", authorization or f"Bearer {key}"))
    return raw_request(method, path, HOST, headers, data)


def same_shape(reply: RawReply) -> bytes:
    return VARYING.sub(rb"\1*", reply.body)


CASES = [
    pytest.param(route, stream, options, wait, id=f"{route}-{label}")
    for route in ROUTES
    for stream, options, wait, label in [
        (False, None, 0, "whole"),
        (True, None, 0, "stream"),
        (True, {"include_usage": False}, 0, "include_usage-false"),
        (True, {"include_usage": True}, 0, "include_usage"),
        (True, {}, 0, "empty-stream_options"),
        (True, {"include_usage": True, "continuous_usage_stats": True}, 0, "continuous"),
        (True, None, 0.3, "slow-reader"),
    ]
]


@pytest.mark.parametrize("who", ["golden", BUDGETED])
@pytest.mark.parametrize(("route", "stream", "options", "wait"), CASES)
def test_a_client_gets_the_bytes_vllm_would_have_sent_it(
        door: tuple[Door, dict[str, str]], route: str, stream: bool, options: dict | None,
        wait: float, who: str) -> None:
    """Golden: through the door and straight from the stand-in, the same body byte for byte
    (ids, times and the random text aside), whatever the client asked of usage, whether the
    door asked vLLM for the final usage (no budget) or for all of it (a budget). The slow
    reader's stream piles up in nginx: its events reach the body filter split across
    buffers."""
    running, keys = door
    path, body = ROUTES[route]
    body = {**body, "max_tokens": 100 if wait else 12, "stream": stream}
    if options is not None:
        body["stream_options"] = options
    agent = re.sub(r"\W", "", f"{who}-{route}-{stream}-{json.dumps(options)}-{wait}")
    through = running.exchange(post(path, body, keys[who], agent), wait_s=wait)
    direct = running.exchange(post(path, body, None, agent), direct=True, wait_s=wait)
    assert through.status == direct.status == 200
    assert same_shape(through) == same_shape(direct)
    if stream:
        asked = options is not None and options.get("include_usage", True)
        assert (b'"choices":[],"usage":' in through.body) == bool(asked)
        assert through.body.endswith(b"data: [DONE]\n\n")
    record = running.record_of(agent)
    assert (record["end"], record["status"], record["model"]) == ("completed", "200", SERVED)
    assert record["completion"] == str(body["max_tokens"])
    assert (record["ttft"] != "") == stream


@pytest.mark.parametrize("http2", [False, True], ids=["h1.1", "h2"])
def test_the_openai_sdk_streams_through_the_door_unchanged(
        door: tuple[Door, dict[str, str]], http2: bool) -> None:
    """The SDK's streams, over HTTP/1.1 and HTTP/2: without include_usage every chunk has
    choices[0] and no usage; with it, the last chunk has no choices and the totals."""
    running, keys = door
    with running.inside():
        client = openai.OpenAI(
            base_url="https://127.0.0.1/v1", api_key=keys["sdk"], max_retries=0,
            http_client=httpx2.Client(verify=running.tls_context(), http2=http2))
        plain = list(client.chat.completions.create(
            model=SERVED, messages=CHAT["messages"], max_tokens=8, stream=True))
        counted = list(client.chat.completions.create(
            model=SERVED, messages=CHAT["messages"], max_tokens=8, stream=True,
            stream_options={"include_usage": True}))
        text = list(client.completions.create(model=SERVED, prompt="x", max_tokens=5,
                                              stream=True))
    assert all(chunk.choices and chunk.usage is None for chunk in plain)
    assert plain[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices and chunk.usage is None for chunk in counted[:-1])
    assert counted[-1].choices == [] and counted[-1].usage.completion_tokens == 8
    assert all(chunk.choices and chunk.usage is None for chunk in text)
    if http2:
        running.flush_logs()
        time.sleep(0.3)
        assert '"POST /v1/completions HTTP/2.0" 200' in running.access_log.read_text()


@pytest.mark.parametrize("route", ROUTES)
def test_a_record_holds_the_engines_own_token_counts(
        door: tuple[Door, dict[str, str]], route: str) -> None:
    """A stream whose client asked for no usage: its record has exactly the tokens the
    engine counted (vLLM read the door's stream_options, the last of two equal keys)."""
    running, keys = door
    path, body = ROUTES[route]
    before = running.settled_counters()
    agent = f"counted-{route}"
    body = {**body, "max_tokens": 21, "stream": True, "stream_options": {"include_usage": False},
            "seed": 18446744073709551615}
    reply = running.exchange(post(path, body, keys["counted"], agent))
    after = running.settled_counters()
    assert reply.status == 200 and b'"usage":{' not in reply.body
    record = running.record_of(agent)
    assert (int(record["prompt"]), int(record["completion"])) == (
        after[0] - before[0], after[1] - before[1])
    assert record["who"] == "key:counted" and record["route"] == path
    assert float(record["ttft"]) <= float(record["duration"])


@pytest.mark.parametrize("who", ["counted", BUDGETED])
def test_a_whole_answer_is_counted_wherever_its_usage_is(
        door: tuple[Door, dict[str, str]], who: str) -> None:
    """`return_token_ids`: vLLM puts the prompt's ids after the usage, here ~20 KB of them,
    so the usage is far from the answer's end; the record still holds the engine's counts."""
    running, keys = door
    before = running.settled_counters()
    agent = f"token-ids-{who}"
    words = " ".join(f"word{i}" for i in range(3000))
    body = {"model": SERVED, "messages": [{"role": "user", "content": words}],
            "max_tokens": 4, "return_token_ids": True}
    reply = running.exchange(post("/v1/chat/completions", body, keys[who], agent))
    after = running.settled_counters()
    assert reply.status == 200
    answer = reply.body
    assert len(answer) - answer.index(b'"usage":{') > 16_384, "the usage is not near the end"
    record = running.record_of(agent)
    assert (record["prompt"], record["completion"]) == (
        str(after[0] - before[0]), str(after[1] - before[1])), record
    assert json.loads(answer)["usage"]["completion_tokens"] == 4


def test_refusals_are_recorded_with_how_they_ended(door: tuple[Door, dict[str, str]]) -> None:
    """401, 413, 429 and the door's own 404 (unknown model): a record each, no tokens."""
    running, keys = door
    path, body = ROUTES["chat"]
    cases = {
        "no-key": (post(path, body, None, "refused-401"), "401", "refused_auth"),
        "too-large": (post(path, b'{"x":"' + b"a" * 2_000_000 + b'"}', keys["refused"],
                           "refused-413"), "413", "refused_body"),
        "unknown-model": (post(path, {**body, "model": "nope"}, keys["refused"], "refused-404"),
                          "404", "refused_request"),
    }
    for request, status, end in cases.values():
        agent = re.search(rb"User-Agent: (\S+)", request).group(1).decode()
        assert running.exchange(request).status == int(status)
        record = running.record_of(agent)
        assert (record["status"], record["end"]) == (status, end), record
        assert record["prompt"] == record["completion"] == record["model"] == ""
    statuses = [running.exchange(post(path, {**body, "model": "nope"}, keys["limited"],
                                      f"limited-{i}")).status for i in range(40)]
    assert 429 in statuses
    limited = running.record_of(f"limited-{statuses.index(429)}")
    assert (limited["status"], limited["end"]) == ("429", "refused_limit")


def test_a_refused_login_names_nobody(door: tuple[Door, dict[str, str]]) -> None:
    """Issue 42 item 7: a refused Basic login was recorded as `user:NAME` for any NAME. `who`
    is the credential the door accepted, else `-`; what a refused request presented is
    `claimed` (a Basic name whatever its password, a real key; an unknown key names none)."""
    running, keys = door
    path, body = ROUTES["chat"]
    body = {**body, "max_tokens": 3}
    cases = {
        "login-wrong": (basic_header("ann", "not-her-password"), "-", "user:ann",
                        "refused_auth"),
        "login-stranger": (basic_header("carol", "whatever-it-is"), "-", "user:carol",
                           "refused_auth"),
        "login-right": (basic_header("ann", PASSWORD), "user:ann", "", "completed"),
        "key-unknown": ("Bearer sk-not-a-key-of-this-site", "-", "", "refused_auth"),
        "key-right": (f"Bearer {keys['refused']}", "key:refused", "", "completed"),
    }
    for agent, (authorization, who, claimed, end) in cases.items():
        running.exchange(post(path, body, None, agent, authorization=authorization))
        record = running.record_of(agent)
        assert record["who"] == who, agent
        assert (record.get("claimed"), record["end"]) == (claimed, end), agent
    # the access log names nobody for a refused login either
    log = running.access_log.read_text()
    assert re.search(r' - \[[^]]+\] "POST /v1/chat/completions HTTP/1.1" 401 .*"login-wrong"',
                     log)


def test_kits_gate_refused_on_purpose_is_claimed_by_kit(
        door: tuple[Door, dict[str, str]]) -> None:
    """The requests kit's gate makes to be refused carry its mark (an HMAC under the site's
    auth epoch): recorded as claimed by `kit:gate`, so `kit usage` does not show them as
    refusals a person caused. A wrong mark claims nothing."""
    running, _ = door
    path, body = ROUTES["chat"]
    mark = gate_mark(SiteLayout(running.work.parent / "site"))
    assert mark is not None
    for agent, value, claimed in (("gate-mark", mark, "kit:gate"),
                                  ("gate-forged", "0" * 64, ""),
                                  ("gate-replayed-epoch", mark[:-1] + "0", "")):
        request = post(path, body, None, agent).replace(
            b"\r\n\r\n", f"\r\nX-Kit-Gate: {value}\r\n\r\n".encode(), 1)
        assert running.exchange(request).status == 401
        record = running.record_of(agent)
        assert (record["who"], record["claimed"]) == ("-", claimed), agent


def test_reads_and_answers_are_recorded_as_what_they_were(
        door: tuple[Door, dict[str, str]]) -> None:
    """Issue 42 item 8: a `/metrics/<service>` read (kit's gate and status make them) was an
    `upstream_error`; the service's own 4xx answer was `completed`. Now: completed, and
    `rejected` (the service refused the request, not the door)."""
    running, keys = door
    running.exchange(post("/metrics/llama8b", b"", keys["golden"], "metrics-read",
                          method="GET"))
    read = running.record_of("metrics-read")
    assert (read["status"], read["end"], read["route"]) == ("200", "completed",
                                                            "/metrics/llama8b")
    path, body = ROUTES["chat"]
    assert running.exchange(post(path, {**body, "max_tokens": 0}, keys["golden"],
                                 "service-400")).status == 400
    refused = running.record_of("service-400")
    assert (refused["status"], refused["end"], refused["model"]) == ("400", "rejected", SERVED)
    running.exchange(post("/v1/models/" + SERVED, b"", keys["golden"], "model-read",
                          method="GET"))
    assert running.record_of("model-read")["end"] == "completed"


def test_a_request_nginx_ends_without_an_answer_is_recorded(
        door: tuple[Door, dict[str, str]]) -> None:
    """Issue 42 item 8: an HTTP/2 request whose headers are over nginx's limit ends with
    status 000; its spool line must be one the collector reads (a record, refused), never an
    unreadable line that anybody could raise at will."""
    running, _ = door
    context = running.tls_context()
    context.set_alpn_protocols(["h2"])
    with running.inside():
        raw = socket.create_connection(("127.0.0.1", 443), timeout=30)
    with context.wrap_socket(raw, server_hostname=running.server_name) as sock:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "GET"), (":path", "/v1/models"), (":scheme", "https"),
                              (":authority", running.server_name),
                              ("user-agent", "headers-over"),
                              *((f"x-big-{i}", "b" * 4000) for i in range(40))],
                          end_stream=True)
        sock.sendall(conn.data_to_send())
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass
    running.flush_logs()
    time.sleep(1.5)
    lines = [json.loads(line) for line in running.spool.read_text().splitlines()]
    unanswered = [line for line in lines if line["status"] == "000"]
    assert unanswered, "nginx logged no request with status 000"
    checker = usage_ledger.Checker([SERVED], ledger_routes())
    for line in unanswered:
        record, _ = checker.record(line)
        assert (record["status"], record["ended"], record["who"]) == (0, "refused_request", "-")


@pytest.mark.parametrize("who", ["aborts", BUDGETED])
def test_an_aborted_stream_is_recorded_as_far_as_it_was_generated(
        door: tuple[Door, dict[str, str]], who: str) -> None:
    """A client that leaves mid-stream: its record is the tokens the engine generated until
    it stopped, within one chunk, and it ended as client_abort. Without a budget the door asked
    vLLM only for the final usage, so the completion is the token events it passed and the
    prompt is unknown (''); a budgeted key's streams carry the usage on every chunk, so its
    prompt is the engine's too."""
    running, keys = door
    for route, (path, body) in ROUTES.items():
        before = running.settled_counters()
        agent = f"aborts-{who}-{route}"
        running.abort_after(post(path, {**body, "max_tokens": 2000, "stream": True},
                                 keys[who], agent), events=15)
        after = running.settled_counters()
        record = running.record_of(agent)
        generated = after[1] - before[1]
        assert record["end"] == "client_abort" and record["status"] == "200"
        if who == BUDGETED:
            assert int(record["prompt"]) == after[0] - before[0]
        else:
            assert record["prompt"] == ""
        assert 13 <= int(record["completion"]) <= generated <= int(record["completion"]) + 1


@pytest.mark.parametrize(("who", "options", "asked"), [
    ("counted", None, {"include_usage": True}),
    ("counted", {"include_usage": False}, {"include_usage": True}),
    ("counted", {"include_usage": True, "continuous_usage_stats": True},
     {"include_usage": True, "continuous_usage_stats": True}),
    (BUDGETED, None, {"include_usage": True, "continuous_usage_stats": True}),
], ids=["none", "include_usage-false", "client-asks-all", "budgeted"])
@pytest.mark.parametrize("route", ROUTES)
def test_the_door_asks_vllm_for_usage_on_every_chunk_only_where_it_must(
        door: tuple[Door, dict[str, str]], route: str, who: str, options: dict | None,
        asked: dict) -> None:
    """Usage on every chunk costs vLLM's API server throughput (issue 43): the door asks for
    the final usage only, but for a budgeted credential (an abort's prompt is charged) or a
    client that asked for all of it itself."""
    running, keys = door
    path, body = ROUTES[route]
    body = {**body, "max_tokens": 3, "stream": True}
    if options is not None:
        body["stream_options"] = options
    with running.upstream_bodies() as bodies:
        assert running.exchange(post(path, body, keys[who], f"asks-{who}")).status == 200
    (upstream,) = bodies
    assert json.loads(upstream)["stream_options"] == asked


def test_an_http2_stream_the_client_cancels_is_a_client_abort(
        door: tuple[Door, dict[str, str]]) -> None:
    """Over HTTP/2 a client leaves one stream (RST_STREAM), its connection staying open: the
    same record as a closed HTTP/1.1 connection."""
    running, keys = door
    path, body = ROUTES["chat"]
    before = running.settled_counters()
    running.h2_cancel_after(path, [("authorization", f"Bearer {keys['aborts']}"),
                                   ("content-type", "application/json"),
                                   ("user-agent", "aborts-h2")],
                            json.dumps({**body, "max_tokens": 2000, "stream": True}).encode(),
                            events=15)
    after = running.settled_counters()
    record = running.record_of("aborts-h2")
    assert (record["end"], record["status"]) == ("client_abort", "200")
    assert 13 <= int(record["completion"]) <= after[1] - before[1] <= int(record["completion"]) + 1


def test_a_service_dying_mid_stream_is_an_upstream_error(
        door: tuple[Door, dict[str, str]]) -> None:
    running, keys = door
    path, body = ROUTES["chat"]
    agent = "dies"
    request = post(path, {**body, "max_tokens": 2000, "stream": True}, keys["dies"], agent)
    with running.inside():
        sock = running.connect()
    with sock:
        sock.sendall(request)
        read_events(sock, 10)
        running.standin.send_signal(signal.SIGKILL)
        read_events(sock, 10_000)
    running.restart_standin()
    record = running.record_of(agent)
    assert (record["end"], record["status"]) == ("upstream_error", "200")
    assert int(record["completion"]) >= 9


def test_concurrent_streams_each_get_what_they_asked(door: tuple[Door, dict[str, str]]) -> None:
    """The body filter keeps each request's own state: streams asking different things at
    once each get their own shape."""
    running, keys = door
    path, body = ROUTES["chat"]
    asks = {"none": None, "final": {"include_usage": True},
            "all": {"include_usage": True, "continuous_usage_stats": True}}
    replies: dict[str, list[RawReply]] = {name: [] for name in asks}

    def stream(name: str, options: dict | None) -> None:
        request = {**body, "max_tokens": 40, "stream": True}
        if options is not None:
            request["stream_options"] = options
        replies[name].append(running.exchange(post(path, request, keys["together"],
                                                   f"together-{name}")))

    threads = [threading.Thread(target=stream, args=item) for item in asks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = {name: reply[0].body.split(b"\n\n")[:-1] for name, reply in replies.items()}
    assert not any(b'"usage"' in event for event in events["none"])
    assert [b'"usage"' in event for event in events["final"]] == [False] * 41 + [True, False]
    assert all(b'"usage":{' in event for event in events["all"][:-1])


def test_every_logged_request_has_exactly_one_spool_line(
        door: tuple[Door, dict[str, str]]) -> None:
    """Last in the module: every request id of nginx's stdout access log is in the spool once,
    the door's sequence has no gap and one boot id; each line has exactly the contract's
    keys (docs/usage.md)."""
    running, _ = door
    logged = re.findall(r" id=(\w+)$", running.access_log.read_text(), re.MULTILINE)
    found = running.records(logged)
    assert logged and all(len(lines) == 1 for lines in found.values()), found
    lines = [json.loads(line) for line in running.spool.read_text().splitlines()]
    assert sorted(int(line["seq"]) for line in lines) == list(range(1, len(lines) + 1))
    assert len({line["boot"] for line in lines}) == 1
    assert all(list(line) == CONTRACT_KEYS for line in lines)
    assert all(isinstance(value, str) for line in lines for value in line.values())


CONTRACT_KEYS = ["v", "boot", "seq", "t", "id", "who", "addr", "model", "route", "method",
                 "status", "prompt", "completion", "ttft", "duration", "bytes_in", "bytes_out",
                 "end", "claimed"]


def test_the_contract_keys_are_the_documented_ones() -> None:
    doc = (REPO / "docs" / "usage.md").read_text()
    table = doc.split("### Spool line", 1)[1].split("###", 1)[0]
    keys = [key for row in re.findall(r"^\| (`[^|]+`) \|", table, re.MULTILINE)
            for key in re.findall(r"`(\w+)`", row)]
    assert keys == CONTRACT_KEYS


def test_with_the_ledger_off_the_door_routes_and_records_nothing(
        tmp_path: Path) -> None:
    """`usage: {enabled: false}`: no spool line, no body filter, no request rewriting — and
    the door's njs (shared by both renders) still routes, streams and refuses as before."""
    site = base_site(tmp_path)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("services:\n", "usage: {enabled: false}\nservices:\n",
                                             1))
    render_site(Site.load(spec))
    conf = (site / "nginx" / "nginx.conf").read_text()
    assert "kit_usage" not in conf and "js_body_filter" not in conf
    added = run_kit("keys", "add", spec, "plain", "--offline")
    key = added.output.split("key plain: ")[1].split()[0]
    (tmp_path / "work").mkdir()
    with serving_door(site / "nginx", tmp_path / "work", ["llama8b"],
                      tmp_path / "models" / "llama-8b", SERVED, HOST,
                      STANDIN_LOAD_SECONDS="0.1") as running:
        body = {**CHAT, "max_tokens": 5, "stream": True}
        through = running.exchange(post("/v1/chat/completions", body, key, "off"))
        direct = running.exchange(post("/v1/chat/completions", body, None, "off"), direct=True)
        assert through.status == direct.status == 200
        assert same_shape(through) == same_shape(direct)
        unknown = running.exchange(post("/v1/chat/completions", {**CHAT, "model": "nope"}, key,
                                        "off"))
        assert unknown.status == 404
        running.flush_logs()
        assert not running.spool.exists()


@pytest.fixture(scope="module")
def spread_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, str, Path]]:
    """The base site on a host that declares 6 cores: the planner gives its one replica two
    API-server processes (6 - 2 the site's - 1 nginx - 1 engine core = 2), so the door asks
    every stream's usage on every chunk; an unbudgeted key; the rendered site folder."""
    root = tmp_path_factory.mktemp("spread-door")
    site = base_site(root)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("services:\n", "cpus: 6\nservices:\n", 1))
    render_site(Site.load(spec))
    added = run_kit("keys", "add", spec, "unbudgeted", "--offline")
    assert added.exit_code == 0, added.output
    key = added.output.split("key unbudgeted: ")[1].split()[0]
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b",
                      SERVED, HOST, standin_args=("--api-server-count", "2"),
                      STANDIN_TOKEN_INTERVAL_MS="5", STANDIN_LOAD_SECONDS="0.1") as running:
        yield running, key, site


def test_a_service_with_two_api_servers_renders_them_and_tells_the_door(
        spread_door: tuple[Door, str, Path]) -> None:
    """The planner's choice reaches vLLM's command and the door's config, and only there."""
    _, _, site = spread_door
    compose = (site / "compose" / "docker-compose.yml").read_text()
    assert '"--scheduling-policy", "priority", "--api-server-count", "2", "--port"' in compose
    conf = (site / "nginx" / "nginx.conf").read_text()
    assert 'js_var $kit_usage_every_chunk "llama8b";' in conf


@pytest.mark.parametrize("route", ROUTES)
def test_an_unbudgeted_stream_on_two_api_servers_is_asked_usage_on_every_chunk(
        spread_door: tuple[Door, str, Path], route: str) -> None:
    """Without a budget and without the client asking, the door asks vLLM for usage on every
    chunk of a service with two API-server processes; the client still gets what it asked."""
    running, key, _ = spread_door
    path, body = ROUTES[route]
    body = {**body, "max_tokens": 3, "stream": True}
    with running.upstream_bodies() as bodies:
        assert running.exchange(post(path, body, key, f"spread-asks-{route}")).status == 200
    (upstream,) = bodies
    assert json.loads(upstream)["stream_options"] == {"include_usage": True,
                                                      "continuous_usage_stats": True}
    through = running.exchange(post(path, body, key, f"spread-gets-{route}"))
    direct = running.exchange(post(path, body, None, f"spread-gets-{route}"), direct=True)
    assert through.status == direct.status == 200
    assert same_shape(through) == same_shape(direct)


@pytest.mark.parametrize("route", ROUTES)
def test_an_aborted_unbudgeted_stream_on_two_api_servers_has_its_prompt(
        spread_door: tuple[Door, str, Path], route: str) -> None:
    """An unbudgeted key's stream left mid-way on a service with two API-server processes: its
    record holds the engine's own prompt count (on one process it would be '': the
    door asked only for the final usage) and its completion within one chunk."""
    running, key, _ = spread_door
    path, body = ROUTES[route]
    before = running.settled_counters()
    agent = f"spread-aborts-{route}"
    running.abort_after(post(path, {**body, "max_tokens": 2000, "stream": True}, key, agent),
                        events=15)
    after = running.settled_counters()
    record = running.record_of(agent)
    assert record["end"] == "client_abort" and record["status"] == "200"
    assert record["prompt"] != "" and int(record["prompt"]) == after[0] - before[0]
    assert 13 <= int(record["completion"]) <= after[1] - before[1] <= int(record["completion"]) + 1
