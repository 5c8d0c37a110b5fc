"""The gate against local stand-ins of the front door: a correct one passes, broken ones fail
with the reason an operator needs (buffered streams, auth off, a certificate from another CA).

The stand-in is a threaded Python HTTPS server on 127.0.0.1 that behaves like the rendered nginx
in front of vLLM (same status codes, headers and SSE bytes as vLLM's http-trace), with switches
for each fault; a second plain-HTTP server redirects like nginx's port-80 server.
"""

import base64
import io
import json
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kit.cli import main
from kit.credentials.material import auth_state, gate_mark
from kit.credentials.tls import new_ca, new_server_cert
from kit.errors import BadInput, ExitCode
from kit.front_door.gate import (
    MIN_STREAM_TOKENS,
    StreamStats,
    judge_stream,
    run_probe,
    sse_events,
    stream_stats,
)
from kit.layout import PROBE_USER, SiteLayout
from kit.spec.model import Spec

DOMAIN = "llm.test"
PASSWORD = "probe-password-0123456789"
SERVICES = [("llama8b", "llama-3.1-8b"), ("qwen", "qwen")]  # (service name, served name)
TOKEN_DELAY_S = 0.005


@dataclass
class Faults:
    no_auth: bool = False  # every request is let through
    buffered: bool = False  # a stream is held back and sent in one piece at its end
    accept_tls_1_1: bool = False
    no_http2: bool = False  # ALPN offers only http/1.1 (nginx before `http2 on;`)
    embedder: str | None = None  # this served name is an embedding model (vLLM: no chat route)
    empty_embedding: bool = False  # its answer carries an empty vector


@dataclass
class FrontDoor:
    """The stand-in's TLS material and faults; `serve` starts it."""

    cert: bytes
    key: bytes
    faults: Faults = field(default_factory=Faults)
    asked: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _stream_events(tokens: int) -> Iterator[bytes]:
    """What vLLM sends for a streamed chat with include_usage (see http-trace.json)."""
    yield _chunk({"role": "assistant", "content": ""})
    for i in range(tokens):
        time.sleep(TOKEN_DELAY_S)
        yield _chunk({"content": f" {i}"}, "length" if i == tokens - 1 else None)
    usage = {"prompt_tokens": 15, "completion_tokens": tokens, "total_tokens": 15 + tokens}
    yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _handler(door: FrontDoor) -> type[BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{PROBE_USER}:{PASSWORD}".encode()).decode()
    served = {api for _, api in SERVICES}
    metrics = {f"/metrics/{name}" for name, _ in SERVICES}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as nginx's tcp_nodelay: no 40 ms delayed-ACK stalls

        def log_message(self, *args: object) -> None:
            pass

        def _head(self, status: int, kind: str, length: int | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Strict-Transport-Security", "max-age=63072000; includeSubDomains")
            if length is None:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _json(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self._head(status, "application/json", len(body))
            self.wfile.write(body)

        def _allowed(self) -> bool:
            door.asked.append((self.command, self.path, self.headers.get("Authorization"),
                               self.headers.get("X-Kit-Gate")))
            if door.faults.no_auth or self.headers.get("Authorization") == expected:
                return True
            self._json(401, {"error": {"message": "Unauthorized", "code": 401}})
            return False

        def do_GET(self) -> None:
            if self.path != "/v1/models" and self.path not in metrics:
                self._json(404, {"error": {"message": "Not found", "code": 404}})
            elif not self._allowed():
                return
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": api} for api in served]})
            else:
                body = b"vllm:num_requests_running 0\n"
                self._head(200, "text/plain; version=1.0.0", len(body))
                self.wfile.write(body)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            embeds = body.get("model") == door.faults.embedder
            if self.path != ("/v1/embeddings" if embeds else "/v1/chat/completions"):
                self._json(404, {"error": {"message": "Not found", "code": 404}})
            elif not self._allowed():
                return
            elif embeds:
                vector = [] if door.faults.empty_embedding else [0.25, -0.5, 0.125]
                self._json(200, {"object": "list", "usage": {"prompt_tokens": 3,
                                                             "total_tokens": 3},
                                 "data": [{"index": 0, "object": "embedding",
                                           "embedding": vector}]})
            elif body.get("stream"):
                self._stream(body["max_tokens"])
            else:
                usage = {"prompt_tokens": 15, "completion_tokens": 1, "total_tokens": 16}
                self._json(200, {"object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "OK"},
                     "finish_reason": "length"}]})

        def _stream(self, tokens: int) -> None:
            self._head(200, "text/event-stream; charset=utf-8")
            events = _stream_events(tokens)
            pieces = [b"".join(events)] if door.faults.buffered else events
            for piece in pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def _redirect_handler(https_port: int) -> type[BaseHTTPRequestHandler]:
    class Redirect(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(301)
            self.send_header("Location", f"https://{DOMAIN}:{https_port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Redirect


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    """Start a front door; return (https_port, http_port). Servers stop at teardown."""
    servers: list[ThreadingHTTPServer] = []

    def start(door: FrontDoor) -> tuple[int, int]:
        (tmp_path / "door.crt").write_bytes(door.cert)
        (tmp_path / "door.key").write_bytes(door.key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "door.crt", tmp_path / "door.key")
        if door.faults.accept_tls_1_1:
            context.minimum_version = ssl.TLSVersion.TLSv1_1
            context.set_ciphers("DEFAULT:@SECLEVEL=0")
        else:
            context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Like nginx with `http2 on;` (ALPN only: the gate's other checks speak HTTP/1.1).
        context.set_alpn_protocols(["http/1.1"] if door.faults.no_http2 else ["h2", "http/1.1"])
        https = ThreadingHTTPServer(("127.0.0.1", 0), _handler(door))
        https.socket = context.wrap_socket(https.socket, server_side=True)
        http = ThreadingHTTPServer(("127.0.0.1", 0), _redirect_handler(https.server_port))
        for server in (https, http):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            servers.append(server)
        return https.server_port, http.server_port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class ProbeSite:
    layout: SiteLayout
    ca: tuple[bytes, bytes]  # the kit CA (cert, key) the probe trusts

    def spec(self, https_port: int, http_port: int, embedder: str | None = None) -> Spec:
        data = self.spec_data(https_port, http_port)
        for service in data["services"]:
            if service["served_name"] == embedder:
                service["extra_args"] = ["--runner", "pooling"]
        return Spec.model_validate(data)

    def spec_data(self, https_port: int, http_port: int) -> dict:
        return {
            "site": "probe-test",
            "domain": DOMAIN,
            "models_root": "/data/models",
            "proxy": {"bind": "127.0.0.1", "https_port": https_port, "http_port": http_port},
            "services": [
                {"name": name, "model": f"m-{name}", "served_name": api, "gpus": [i]}
                for i, (name, api) in enumerate(SERVICES)
            ],
        }

    def door(self, faults: Faults | None = None, *, domain: str = DOMAIN) -> FrontDoor:
        cert, key = new_server_cert(domain, *self.ca)
        return FrontDoor(cert, key, faults or Faults())


@pytest.fixture
def site(tmp_path: Path) -> ProbeSite:
    layout = SiteLayout(tmp_path / "site")
    ca = new_ca("probe-test")
    layout.tls_dir.mkdir(parents=True)
    layout.ca_cert.write_bytes(ca[0])
    layout.state_dir.mkdir()
    layout.probe_password.write_text(PASSWORD + "\n")
    return ProbeSite(layout, ca)


def checks_of(result) -> dict:
    return {check.name: check for check in result.checks}


def failed(result) -> dict:
    return {check.name: check.detail for check in result.checks if not check.ok}


# --------------------------------------------------------------------------- whole gate


def test_a_correct_front_door_passes(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door()))
    result = run_probe(spec, site.layout, timeout=5)
    assert result.ok, result.render()
    assert set(checks_of(result)) == {
        "tls", "tls-below-1.2-refused", "http2-and-http1.1", "http-redirect", "auth-required",
        "hsts", "auth-wrong-password", "models", "chat llama-3.1-8b", "chat qwen",
        "stream llama-3.1-8b", "stream qwen", "metrics-auth llama8b", "metrics-auth qwen",
        "closed /metrics", "closed /invocations", "closed /tokenize",
    }
    stream = checks_of(result)["stream qwen"]
    assert f"{MIN_STREAM_TOKENS + 8} tokens in" in stream.detail
    recorded = json.loads(site.layout.last_probe.read_text())
    assert recorded == json.loads(json.dumps(result.to_json()))
    assert set(recorded) == {"ok", "target", "checked_at", "checks"}
    assert set(recorded["checks"][0]) == {"name", "ok", "detail", "latency_ms", "skipped"}


def test_the_gates_refusals_on_purpose_carry_its_mark(site: ProbeSite, serve) -> None:
    """The requests the gate makes to be refused (no or a wrong credential) carry its mark, so
    the usage ledger records them as kit's (docs/usage.md); its authenticated ones do not."""
    site.layout.auth_dir.mkdir(parents=True, exist_ok=True)
    site.layout.auth_state.write_text(auth_state())
    mark = gate_mark(site.layout)
    door = site.door()
    assert mark is not None and run_probe(site.spec(*serve(door)), site.layout, timeout=5).ok
    expected = "Basic " + base64.b64encode(f"{PROBE_USER}:{PASSWORD}".encode()).decode()
    refused = [(method, path, gate) for method, path, credential, gate in door.asked
               if credential != expected]
    assert {(method, path) for method, path, _ in refused} == {
        ("GET", "/v1/models"), ("GET", "/metrics/llama8b"), ("GET", "/metrics/qwen")}
    assert all(gate == mark for _, _, gate in refused), refused
    assert all(gate is None for _, _, credential, gate in door.asked if credential == expected)


def test_an_embedding_model_is_proven_by_an_embedding_and_not_streamed(
    site: ProbeSite, serve
) -> None:
    """vLLM serves a pooling model's /v1/embeddings and no chat route: the gate embeds."""
    spec = site.spec(*serve(site.door(Faults(embedder="qwen"))), embedder="qwen")
    result = run_probe(spec, site.layout, timeout=5)
    assert result.ok, result.render()
    names = set(checks_of(result))
    assert {"embed qwen", "chat llama-3.1-8b", "stream llama-3.1-8b"} <= names
    assert not {"chat qwen", "stream qwen"} & names
    assert checks_of(result)["embed qwen"].detail == "200, a 3-dimension embedding"


def test_an_embedding_without_a_vector_fails(site: ProbeSite, serve) -> None:
    door = site.door(Faults(embedder="qwen", empty_embedding=True))
    result = run_probe(site.spec(*serve(door), embedder="qwen"), site.layout, timeout=5)
    assert failed(result).keys() == {"embed qwen"}
    assert "200 without an embedding vector and usage" in failed(result)["embed qwen"]


def test_an_embedding_model_served_as_generative_fails_its_chat(site: ProbeSite, serve) -> None:
    """Flags that do not say pooling: the gate asks for a chat, which vLLM does not serve."""
    result = run_probe(site.spec(*serve(site.door(Faults(embedder="qwen")))), site.layout,
                       timeout=5)
    assert set(failed(result)) == {"chat qwen", "stream qwen"}
    assert failed(result)["chat qwen"].startswith("got 404")


def test_a_buffering_proxy_fails_the_stream_checks(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door(Faults(buffered=True))))
    result = run_probe(spec, site.layout, timeout=5)
    assert set(failed(result)) == {"stream llama-3.1-8b", "stream qwen"}
    detail = failed(result)["stream qwen"]
    assert detail.startswith("stream arrived in 1 chunk after ")
    assert detail.endswith("the proxy buffers SSE — proxy_buffering must be off")


def test_a_front_door_without_auth_fails(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door(Faults(no_auth=True))))
    result = run_probe(spec, site.layout, timeout=5)
    problems = failed(result)
    assert problems["auth-required"] == "unauthenticated request got 200: auth is off"
    assert "a wrong password got 200" in problems["auth-wrong-password"]
    assert "answered 200 without credentials" in problems["metrics-auth llama8b"]
    assert set(problems) == {
        "auth-required", "auth-wrong-password", "metrics-auth llama8b", "metrics-auth qwen"
    }


def test_a_certificate_from_another_ca_fails_before_any_request(site: ProbeSite, serve) -> None:
    other_ca = new_ca("somebody-else")
    cert, key = new_server_cert(DOMAIN, *other_ca)
    spec = site.spec(*serve(FrontDoor(cert, key)))
    result = run_probe(spec, site.layout, timeout=5)
    assert not result.ok
    tls = checks_of(result)["tls"]
    assert tls.detail.startswith("TLS verification failed: ")
    assert f"not signed by the kit CA ({site.layout.ca_cert})" in tls.detail
    assert "auth-required" not in checks_of(result)  # nothing is sent to an unverified server


def test_a_private_ca_is_trusted_through_tls_ca_bundle_and_its_absence_names_it(
    site: ProbeSite, serve,
) -> None:
    """A certificate from a private CA (a private ACME server's, or the operator's own PKI):
    the system store does not trust it and the gate's error names tls.ca_bundle; with the CA
    there, the gate verifies against it; with another CA there, it says the bundle lacks it."""
    private_ca = new_ca("private-acme")
    ports = serve(FrontDoor(*new_server_cert(DOMAIN, *private_ca)))
    files = {"mode": "files", "cert": "server.pem", "key": "server.key"}
    without = Spec.model_validate({**site.spec_data(*ports), "tls": files})
    detail = failed(run_probe(without, site.layout, timeout=5))["tls"]
    assert "not trusted by the system CA store" in detail
    assert "set tls.ca_bundle to its PEM certificate" in detail

    with_bundle = Spec.model_validate(
        {**site.spec_data(*ports), "tls": {**files, "ca_bundle": "ca.pem"}})
    site.layout.ca_bundle.parent.mkdir(parents=True)
    site.layout.ca_bundle.write_bytes(private_ca[0])
    tls = checks_of(run_probe(with_bundle, site.layout, timeout=5))["tls"]
    assert tls.ok and f"verified against tls.ca_bundle ({site.layout.ca_bundle})" in tls.detail

    site.layout.ca_bundle.write_bytes(new_ca("another")[0])
    assert (f"not signed by a CA of tls.ca_bundle ({site.layout.ca_bundle})"
            in failed(run_probe(with_bundle, site.layout, timeout=5))["tls"])


def test_a_certificate_for_another_name_fails(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door(domain="other.test")))
    result = run_probe(spec, site.layout, timeout=5)
    assert f"does not name {DOMAIN}" in failed(result)["tls"]


def test_a_door_without_http2_fails(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door(Faults(no_http2=True))))
    result = run_probe(spec, site.layout, timeout=5)
    assert set(failed(result)) == {"http2-and-http1.1"}
    assert "got http/1.1: the door does not serve HTTP/2" in failed(result)["http2-and-http1.1"]


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_tls_1_1_accepted_fails(site: ProbeSite, serve) -> None:
    spec = site.spec(*serve(site.door(Faults(accept_tls_1_1=True))))
    result = run_probe(spec, site.layout, timeout=5)
    legacy = checks_of(result)["tls-below-1.2-refused"]
    if legacy.skipped:
        pytest.skip(legacy.detail)
    assert set(failed(result)) == {"tls-below-1.2-refused"}
    assert "accepted TLSv1.1" in legacy.detail


def test_nothing_listening_says_so(site: ProbeSite) -> None:
    spec = site.spec(1, 2)  # privileged ports nobody listens on in a test run
    result = run_probe(spec, site.layout, timeout=2)
    assert "connection refused — is the stack up (kit up)?" in failed(result)["tls"]


# --------------------------------------------------------------------------- the CLI


def run_kit(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["kit", *args])
    with pytest.raises(SystemExit) as exited:
        main()
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def write_spec(site: ProbeSite, https_port: int, http_port: int) -> Path:
    path = site.layout.root / "site.yaml"
    path.write_text(json.dumps(site.spec_data(https_port, http_port)))  # JSON is YAML
    return path


def test_cli_exit_codes(site: ProbeSite, serve, monkeypatch, capsys) -> None:
    good = write_spec(site, *serve(site.door()))
    code, out, _ = run_kit(monkeypatch, capsys, "probe", str(good), "--json")
    assert code == ExitCode.OK and json.loads(out)["ok"] is True

    buffered = write_spec(site, *serve(site.door(Faults(buffered=True))))
    code, out, _ = run_kit(monkeypatch, capsys, "probe", str(buffered))
    assert code == ExitCode.FAILED
    assert "proxy_buffering must be off" in out and "2 of 17 checks failed" in out

    site.layout.probe_password.unlink()
    code, _, err = run_kit(monkeypatch, capsys, "probe", str(good))
    assert code == ExitCode.BAD_INPUT and "run kit render first" in err

    code, _, err = run_kit(monkeypatch, capsys, "probe", str(site.layout.root / "missing.yaml"))
    assert code == ExitCode.BAD_INPUT and "does not exist" in err


def test_missing_ca_is_bad_input(site: ProbeSite) -> None:
    site.layout.ca_cert.unlink()
    with pytest.raises(BadInput, match="run kit render first"):
        run_probe(site.spec(1, 2), site.layout)


# --------------------------------------------------------------------------- SSE and the verdict


class FakeResponse:
    def __init__(self, raw: bytes) -> None:
        self.readline = io.BytesIO(raw).readline


def test_sse_parsing_follows_the_event_stream_format() -> None:
    raw = (b": a comment\r\n"
           b"data: {\"a\":\r\ndata: 1}\r\n\r\n"
           b"event: ignored\ndata:[DONE]\n\n")
    assert [data for _, data in sse_events(FakeResponse(raw))] == ['{"a":\n1}', "[DONE]"]


def test_stream_stats_count_bursts_not_events() -> None:
    events = [(10.0, json.dumps({"choices": [{"delta": {"content": "x"}}]}))] * 3
    events += [(10.5, json.dumps({"choices": [{"delta": {"content": "y"}}]})), (10.5, "[DONE]")]
    stats = stream_stats(9.0, iter(events))
    assert stats == StreamStats(tokens=4, events=4, arrivals=2, first_s=1.0, total_s=1.5,
                                done=True)


@pytest.mark.parametrize(("stats", "ok", "says"), [
    (StreamStats(24, 27, 26, 0.05, 1.2, True), True, "24 tokens in 26 chunks"),
    (StreamStats(24, 27, 1, 1.6, 1.6, True), False, "1 chunk after 1.60 s"),
    (StreamStats(24, 27, 2, 1.5, 1.6, True), False, "2 chunks the first after 1.50 s of 1.60 s"),
    (StreamStats(24, 27, 26, 0.9, 1.2, True), False, "proxy_buffering must be off"),
    (StreamStats(24, 27, 26, 0.05, 1.2, False), False, "without `data: [DONE]`"),
    (StreamStats(3, 5, 5, 0.05, 1.2, True), False, "only 3 token(s) streamed"),
])
def test_stream_verdict(stats: StreamStats, ok: bool, says: str) -> None:
    verdict, detail = judge_stream(stats)
    assert verdict is ok and says in detail


def test_kit_probe_checks_replicas_on_the_sites_own_engine(example_site: Path, monkeypatch,
                                                           capsys) -> None:
    """`engine:` names where the replicas run: the per-replica checks go there, not to
    DOCKER_HOST or the local socket."""
    from kit.errors import KitError
    from kit.stack import probe as probe_command

    spec = example_site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "# engine: ssh://ops@gpu01.example.com", "engine: unix:///run/kit-test-engine.sock"))
    reached: list[str | None] = []
    monkeypatch.setattr(probe_command, "connect_to", lambda url=None: reached.append(url))
    monkeypatch.setattr(probe_command, "replica_checks", lambda site, connect, *_: connect() or [])

    def gate_up_to_the_replicas(spec, layout, *, replicas, **_):
        replicas()
        raise KitError("the gate stops here", fix="none needed: a test")

    monkeypatch.setattr(probe_command, "run_probe", gate_up_to_the_replicas)
    code, _, err = run_kit(monkeypatch, capsys, "probe", str(spec))
    assert code == 1, err
    assert reached == ["unix:///run/kit-test-engine.sock"]
