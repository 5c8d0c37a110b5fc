"""The front-door gate: prove through nginx, as a client would, that the site is safe and serves.

"Healthy" containers are not enough: a proxy that buffers event streams, auth that is off, a
certificate from the wrong CA or vLLM's side doors (/metrics, /invocations, /tokenize) left open
all pass a healthcheck. The gate connects to the published HTTPS port, verifies TLS the way
clients do, authenticates as kit's own probe identity (never a person's password), runs a real
completion per service and times a streamed one chunk by chunk.

Stdlib only (http.client + ssl): a client library could buffer, retry or follow redirects and
so hide exactly what the gate must see.
"""

import base64
import datetime as dt
import http.client
import json
import secrets
import socket
import ssl
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kit.credentials.tls import installed
from kit.errors import BadInput
from kit.files import atomic_write
from kit.layout import PROBE_USER, SiteLayout
from kit.site import front_door_host
from kit.spec.model import Service, Spec
from kit.state import read_state

STREAM_TOKENS = 24  # asked for, with ignore_eos, so the stream is long enough to judge
MIN_STREAM_TOKENS = 16
FIRST_CHUNK_BEFORE = 0.5  # the first data must arrive before this share of the stream's time
MIN_ARRIVALS = 4  # distinct arrival times an unbuffered stream of 16+ tokens shows at least
SAME_ARRIVAL_S = 0.0005  # reads closer together than this came in one network burst
SIDE_DOORS = (("GET", "/metrics"), ("POST", "/invocations"), ("POST", "/tokenize"))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    latency_ms: float | None = None
    skipped: bool = False


@dataclass(frozen=True)
class ProbeResult:
    target: str
    checked_at: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def render(self) -> str:
        """A plain-text table, one check a line, then the verdict."""
        width = max(len(check.name) for check in self.checks)
        lines = [f"{'CHECK':<{width}}  RESULT  LATENCY  DETAIL"]
        for check in self.checks:
            verdict = "skip" if check.skipped else ("pass" if check.ok else "FAIL")
            latency = f"{check.latency_ms:.0f} ms" if check.latency_ms is not None else "-"
            lines.append(f"{check.name:<{width}}  {verdict:<6}  {latency:>7}  {check.detail}")
        failed = sum(not check.ok for check in self.checks)
        lines.append(
            f"probe of {self.target}: "
            + (f"{failed} of {len(self.checks)} checks failed" if failed else "all checks passed")
        )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "target": self.target,
            "checked_at": self.checked_at,
            "checks": [asdict(check) for check in self.checks],
        }


@dataclass(frozen=True)
class Target:
    """Where the front door is and how a client must trust it."""

    address: str  # what to connect to; the domain still goes in SNI, Host and the cert check
    domain: str
    https_port: int
    http_port: int
    ca_file: Path | None  # the kit CA in self-signed mode, tls.ca_bundle; None: the system store
    timeout: float
    bundle: bool = False  # ca_file is the operator's tls.ca_bundle (not the kit CA)

    @property
    def https_authority(self) -> str:
        host = f"[{self.domain}]" if ":" in self.domain else self.domain
        return host if self.https_port == 443 else f"{host}:{self.https_port}"


def target_for(spec: Spec, layout: SiteLayout, address: str | None, timeout: float) -> Target:
    ca_file = None
    bundle = spec.tls.ca_bundle is not None
    if spec.tls.mode == "self-signed" or (spec.tls.mode == "acme" and _acme_placeholder(layout)):
        ca_file, bundle = layout.ca_cert, False
    elif bundle:
        ca_file = layout.ca_bundle  # the site's copy of tls.ca_bundle (kit render writes it)
    if ca_file is not None and not ca_file.is_file():
        raise BadInput(
            f"{ca_file} does not exist: the probe cannot verify the server's certificate",
            fix="run kit render first",
        )
    bind = spec.proxy.bind
    return Target(
        address=address or (front_door_host(spec) if bind in ("0.0.0.0", "::") else bind),
        domain=spec.domain,
        https_port=spec.proxy.https_port,
        http_port=spec.proxy.http_port,
        ca_file=ca_file,
        timeout=timeout,
        bundle=bundle,
    )


def _acme_placeholder(layout: SiteLayout) -> bool:
    """acme mode before the first certificate: nginx serves the kit CA's, the gate trusts it."""
    cert = installed(layout)
    return cert is not None and cert.placeholder


def probe_password(layout: SiteLayout) -> str:
    fix = "run kit render first (it creates the probe identity)"
    password = read_state(layout.probe_password, str.strip, fix=fix)
    if not password:
        raise BadInput(f"no probe credentials in {layout.probe_password}", fix=fix)
    return password


def run_probe(
    spec: Spec, layout: SiteLayout, *, address: str | None = None, timeout: float = 30,
    replicas: Callable[[], list[Check]] = list,
) -> ProbeResult:
    """Run every check against the live front door, then `replicas` (each replica on its own,
    kit/front_door/replica_check.py); record the result in .kit/last-probe.json."""
    target = target_for(spec, layout, address, timeout)
    gate = Gate(target, probe_password(layout))
    checks = gate.run(spec.services) + replicas()
    result = ProbeResult(
        target=f"https://{target.https_authority} via {target.address}",
        checked_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        checks=tuple(checks),
    )
    record = json.dumps(result.to_json(), indent=1, ensure_ascii=False) + "\n"
    atomic_write(layout.last_probe, record.encode())
    return result


# --------------------------------------------------------------------------- HTTP as a client


@dataclass(frozen=True)
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    latency_ms: float

    def json(self) -> dict:
        return json.loads(self.body)


class _Connection(http.client.HTTPConnection):
    """HTTP(S) to `address` while Host, SNI and the certificate check use the domain."""

    def __init__(self, target: Target, context: ssl.SSLContext | None) -> None:
        port = target.https_port if context else target.http_port
        self.default_port = 443 if context else 80  # Host omits the port when it is the default
        super().__init__(target.domain, port, timeout=target.timeout)
        self._address = target.address
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host) if self._tls else raw


class ProbeFailure(Exception):
    """A check's request could not complete; the message says why in the operator's terms."""


class Gate:
    """The checks, in order; each returns a Check and never raises for a network problem."""

    def __init__(self, target: Target, password: str) -> None:
        self.target = target
        self.context = self._client_context()
        self.credentials = basic_header(PROBE_USER, password)

    def _client_context(self) -> ssl.SSLContext:
        """TLS 1.2+ verified against the site's CA (or the system's), as clients verify."""
        context = ssl.create_default_context(
            cafile=str(self.target.ca_file) if self.target.ca_file else None
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def run(self, services: Sequence[Service]) -> list[Check]:
        tls = self.tls()
        checks = [tls, self.http_redirect()]
        if not tls.ok:
            return checks  # nothing over HTTPS can be trusted or even reached
        checks += [self.legacy_tls_refused(), self.protocols(), *self.auth_required()]
        checks += [self.wrong_password_refused(), self.models([s.api_name for s in services])]
        checks += [self.chat(s.api_name) for s in services]
        checks += [self.stream(s.api_name) for s in services]
        checks += [self.metrics_need_auth(s.name) for s in services]
        checks += [self.side_door_closed(method, path) for method, path in SIDE_DOORS]
        return checks

    # ---- requests

    def fetch(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        credentials: str | None = None,
        tls: bool = True,
    ) -> Reply:
        started = time.perf_counter()
        with self.exchange(method, path, body=body, credentials=credentials, tls=tls) as response:
            data = response.read()
        return Reply(response.status, response.headers, data, _ms_since(started))

    @contextmanager
    def exchange(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        credentials: str | None = None,
        tls: bool = True,
    ) -> Iterator[http.client.HTTPResponse]:
        """One request on a fresh connection; network and TLS errors become ProbeFailure."""
        connection = _Connection(self.target, self.context if tls else None)
        headers = {"Accept": "application/json, text/event-stream", "User-Agent": "kit-probe"}
        if credentials:
            headers["Authorization"] = credentials
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=payload, headers=headers)
            yield connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            raise ProbeFailure(self._explain(error, tls)) from error
        finally:
            connection.close()

    def _explain(self, error: Exception, tls: bool) -> str:
        where = f"{self.target.address}:{self.target.https_port if tls else self.target.http_port}"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"TLS verification failed: {error.verify_message} — {self._trust_hint(error)}"
        if isinstance(error, ConnectionRefusedError):
            return f"cannot connect to {where}: connection refused — is the stack up (kit up)?"
        if isinstance(error, ssl.SSLEOFError | ConnectionResetError):  # incl. RemoteDisconnected
            return (f"{where} accepted the connection and closed it without an answer: the port "
                    "is published but nothing answers behind it (is nginx up and listening "
                    "inside its container? kit status)")
        if isinstance(error, TimeoutError):
            return f"no answer from {where} within {self.target.timeout:g} s"
        return f"{where}: {type(error).__name__}: {error}"

    def _trust_hint(self, error: ssl.SSLCertVerificationError) -> str:
        if error.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            return f"the server certificate does not name {self.target.domain}"
        if self.target.bundle:
            return ("the server certificate is not signed by a CA of tls.ca_bundle "
                    f"({self.target.ca_file}): put the CA that issued it there")
        if self.target.ca_file:
            return f"the server certificate is not signed by the kit CA ({self.target.ca_file})"
        return ("the server certificate is not trusted by the system CA store (incomplete "
                "chain?); a private CA's (e.g. of tls.acme_server: step-ca, pebble): set "
                "tls.ca_bundle to its PEM certificate")

    def _checked(self, name: str, run: Callable[[], Check]) -> Check:
        try:
            return run()
        except ProbeFailure as failure:
            return Check(name, False, str(failure))
        except (ValueError, KeyError, TypeError, AttributeError) as error:  # not what vLLM sends
            return Check(name, False, f"unexpected answer: {type(error).__name__}: {error}")

    # ---- the checks

    def tls(self) -> Check:
        def run() -> Check:
            connection = _Connection(self.target, self.context)
            started = time.perf_counter()
            try:
                connection.connect()
                version = connection.sock.version()
            except OSError as error:
                raise ProbeFailure(self._explain(error, tls=True)) from error
            finally:
                connection.close()
            trust = (f"tls.ca_bundle ({self.target.ca_file})" if self.target.bundle
                     else f"the kit CA ({self.target.ca_file})" if self.target.ca_file
                     else "system CAs")
            return Check(
                "tls", True, f"{version}, certificate for {self.target.domain} verified against "
                f"{trust}", _ms_since(started),
            )

        return self._checked("tls", run)

    def protocols(self) -> Check:
        """ALPN: h2 for a client that offers it (an HTTP/2 gateway, the SDKs' httpx with http2),
        HTTP/1.1 for one that offers only that. The other checks speak HTTP/1.1 without ALPN
        (curl's and http.client's way); streams over h2 are proven by tests/e2e/test_http2.py:
        the gate stays stdlib-only and does not frame HTTP/2 itself."""
        name = "http2-and-http1.1"

        def chosen(offer: list[str]) -> str | None:
            context = self._client_context()
            context.set_alpn_protocols(offer)
            connection = _Connection(self.target, context)
            try:
                connection.connect()
                return connection.sock.selected_alpn_protocol()
            except OSError as error:
                raise ProbeFailure(self._explain(error, tls=True)) from error
            finally:
                connection.close()

        def run() -> Check:
            started = time.perf_counter()
            h2, h1 = chosen(["h2", "http/1.1"]), chosen(["http/1.1"])
            if h2 != "h2":
                got = h2 or "no ALPN answer"
                return Check(name, False, f"a client offering h2 and http/1.1 got {got}: the "
                             "door does not serve HTTP/2 (nginx >= 1.25.1 with `http2 on;`, as "
                             "kit render writes it)", _ms_since(started))
            if h1 not in ("http/1.1", None):
                return Check(name, False, f"a client offering only http/1.1 got {h1}",
                             _ms_since(started))
            return Check(name, True, "ALPN: h2 when offered, http/1.1 otherwise",
                         _ms_since(started))

        return self._checked(name, run)

    def legacy_tls_refused(self) -> Check:
        name = "tls-below-1.2-refused"

        def skipped(why: str) -> Check:
            return Check(name, True, f"skipped: this OpenSSL cannot offer TLS 1.1 ({why})",
                         skipped=True)

        legacy = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        legacy.check_hostname = False
        legacy.verify_mode = ssl.CERT_NONE
        try:
            with warnings.catch_warnings():  # deprecated on purpose: this is what must fail
                warnings.simplefilter("ignore", DeprecationWarning)
                legacy.minimum_version = ssl.TLSVersion.TLSv1
                legacy.maximum_version = ssl.TLSVersion.TLSv1_1
            legacy.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 offers TLS 1.1 only at level 0
        except (ValueError, ssl.SSLError) as error:
            return skipped(str(error))
        address = (self.target.address, self.target.https_port)
        started = time.perf_counter()
        try:
            with (
                socket.create_connection(address, self.target.timeout) as raw,
                legacy.wrap_socket(raw, server_hostname=self.target.domain) as tls,
            ):
                accepted = tls.version()
        except ssl.SSLError as error:
            if error.reason == "NO_PROTOCOLS_AVAILABLE":
                return skipped(error.reason)
            return Check(name, True, f"TLS 1.1 refused ({error.reason})", _ms_since(started))
        except (ConnectionResetError, BrokenPipeError):
            return Check(name, True, "TLS 1.1 refused (connection reset)", _ms_since(started))
        except OSError as error:
            return Check(name, False, self._explain(error, tls=True))
        return Check(name, False, f"the server accepted {accepted}: nginx must allow only "
                     "ssl_protocols TLSv1.2 TLSv1.3", _ms_since(started))

    def http_redirect(self) -> Check:
        def run() -> Check:
            reply = self.fetch("GET", "/v1/models", tls=False)
            location = reply.headers.get("Location", "")
            wanted = f"https://{self.target.https_authority}/v1/models"
            parts = urlsplit(location)
            ok = reply.status in (301, 302, 307, 308) and (
                f"{parts.scheme}://{parts.netloc}{parts.path}" == wanted
            )
            detail = (
                f"{reply.status} to {location}" if ok else
                f"plain HTTP got {reply.status} (Location {location or 'none'}), expected a "
                f"redirect to {wanted}"
            )
            return Check("http-redirect", ok, detail, reply.latency_ms)

        return self._checked("http-redirect", run)

    def auth_required(self) -> list[Check]:
        """No credentials → 401; and HSTS on that very answer (nginx adds it `always`)."""
        try:
            reply = self.fetch("GET", "/v1/models")
        except ProbeFailure as failure:
            return [Check("auth-required", False, str(failure))]
        if reply.status == 401:
            auth = Check("auth-required", True, "no credentials: 401", reply.latency_ms)
        elif reply.status == 200:
            auth = Check("auth-required", False, "unauthenticated request got 200: auth is off",
                         reply.latency_ms)
        else:
            auth = Check("auth-required", False,
                         f"unauthenticated request got {reply.status}, expected 401",
                         reply.latency_ms)
        hsts = reply.headers.get("Strict-Transport-Security", "")
        max_age = _max_age(hsts)
        hsts_check = Check(
            "hsts", max_age > 0,
            f"Strict-Transport-Security: {hsts}" if max_age > 0 else
            f"no usable Strict-Transport-Security header ({hsts or 'absent'}): browsers may "
            "fall back to plain HTTP",
        )
        return [auth, hsts_check]

    def wrong_password_refused(self) -> Check:
        def run() -> Check:
            wrong = basic_header(PROBE_USER, secrets.token_urlsafe(18))
            reply = self.fetch("GET", "/v1/models", credentials=wrong)
            ok = reply.status == 401
            detail = "wrong password: 401" if ok else (
                f"a wrong password got {reply.status}, expected 401"
                + (": passwords are not checked" if reply.status == 200 else "")
            )
            return Check("auth-wrong-password", ok, detail, reply.latency_ms)

        return self._checked("auth-wrong-password", run)

    def models(self, api_names: list[str]) -> Check:
        def run() -> Check:
            reply = self.fetch("GET", "/v1/models", credentials=self.credentials)
            if reply.status != 200:
                return Check("models", False, f"/v1/models got {reply.status}: "
                             f"{_snippet(reply.body)}", reply.latency_ms)
            listed = [entry["id"] for entry in reply.json()["data"]]
            missing = [name for name in api_names if name not in listed]
            detail = (f"missing {', '.join(missing)} (listed: {', '.join(listed) or 'none'}); is "
                      "that service healthy?" if missing else f"lists {', '.join(api_names)}")
            return Check("models", not missing, detail, reply.latency_ms)

        return self._checked("models", run)

    def chat(self, api_name: str) -> Check:
        name = f"chat {api_name}"

        def run() -> Check:
            body = {
                "model": api_name,
                "messages": [{"role": "user", "content": "Say OK."}],
                "max_tokens": 1,
                "temperature": 0,
            }
            reply = self.fetch("POST", "/v1/chat/completions", body=body,
                               credentials=self.credentials)
            if reply.status != 200:
                return Check(name, False, f"got {reply.status}: {_snippet(reply.body)}",
                             reply.latency_ms)
            answer = reply.json()
            choices, usage = answer.get("choices"), answer.get("usage")
            if not choices or not isinstance(usage, dict):
                return Check(name, False, f"200 without a choice and usage: {_snippet(reply.body)}",
                             reply.latency_ms)
            return Check(name, True, f"200, {usage.get('completion_tokens')} completion token(s)",
                         reply.latency_ms)

        return self._checked(name, run)

    def stream(self, api_name: str) -> Check:
        name = f"stream {api_name}"

        def run() -> Check:
            body = {
                "model": api_name,
                "messages": [{"role": "user", "content": "Count from 1 to 100."}],
                "max_tokens": STREAM_TOKENS,
                "ignore_eos": True,  # vLLM: generate all max_tokens, so the stream is long enough
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            sent = time.perf_counter()
            with self.exchange("POST", "/v1/chat/completions", body=body,
                               credentials=self.credentials) as response:
                if response.status != 200:
                    return Check(name, False, f"got {response.status}: "
                                 f"{_snippet(response.read())}", _ms_since(sent))
                kind = response.headers.get("Content-Type", "")
                if not kind.startswith("text/event-stream"):
                    return Check(name, False, f"answer is not an event stream ({kind})",
                                 _ms_since(sent))
                stats = stream_stats(sent, sse_events(response))
            ok, detail = judge_stream(stats)
            return Check(name, ok, detail, stats.first_s * 1000)

        return self._checked(name, run)

    def metrics_need_auth(self, service: str) -> Check:
        name = f"metrics-auth {service}"

        def run() -> Check:
            path = f"/metrics/{service}"
            anonymous = self.fetch("GET", path)
            if anonymous.status == 200:
                return Check(name, False, f"{path} answered 200 without credentials: metrics leak",
                             anonymous.latency_ms)
            allowed = self.fetch("GET", path, credentials=self.credentials)
            ok = allowed.status == 200
            detail = (f"{anonymous.status} without credentials, 200 with" if ok else
                      f"{anonymous.status} without credentials but {allowed.status} with")
            return Check(name, ok, detail, allowed.latency_ms)

        return self._checked(name, run)

    def side_door_closed(self, method: str, path: str) -> Check:
        name = f"closed {path}"

        def run() -> Check:
            body = {"model": "probe", "prompt": "x"} if method == "POST" else None
            reply = self.fetch(method, path, body=body)
            ok = reply.status != 200
            detail = f"{method} {path} without credentials: {reply.status}" if ok else (
                f"{method} {path} answered 200 without credentials: vLLM's {path} is exposed")
            return Check(name, ok, detail, reply.latency_ms)

        return self._checked(name, run)


# --------------------------------------------------------------------------- judging a stream


@dataclass(frozen=True)
class StreamStats:
    tokens: int  # completion tokens (usage when sent, else content-bearing events)
    events: int  # data events before [DONE]
    arrivals: int  # distinct arrival times of those events (one network burst counts once)
    first_s: float  # request sent → first data event
    total_s: float  # request sent → last event
    done: bool  # `data: [DONE]` arrived


def sse_events(response: http.client.HTTPResponse) -> Iterator[tuple[float, str]]:
    """(arrival time, data) of each server-sent event, as the lines come off the socket."""
    data: list[str] = []
    arrived = 0.0
    for raw in iter(response.readline, b""):
        now = time.perf_counter()
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield arrived, "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            if not data:
                arrived = now
            data.append(value.removeprefix(" "))
    if data:
        yield arrived, "\n".join(data)


def stream_stats(sent: float, events: Iterator[tuple[float, str]]) -> StreamStats:
    times: list[float] = []
    content_events = 0
    usage_tokens = None
    done = False
    for arrived, data in events:
        times.append(arrived)
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage_tokens = chunk["usage"].get("completion_tokens")
        if any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", [])):
            content_events += 1
    arrivals = sum(
        1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] >= SAME_ARRIVAL_S
    )
    return StreamStats(
        tokens=usage_tokens if usage_tokens is not None else content_events,
        events=len(times) - done,
        arrivals=arrivals,
        first_s=(times[0] - sent) if times else 0.0,
        total_s=(times[-1] - sent) if times else 0.0,
        done=done,
    )


def judge_stream(stats: StreamStats) -> tuple[bool, str]:
    """Incremental means: many arrival times, the first well before the stream ends."""
    if not stats.done:
        return False, f"stream ended without `data: [DONE]` after {stats.events} event(s)"
    if stats.tokens < MIN_STREAM_TOKENS:
        return False, (f"only {stats.tokens} token(s) streamed (asked {STREAM_TOKENS} with "
                       f"ignore_eos); at least {MIN_STREAM_TOKENS} are needed to judge buffering")
    chunks = f"{stats.arrivals} chunk{'s' if stats.arrivals != 1 else ''}"
    if stats.arrivals < MIN_ARRIVALS or stats.first_s > FIRST_CHUNK_BEFORE * stats.total_s:
        when = (f"after {stats.total_s:.2f} s" if stats.arrivals == 1 else
                f"the first after {stats.first_s:.2f} s of {stats.total_s:.2f} s")
        return False, (f"stream arrived in {chunks} {when}: the proxy buffers SSE — "
                       "proxy_buffering must be off")
    return True, (f"{stats.tokens} tokens in {chunks} over {stats.total_s:.2f} s, first after "
                  f"{stats.first_s:.2f} s")


# --------------------------------------------------------------------------- small helpers


def basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _max_age(hsts: str) -> int:
    for part in hsts.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "max-age" and value.strip('"').isdigit():
            return int(value.strip('"'))
    return 0


def _snippet(body: bytes, limit: int = 160) -> str:
    text = body.decode(errors="replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"
