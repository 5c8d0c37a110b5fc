"""The front-door gate: prove through nginx, as a client would, that the site is safe and serves.

"Healthy" containers are not enough: a proxy that buffers event streams, auth that is off, a
certificate from the wrong CA or vLLM's side doors (/metrics, /invocations, /tokenize) left open
all pass a healthcheck. The gate connects to the published HTTPS port, verifies TLS the way
clients do, authenticates as kit's own probe identity (never a person's password), runs a real
completion per service and times a streamed one chunk by chunk.

Stdlib only (http.client + ssl): a client library could buffer, retry or follow redirects and
so hide exactly what the gate must see.
"""

import datetime as dt
import http.client
import json
import secrets
import socket
import ssl
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import cast
from urllib.parse import urlsplit

from kit.credentials.material import GATE_HEADER, gate_mark
from kit.files import atomic_write
from kit.front_door.client import (
    DoorClient,
    DoorConnection,
    ProbeFailure,
    Target,
    basic_header,
    ms_since,
    probe_password,
    target_for,
)
from kit.layout import PROBE_USER, SiteLayout
from kit.plan.waker import PROBE_ASLEEP
from kit.spec.model import Service, Spec
from kit.spec.vllm_flags import EMBED, GENERATE

STREAM_TOKENS = 24  # asked for, with ignore_eos, so the stream is long enough to judge
# A service asleep (idle_sleep) gets no completion: vLLM holds one until a wake, and the probe
# never wakes a model (docs/sleep.md).
ASLEEP_SKIP = "skipped: asleep (idle_sleep); the probe does not wake it (kit wake does)"
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


def run_probe(
    spec: Spec, layout: SiteLayout, *, address: str | None = None, timeout: float = 30,
    replicas: Callable[[], list[Check]] = list, asleep: frozenset[str] = frozenset(),
) -> ProbeResult:
    """Run every check against the live front door, then `replicas` (each replica on its own,
    kit/front_door/replica_check.py); record the result in .kit/last-probe.json. The services
    in `asleep` (idle_sleep, docs/sleep.md) get no completion: vLLM would hold it until woken."""
    target = target_for(spec, layout, address, timeout)
    gate = Gate(target, probe_password(layout), gate_mark(layout))
    checks = gate.run(spec.services, asleep) + replicas()
    result = ProbeResult(
        target=f"https://{target.https_authority} via {target.address}",
        checked_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        checks=tuple(checks),
    )
    record = json.dumps(result.to_json(), indent=1, ensure_ascii=False) + "\n"
    atomic_write(layout.last_probe, record.encode())
    return result


# What proves a model answers, through the door (the gate) and on each replica (replica_check):
# a generative model completes one token; an embedding model embeds a short text.
PROOF_NAMES = {GENERATE: "a 1-token completion", EMBED: "an embedding"}
PROOF_PARTS = {GENERATE: "a choice and usage", EMBED: "an embedding vector and usage"}


def _fell_asleep(status: int, body: bytes) -> bool:
    """The waker's 503 to the probe: the model (idle_sleep) fell asleep after the gate asked
    /is_sleeping, and the probe never wakes it (docs/sleep.md)."""
    return status == 503 and PROBE_ASLEEP.encode() in body


def proof_request(task: str, api_name: str) -> tuple[str, dict]:
    """(path, JSON body) of the smallest real request for a model of `task`."""
    if task == EMBED:
        return "/v1/embeddings", {"model": api_name, "input": "Say OK."}
    return "/v1/chat/completions", {"model": api_name, "max_tokens": 1, "temperature": 0,
                                    "messages": [{"role": "user", "content": "Say OK."}]}


def answer_check_name(api_name: str, task: str) -> str:
    """The gate's name for a model's answer check (`chat X`, `embed X`), run or skipped."""
    return f"{'embed' if task == EMBED else 'chat'} {api_name}"


def proof_detail(task: str, answer: dict) -> str:
    """What the answer shows; KeyError, IndexError or TypeError when it lacks PROOF_PARTS."""
    if task == EMBED:
        vector, usage = answer["data"][0]["embedding"], answer["usage"]
        if not isinstance(vector, list) or not vector or not isinstance(usage, dict):
            raise TypeError("no vector")
        return f"a {len(vector)}-dimension embedding"
    if not answer["choices"] or not isinstance(answer["usage"], dict):
        raise TypeError("no choice")
    return f"{answer['usage'].get('completion_tokens')} completion token(s)"


# --------------------------------------------------------------------------- HTTP as a client


class Gate(DoorClient):
    """The checks, in order; each returns a Check and never raises for a network problem. The
    requests it makes to be refused carry its mark (`gate_mark`), so the usage ledger records
    them as kit's own checks, not refusals a person caused (docs/usage.md)."""

    def __init__(self, target: Target, password: str, mark: str | None = None) -> None:
        super().__init__(target, password)
        self.refused_on_purpose = {GATE_HEADER: mark} if mark else {}

    def run(self, services: Sequence[Service],
            asleep: frozenset[str] = frozenset()) -> list[Check]:
        tls = self.tls()
        checks = [tls, self.http_redirect()]
        if not tls.ok:
            return checks  # nothing over HTTPS can be trusted or even reached
        checks += [self.legacy_tls_refused(), self.protocols(), *self.auth_required()]
        checks += [self.wrong_password_refused(), self.models([s.api_name for s in services])]
        awake = [s for s in services if s.name not in asleep]
        checks += [self.answer(s.api_name, s.task) for s in awake]
        checks += [self.stream(s.api_name) for s in awake if s.task == GENERATE]
        checks += [Check(answer_check_name(s.api_name, s.task), True, ASLEEP_SKIP, skipped=True)
                   for s in services if s.name in asleep]
        checks += [self.metrics_need_auth(s.name) for s in services]
        checks += [self.side_door_closed(method, path) for method, path in SIDE_DOORS]
        return checks

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
            connection = DoorConnection(self.target, self.context)
            started = time.perf_counter()
            try:
                connection.connect()
                version = cast(ssl.SSLSocket, connection.sock).version()  # a TLS context
            except OSError as error:
                raise ProbeFailure(self._explain(error, tls=True)) from error
            finally:
                connection.close()
            trust = (f"tls.ca_bundle ({self.target.ca_file})" if self.target.bundle
                     else f"the kit CA ({self.target.ca_file})" if self.target.ca_file
                     else "system CAs")
            return Check(
                "tls", True, f"{version}, certificate for {self.target.domain} verified against "
                f"{trust}", ms_since(started),
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
            connection = DoorConnection(self.target, context)
            try:
                connection.connect()
                return cast(ssl.SSLSocket, connection.sock).selected_alpn_protocol()
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
                             "kit render writes it)", ms_since(started))
            if h1 not in ("http/1.1", None):
                return Check(name, False, f"a client offering only http/1.1 got {h1}",
                             ms_since(started))
            return Check(name, True, "ALPN: h2 when offered, http/1.1 otherwise",
                         ms_since(started))

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
            return Check(name, True, f"TLS 1.1 refused ({error.reason})", ms_since(started))
        except (ConnectionResetError, BrokenPipeError):
            return Check(name, True, "TLS 1.1 refused (connection reset)", ms_since(started))
        except OSError as error:
            return Check(name, False, self._explain(error, tls=True))
        return Check(name, False, f"the server accepted {accepted}: nginx must allow only "
                     "ssl_protocols TLSv1.2 TLSv1.3", ms_since(started))

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
            reply = self.fetch("GET", "/v1/models", extra=self.refused_on_purpose)
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
            reply = self.fetch("GET", "/v1/models", credentials=wrong,
                               extra=self.refused_on_purpose)
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

    def answer(self, api_name: str, task: str) -> Check:
        """One real answer of the model: a 1-token chat completion, or an embedding."""
        path, body = proof_request(task, api_name)
        name = answer_check_name(api_name, task)

        def run() -> Check:
            reply = self.fetch("POST", path, body=body, credentials=self.credentials)
            if _fell_asleep(reply.status, reply.body):
                return Check(name, True, ASLEEP_SKIP, skipped=True)
            if reply.status != 200:
                return Check(name, False, f"got {reply.status}: {_snippet(reply.body)}",
                             reply.latency_ms)
            try:
                detail = proof_detail(task, reply.json())
            except (KeyError, IndexError, TypeError):
                return Check(name, False, f"200 without {PROOF_PARTS[task]}: "
                             f"{_snippet(reply.body)}", reply.latency_ms)
            return Check(name, True, f"200, {detail}", reply.latency_ms)

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
                    text = response.read()
                    if _fell_asleep(response.status, text):
                        return Check(name, True, ASLEEP_SKIP, skipped=True)
                    return Check(name, False, f"got {response.status}: {_snippet(text)}",
                                 ms_since(sent))
                kind = response.headers.get("Content-Type", "")
                if not kind.startswith("text/event-stream"):
                    return Check(name, False, f"answer is not an event stream ({kind})",
                                 ms_since(sent))
                stats = stream_stats(sent, sse_events(response))
            ok, detail = judge_stream(stats)
            return Check(name, ok, detail, stats.first_s * 1000)

        return self._checked(name, run)

    def metrics_need_auth(self, service: str) -> Check:
        name = f"metrics-auth {service}"

        def run() -> Check:
            path = f"/metrics/{service}"
            anonymous = self.fetch("GET", path, extra=self.refused_on_purpose)
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
            reply = self.fetch(method, path, body=body, extra=self.refused_on_purpose)
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


def _max_age(hsts: str) -> int:
    for part in hsts.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "max-age" and value.strip('"').isdigit():
            return int(value.strip('"'))
    return 0


def _snippet(body: bytes, limit: int = 160) -> str:
    text = body.decode(errors="replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"
