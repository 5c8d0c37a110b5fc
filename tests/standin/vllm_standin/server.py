"""HTTP/1.1 front of the stand-in: vLLM's OpenAI-compatible routes on a bare asyncio protocol.

Responses copy what vLLM 0.20 sent on a real GPU (shared/reference/vllm-0.20-observed/
http-trace.json): header names, JSON field order, SSE chunk layout, error bodies. Keep-alive and
pipelined requests are handled; streamed bodies use chunked transfer encoding. Stream chunks are
built from precomputed byte prefixes so hundreds of concurrent streams stay cheap.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import re
import secrets
import socket
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from . import VERSION, logs, lora
from .calibration import ApiProcess, ApiServers
from .engine import Engine, Request
from .responses import (
    ResponsesCollectSink,
    ResponseShape,
    ResponsesStreamSink,
    embedding,
    embedding_body,
    embedding_inputs,
)
from .sleep import SleepMode

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
SITE_PACKAGES = "/usr/local/lib/python3.12/dist-packages"
MAX_HEADER_BYTES = 65536
WORD = re.compile(r"\s*\w+|\s*[^\w\s]")
DONE = b"data: [DONE]\n\n"  # a stream's last message


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# pydantic's lax-mode booleans (what vLLM's request models accept for a bool field)
TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})


def lax_bool(value: object) -> bool:
    """A request's boolean as pydantic reads it in lax mode: true, 1, 1.0 and the words
    "1", "on", "t", "true", "y", "yes" (any case) are true; anything else here is false."""
    if isinstance(value, str):
        return value.lower() in TRUE_WORDS
    return value is True or (isinstance(value, int | float) and value == 1)


def error_body(message: str, err_type: str, param: str | None, code: int) -> bytes:
    return dumps({"error": {"message": message, "type": err_type, "param": param, "code": code}})


class HttpError(Exception):
    pass


@dataclass
class HttpRequest:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def parse_request(buffer: bytearray) -> tuple[HttpRequest | None, bool]:
    """(the first complete request, whether it waits for `100 Continue`); consumes it."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise HttpError("header too large")
        return None, False
    try:
        head = buffer[:end].decode("latin-1").split("\r\n")
        method, target, version = head[0].split(" ")
    except ValueError as e:
        raise HttpError("bad request line") from e
    if not version.startswith("HTTP/1."):
        raise HttpError("bad version")
    headers: dict[str, str] = {}
    for header_line in head[1:]:
        name, sep, value = header_line.partition(":")
        if not sep:
            raise HttpError("bad header")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        pos = start
        while True:
            eol = buffer.find(b"\r\n", pos)
            if eol < 0:
                return None, headers.get("expect", "").lower() == "100-continue"
            try:
                size = int(bytes(buffer[pos:eol]).split(b";")[0], 16)
            except ValueError as e:
                raise HttpError("bad chunk size") from e
            if len(buffer) < eol + 2 + size + 2:
                return None, headers.get("expect", "").lower() == "100-continue"
            body += buffer[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
            if size == 0:
                break
        consumed = pos
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as e:
            raise HttpError("bad content-length") from e
        if len(buffer) < start + length:
            return None, headers.get("expect", "").lower() == "100-continue"
        body = buffer[start : start + length]
        consumed = start + length
    del buffer[:consumed]
    return HttpRequest(method, target, version, headers, bytes(body)), False


_date_cache = [0, ""]


def http_date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[:] = [now, email.utils.formatdate(now, usegmt=True)]
    return _date_cache[1]


class Connection(asyncio.Protocol):
    def __init__(self, app: App):
        self.app = app
        self.buffer = bytearray()
        self.busy = False
        self.keep_alive = True
        self.chunked = True
        self.continued = False
        self.active: Request | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ("", 0)
        self.idle: asyncio.TimerHandle | None = None
        self.received = 0.0  # when the pending request's first bytes were read (monotonic)
        self.process: ApiProcess | None = None  # the API-server process that accepted it

    # --- asyncio protocol ------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # like uvicorn, whose asyncio sockets get TCP_NODELAY: the socket bound here has
            # proto 0, which asyncio skips, and Nagle then held a chunk until the client's
            # delayed ACK (a TTFT under 40 ms came out as 40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = transport.get_extra_info("peername") or ("", 0)
        self.app.connections.add(self)
        if self.app.api_server.active:
            self.process = self.app.api_server.assign()

    def _await_next_request(self) -> None:
        """Like uvicorn's timeout_keep_alive: armed when a response completed (not when the
        connection opened), a connection idle that long after its last response is closed."""
        self.idle = asyncio.get_running_loop().call_later(
            self.app.keep_alive_timeout, self.transport.close
        )

    def _stop_idle_timer(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None

    def data_received(self, data: bytes) -> None:
        self._stop_idle_timer()
        if not self.buffer:
            self.received = time.monotonic()
        self.buffer += data
        if not self.busy:
            self._next()

    def connection_lost(self, exc) -> None:
        self._stop_idle_timer()
        self.app.connections.discard(self)
        if self.process is not None:
            self.process.connections -= 1
        if self.active is not None:
            self.app.engine.abort(self.active)
            self.active = None

    def _next(self) -> None:
        while not self.busy and not self.transport.is_closing():
            try:
                request, wants_continue = parse_request(self.buffer)
            except HttpError:
                self.keep_alive = False
                body = b"Invalid HTTP request received."
                self.transport.write(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
                )
                self.transport.close()
                return
            if request is None:
                if wants_continue and not self.continued:
                    self.continued = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            self.continued = False
            self.busy = True
            connection = request.headers.get("connection", "").lower()
            if request.version == "HTTP/1.0":
                self.keep_alive = connection == "keep-alive"
                self.chunked = False
            else:
                self.keep_alive = connection != "close"
            if self.process is None:
                self.app.dispatch(self, request)
            else:  # read by its API-server process once that has the time
                self.process.read(self.app.api_server.request_s,
                                  lambda request=request: self._dispatch(request))

    def _dispatch(self, request: HttpRequest) -> None:
        if not self.transport.is_closing():
            self.app.dispatch(self, request)

    def _finish(self) -> None:
        self.active = None
        self.busy = False
        if not self.keep_alive:
            self.transport.close()
        elif self.buffer:
            asyncio.get_running_loop().call_soon(self._next)
        else:
            self._await_next_request()

    # --- responses -------------------------------------------------------------------------

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Date: {http_date()}",
            "Server: uvicorn",
        ]
        lines += [f"{k}: {v}" for k, v in headers]
        lines.append("Vary: Origin")
        if not self.keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send(
        self,
        request: HttpRequest,
        status: int,
        body: bytes = b"",
        content_type: str | None = "application/json",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        head = [("Content-Length", str(len(body)))]
        if content_type:
            head.append(("Content-Type", content_type))
        self.transport.write(self._head(status, head + list(headers)) + body)
        self.app.access(self, request, status)
        self._finish()

    def start_stream(self, request: HttpRequest) -> None:
        head = [("Content-Type", "text/event-stream; charset=utf-8")]
        if self.chunked:
            head.append(("Transfer-Encoding", "chunked"))
        self.transport.write(self._head(200, head))
        self.app.access(self, request, 200)

    def write_events(self, *payloads: bytes, end: bool = False, usage_chunks: int = 0) -> None:
        """The SSE messages of one engine step in one write (one send), `end` closing the body:
        at hundreds of streams a step's sends are the stand-in's hot path. Calibrated, they are
        written once the connection's API-server process has spent their CPU: one chunk per
        message but `data: [DONE]`, `usage_chunks` of them carrying usage (calibration.py)."""
        if self.process is None:
            self.send_events(payloads, end)
            return
        cost = self.app.api_server.cost(sum(p != DONE for p in payloads), usage_chunks)
        self.process.run(cost, lambda: self.send_events(payloads, end))

    def send_events(self, payloads: tuple[bytes, ...], end: bool) -> None:
        if not self.transport.is_closing():
            if self.chunked:
                data = b"".join([b"%x\r\n%b\r\n" % (len(p), p) for p in payloads])
                self.transport.write(data + b"0\r\n\r\n" if end else data)
            else:
                self.transport.write(b"".join(payloads))
        if end:
            self._finish()


class App:
    def __init__(
        self,
        *,
        engine: Engine,
        served_names: list[str],
        root: str,
        max_model_len: int,
        api_keys: list[str],
        vocab_size: int,
        default_max_tokens: int,
        force_usage: bool,
        access_log: bool,
        log_stats: bool,
        keep_alive_timeout: float = 5.0,
        tasks: tuple[str, ...] = ("generate",),
        hidden_size: int = 4096,
        adapters: lora.Adapters | None = None,
        sleep: SleepMode | None = None,
        api_server: ApiServers | None = None,
    ):
        self.engine = engine
        self.api_server = api_server or ApiServers()  # its processes and their CPU
        self.adapters = adapters
        self.sleep = sleep  # dev mode (VLLM_SERVER_DEV_MODE=1): tests/standin/vllm_standin/sleep.py
        self.hidden_size = hidden_size
        self.served_names = served_names
        self.root = root
        self.max_model_len = max_model_len
        self.key_hashes = {hashlib.sha256(k.encode()).digest() for k in api_keys}
        self.vocab_size = vocab_size
        self.default_max_tokens = default_max_tokens
        self.force_usage = force_usage
        self.access_log = access_log
        self.log_stats = log_stats
        self.keep_alive_timeout = keep_alive_timeout
        self.created = int(time.time())
        self.connections: set[Connection] = set()
        # http_requests_total as vLLM's HTTP instrumentation counts it: route, method, status class
        self.responses: dict[tuple[str, str, str], int] = {}
        self.routes = {
            "/health": ({"GET"}, self.health),
            "/ping": ({"GET", "POST"}, self.health),
            "/version": ({"GET"}, self.version),
            "/v1/models": ({"GET"}, self.models),
            "/tokenize": ({"POST"}, self.tokenize),
            "/metrics": ({"GET"}, self.metrics),
        }
        # as vLLM registers them: the generation routes for a generative model, the embeddings
        # route for a pooling one (--runner pooling / --convert embed)
        if "generate" in tasks:
            self.routes.update({
                "/v1/chat/completions": ({"POST"}, self.chat),
                "/v1/completions": ({"POST"}, self.completions),
                "/v1/responses": ({"POST"}, self.create_responses),
                "/invocations": ({"POST"}, self.invocations),
            })
        if "embed" in tasks:
            self.routes["/v1/embeddings"] = ({"POST"}, self.embeddings)
        if adapters is not None and lora.runtime_updates():  # as vLLM registers them
            self.routes["/v1/load_lora_adapter"] = ({"POST"}, self.load_lora_adapter)
            self.routes["/v1/unload_lora_adapter"] = ({"POST"}, self.unload_lora_adapter)
        if sleep is not None:
            self.routes.update(sleep.routes())

    def access(self, conn: Connection, request: HttpRequest, status: int) -> None:
        if request.path in self.routes:
            key = (request.path, request.method, f"{status // 100}xx")
            self.responses[key] = self.responses.get(key, 0) + 1
        if self.access_log:
            host, port = conn.peer[0], conn.peer[1]
            logs.raw(
                logs.API,
                f'INFO:     {host}:{port} - "{request.method} {request.target} '
                f'{request.version}" {status} {HTTPStatus(status).phrase}',
                sys.stdout,
            )

    def dispatch(self, conn: Connection, request: HttpRequest) -> None:
        path = request.path
        if (
            self.key_hashes
            and request.method != "OPTIONS"
            and path.startswith(GUARDED_PREFIX)
            and not self._authorized(request)
        ):
            conn.send(request, 401, dumps({"error": "Unauthorized"}))
            return
        route = self.routes.get(path)
        if route is None:
            conn.send(request, 404, dumps({"detail": "Not Found"}))
            return
        methods, handler = route
        if request.method not in methods:
            conn.send(
                request,
                405,
                dumps({"detail": "Method Not Allowed"}),
                headers=(("Allow", ", ".join(sorted(methods))),),
            )
            return
        handler(conn, request)

    def _authorized(self, request: HttpRequest) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme == "Bearer" and hashlib.sha256(token.encode()).digest() in self.key_hashes

    # --- simple routes ---------------------------------------------------------------------

    def health(self, conn: Connection, request: HttpRequest) -> None:
        conn.send(request, 200, b"", content_type=None)

    def version(self, conn: Connection, request: HttpRequest) -> None:
        conn.send(request, 200, dumps({"version": VERSION}))

    def models(self, conn: Connection, request: HttpRequest) -> None:
        base = [{"id": name, "root": self.root, "parent": None,
                 "max_model_len": self.max_model_len} for name in self.served_names]
        cards = base + (self.adapters.cards() if self.adapters else [])
        data = [
            {
                "id": card["id"],
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": card["root"],
                "parent": card["parent"],
                "max_model_len": card["max_model_len"],
                "permission": [
                    {
                        "id": f"modelperm-{secrets.token_hex(8)}",
                        "object": "model_permission",
                        "created": self.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for card in cards
        ]
        conn.send(request, 200, dumps({"object": "list", "data": data}))

    def load_lora_adapter(self, conn: Connection, request: HttpRequest) -> None:
        """vLLM's runtime load: 200 with a plain-text line, or its JSON error; the stand-in
        takes STANDIN_LORA_LOAD_SECONDS to load (other requests are served meanwhile)."""
        body = self._json_body(conn, request, "load_lora_adapter")
        if body is None or self.adapters is None:
            return
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            conn.send(request, 400, error_body("Both 'lora_name' and 'lora_path' must be "
                                               "provided.", "InvalidUserInput", None, 400))
            return
        adapters = self.adapters

        def finish() -> None:
            try:
                adapters.load(name, path)
            except lora.LoraError as error:
                conn.send(request, error.status, error_body(error.message, error.err_type,
                                                            None, error.status))
                return
            conn.send(request, 200, f"Success: LoRA adapter '{name}' added successfully."
                      .encode(), content_type="text/plain; charset=utf-8")

        asyncio.get_running_loop().call_later(adapters.load_s, finish)

    def unload_lora_adapter(self, conn: Connection, request: HttpRequest) -> None:
        body = self._json_body(conn, request, "unload_lora_adapter")
        if body is None or self.adapters is None:
            return
        name = body.get("lora_name")
        try:
            self.adapters.unload(str(name))
        except lora.LoraError as error:
            conn.send(request, error.status, error_body(error.message, error.err_type, None,
                                                        error.status))
            return
        conn.send(request, 200, f"Success: LoRA adapter '{name}' removed successfully."
                  .encode(), content_type="text/plain; charset=utf-8")

    def metrics(self, conn: Connection, request: HttpRequest) -> None:
        v = sys.version_info
        text = (
            "# HELP python_info Python platform information\n# TYPE python_info gauge\n"
            f'python_info{{implementation="CPython",major="{v.major}",minor="{v.minor}",'
            f'patchlevel="{v.micro}",version="{v.major}.{v.minor}.{v.micro}"}} 1.0\n'
        )
        text += (
            "# HELP http_requests_total Total number of requests by method, status and handler.\n"
            "# TYPE http_requests_total counter\n"
        )
        for (handler, method, status), count in sorted(self.responses.items()):
            text += (f'http_requests_total{{handler="{handler}",method="{method}",'
                     f'status="{status}"}} {float(count)}\n')
        if self.log_stats:
            text += self.engine.metrics()
            if self.sleep is not None:
                text += self.sleep.metrics()
            if self.api_server.active:
                text += self.api_server.metrics()
        conn.send(request, 200, text.encode(), "text/plain; version=1.0.0; charset=utf-8")

    # --- tokenization ----------------------------------------------------------------------

    def _tokens(self, text: str) -> list[str]:
        return WORD.findall(text)

    def _chat_tokens(self, messages: list) -> list[str]:
        tokens = ["<s>"]
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            role = message.get("role", "user") if isinstance(message, dict) else "user"
            tokens += [
                "<|start|>",
                str(role),
                "<|sep|>",
                *self._tokens(str(content or "")),
                "<|end|>",
            ]
        return [*tokens, "<|start|>", "assistant", "<|sep|>"]

    def _prompt_tokens(self, prompt: object) -> list[str]:
        if isinstance(prompt, list):
            if all(isinstance(p, int) for p in prompt):
                return [str(p) for p in prompt]
            return [t for p in prompt for t in self._prompt_tokens(p)]
        return ["<s>", *self._tokens(str(prompt))]

    def _token_id(self, token: str) -> int:
        return zlib.crc32(token.encode()) % self.vocab_size

    # --- request validation ----------------------------------------------------------------

    def _json_body(self, conn: Connection, request: HttpRequest, handler: str) -> dict | None:
        try:
            body = json.loads(request.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            pos, msg = (e.pos, e.msg) if isinstance(e, json.JSONDecodeError) else (0, str(e))
            detail = (
                f"{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': 'JSON decode "
                f"error', 'input': {{}}, 'ctx': {{'error': '{msg}'}}}}"
            )
            message = (
                f'1 validation error:\n  {detail}\n\n  File "{SITE_PACKAGES}/vllm/'
                f'entrypoints/utils.py", line 40, in {handler}\n    {request.method} '
                f"{request.path} [{detail}]"
            )
            conn.send(request, 400, error_body(message, "Bad Request", None, 400))
            return None
        if not isinstance(body, dict):
            detail = (
                f"{{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input "
                f"should be a valid dictionary or object to extract fields from', "
                f"'input': {body!r}}}"
            )
            conn.send(
                request,
                400,
                error_body(f"1 validation error:\n  {detail}", "Bad Request", None, 400),
            )
            return None
        return body

    def _missing(self, conn: Connection, request: HttpRequest, body: dict, field: str) -> None:
        detail = (
            f"{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required', "
            f"'input': {body!r}}}"
        )
        conn.send(
            request, 400, error_body(f"1 validation error:\n  {detail}", "Bad Request", None, 400)
        )

    def _model(self, conn: Connection, request: HttpRequest, body: dict) -> str | None:
        model = body.get("model")
        if model is None:
            return self.served_names[0]
        if model not in self.served_names and not (self.adapters and
                                                    model in self.adapters.loaded):
            conn.send(
                request,
                404,
                error_body(f"The model `{model}` does not exist.", "NotFoundError", "model", 404),
            )
            return None
        return model

    def _is_priority(self, conn: Connection, request: HttpRequest, value: object) -> bool:
        """vLLM's `priority: int = 0` (the priority scheduler's order; fcfs ignores it)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return True
        conn.send(request, 400, error_body(
            f"1 validation error:\n  {{'type': 'int_type', 'loc': ('body', 'priority'), "
            f"'msg': 'Input should be a valid integer', 'input': {value!r}}}",
            "BadRequestError", None, 400))
        return False

    def _max_tokens(self, conn: Connection, request: HttpRequest, body: dict) -> int | None:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        if value is None:
            return self.default_max_tokens
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            conn.send(
                request,
                400,
                error_body(
                    f"max_tokens must be at least 1, got {value}.",
                    "BadRequestError",
                    "max_tokens",
                    400,
                ),
            )
            return None
        if value > self.max_model_len:
            conn.send(
                request,
                400,
                error_body(
                    f"max_tokens={value} cannot be greater than max_model_len=max_total_tokens="
                    f"{self.max_model_len}. Please request fewer output tokens. "
                    f"(parameter=max_tokens, value={value})",
                    "BadRequestError",
                    "max_tokens",
                    400,
                ),
            )
            return None
        return value

    def _usage_options(
        self, conn: Connection, request: HttpRequest, body: dict
    ) -> tuple[bool, bool] | None:
        """(include_usage, continuous_usage_stats) of a request, as vLLM 0.33 decides them:
        `stream_options` only with a true `stream` (else 400); a `stream_options` object that
        omits include_usage means true (StreamOptions' default); continuous usage only with
        include_usage; --enable-force-include-usage means both, whatever the client sent.
        Booleans are read as pydantic's lax mode reads them (true, 1, "yes", ...)."""
        options = body.get("stream_options")
        if options and not body.get("stream"):
            conn.send(request, 400, error_body(
                "Stream options can only be defined when `stream=True`.", "BadRequestError",
                "stream_options", 400))
            return None
        if self.force_usage:
            return True, True
        if not isinstance(options, dict):
            return False, False
        include = lax_bool(options.get("include_usage", True))
        continuous = lax_bool(options.get("continuous_usage_stats", False))
        return include, include and continuous

    # --- generation ------------------------------------------------------------------------

    def chat(
        self, conn: Connection, request: HttpRequest, handler: str = "create_chat_completion"
    ) -> None:
        body = self._json_body(conn, request, handler)
        if body is None:
            return
        if not isinstance(body.get("messages"), list):
            self._missing(conn, request, body, "messages")
            return
        tokens = self._chat_tokens(body["messages"])
        # vLLM's `return_token_ids` (a non-streamed chat's ids: the prompt's after the usage)
        ids = [self._token_id(t) for t in tokens] if lax_bool(body.get("return_token_ids")) \
            else None
        self._generate(conn, request, body, chat=True, tokens=tokens, prompt_ids=ids)

    def completions(
        self, conn: Connection, request: HttpRequest, handler: str = "create_completion"
    ) -> None:
        body = self._json_body(conn, request, handler)
        if body is None:
            return
        if "prompt" not in body:
            self._missing(conn, request, body, "prompt")
            return
        self._generate(conn, request, body, chat=False, tokens=self._prompt_tokens(body["prompt"]))

    def invocations(self, conn: Connection, request: HttpRequest) -> None:
        body = self._json_body(conn, request, "invocations")
        if body is None:
            return
        if "prompt" in body and "messages" not in body:
            self._generate(
                conn,
                request,
                body,
                chat=False,
                tokens=self._prompt_tokens(body["prompt"]),
            )
        elif isinstance(body.get("messages"), list):
            self._generate(
                conn,
                request,
                body,
                chat=True,
                tokens=self._chat_tokens(body["messages"]),
            )
        else:
            self._missing(conn, request, body, "messages")

    def create_responses(self, conn: Connection, request: HttpRequest) -> None:
        """POST /v1/responses: `input` (a text or a list of messages) after `instructions`,
        up to `max_output_tokens` (default: what max_model_len leaves, as vLLM); the usage in
        the body, or in the stream's `response.completed` event only."""
        body = self._json_body(conn, request, "create_responses")
        if body is None:
            return
        if not isinstance(body.get("input"), str | list):
            self._missing(conn, request, body, "input")
            return
        model = self._model(conn, request, body)
        if model is None:
            return
        given = body["input"]
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if isinstance(body.get("instructions"), str):
            messages = [{"role": "system", "content": body["instructions"]}, *messages]
        tokens = self._chat_tokens(messages)
        prompt_tokens = len(tokens)
        limit = body.get("max_output_tokens")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 1):
            conn.send(request, 400, error_body(f"max_tokens must be at least 1, got {limit}.",
                                               "BadRequestError", "max_output_tokens", 400))
            return
        max_tokens = limit or max(1, self.max_model_len - prompt_tokens)
        shape = ResponseShape(body, model=model, max_tokens=max_tokens,
                              prompt_tokens=prompt_tokens)
        if lax_bool(body.get("stream", False)):
            sink: ResponsesStreamSink | ResponsesCollectSink = ResponsesStreamSink(conn, shape)
            conn.start_stream(request)
            conn.write_events(sink.opening())
        else:
            sink = ResponsesCollectSink(conn, request, shape)
        job = Request(prompt_tokens, max_tokens, sink.on_token, conn.received)
        job.lora = model if self.adapters and model in self.adapters.loaded else None
        job.tokens = tokens
        conn.active = job
        if self.sleep is None:
            self.engine.add(job)
        else:  # held while asleep, as vLLM holds it; a client gone meanwhile aborted it
            self.sleep.admit(lambda: None if job.finished else self.engine.add(job))

    def embeddings(self, conn: Connection, request: HttpRequest) -> None:
        """POST /v1/embeddings (a pooling model): one vector per input, made up; its prompt
        tokens counted by the engine as vLLM counts a pooling request's prompt."""
        body = self._json_body(conn, request, "create_embedding")
        if body is None:
            return
        inputs = embedding_inputs(body.get("input"))
        if inputs is None:
            self._missing(conn, request, body, "input")
            return
        model = self._model(conn, request, body)
        if model is None:
            return
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            conn.send(request, 400, error_body(
                f"Unsupported encoding_format: {encoding!r}", "BadRequestError",
                "encoding_format", 400))
            return
        tokens = [self._prompt_tokens(item) for item in inputs]
        prompt_tokens = sum(len(t) for t in tokens)
        self.engine.pooled(prompt_tokens)
        vectors = [embedding(t, self.hidden_size, encoding) for t in tokens]
        conn.send(request, 200, embedding_body(model, vectors, prompt_tokens))

    def tokenize(self, conn: Connection, request: HttpRequest) -> None:
        body = self._json_body(conn, request, "tokenize")
        if body is None or self._model(conn, request, body) is None:
            return
        if isinstance(body.get("messages"), list):
            tokens = self._chat_tokens(body["messages"])
        elif "prompt" in body:
            tokens = self._prompt_tokens(body["prompt"])
        else:
            self._missing(conn, request, body, "prompt")
            return
        ids = [self._token_id(t) for t in tokens]
        conn.send(
            request,
            200,
            dumps(
                {
                    "count": len(ids),
                    "max_model_len": self.max_model_len,
                    "tokens": ids,
                    "token_strs": None,
                }
            ),
        )

    def _generate(
        self, conn: Connection, request: HttpRequest, body: dict, *, chat: bool,
        tokens: list[str], prompt_ids: list[int] | None = None
    ) -> None:
        prompt_tokens = len(tokens)
        model = self._model(conn, request, body)
        if model is None:
            return
        max_tokens = self._max_tokens(conn, request, body)
        if max_tokens is None:
            return
        usage = self._usage_options(conn, request, body)
        priority = body.get("priority", 0)
        if usage is None or not self._is_priority(conn, request, priority):
            return
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(8)
        if body.get("stream"):
            sink = StreamSink(
                conn,
                chat=chat,
                rid=rid,
                created=created,
                model=model,
                prompt_tokens=prompt_tokens,
                usage=usage[0],
                continuous=usage[1],
            )
            conn.start_stream(request)
        else:
            sink = CollectSink(
                conn,
                request,
                chat=chat,
                rid=rid,
                created=created,
                model=model,
                prompt_tokens=prompt_tokens,
                token_ids=None if prompt_ids is None else (prompt_ids, self._token_id),
            )
        job = Request(prompt_tokens, max_tokens, sink.on_token, conn.received, priority)
        job.lora = model if self.adapters and model in self.adapters.loaded else None
        job.tokens = tokens
        conn.active = job
        if self.sleep is None:
            self.engine.add(job)
        else:  # held while asleep, as vLLM holds it; a client gone meanwhile aborted it
            self.sleep.admit(lambda: None if job.finished else self.engine.add(job))


class StreamSink:
    """Writes SSE chunks byte-for-byte in vLLM's layout as the engine produces tokens.

    `usage` (include_usage): a last chunk with `"choices":[]` and the totals before
    `data: [DONE]`. `continuous` (continuous_usage_stats): every chunk carries the usage so far
    (vLLM's chat chunks have no `usage` key otherwise, exclude_unset; completions chunks always
    carry one, `null` unless continuous, with `prompt_tokens_details: null`)."""

    __slots__ = ("conn", "chat", "prefix", "middle", "last", "first", "tail", "prompt_tokens",
                 "continuous", "held", "held_first", "held_index", "held_last")

    def __init__(
        self,
        conn: Connection,
        *,
        chat: bool,
        rid: str,
        created: int,
        model: str,
        prompt_tokens: int,
        usage: bool,
        continuous: bool = False,
    ):
        self.conn = conn
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.continuous = continuous
        head = f'{{"id":"{rid}","object":"{"chat.completion.chunk" if chat else "text_completion"}"'
        head += f',"created":{created},"model":{json.dumps(model, ensure_ascii=False)}'
        if chat:
            role_usage = f',"usage":{self._usage(0).decode()}' if continuous else ""
            self.first = (
                f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant",'
                f'"content":""}},"logprobs":null,"finish_reason":null}}]{role_usage},'
                f'"prompt_token_ids":null}}\n\n'
            ).encode()
            self.prefix = f'data: {head},"choices":[{{"index":0,"delta":{{"content":"'.encode()
            self.middle = b'"},"logprobs":null,"finish_reason":null,"token_ids":null}]'
            self.last = (
                b'"},"logprobs":null,"finish_reason":"length","stop_reason":null,'
                b'"token_ids":null}]'
            )
        else:
            self.first = b""
            self.prefix = f'data: {head},"choices":[{{"index":0,"text":"'.encode()
            self.middle = (
                b'","logprobs":null,"finish_reason":null,"stop_reason":null,'
                b'"prompt_token_ids":null,"token_ids":null}],"usage":'
            )
            self.last = (
                b'","logprobs":null,"finish_reason":"length","stop_reason":null,'
                b'"prompt_token_ids":null,"token_ids":null}],"usage":'
            )
        self.tail = f'data: {head},"choices":[],"usage":' if usage else None
        # calibrated: the tokens of the chunk waiting in the API-server process, merged
        self.held: list[str] | None = None
        self.held_first, self.held_index, self.held_last = False, 0, False

    def _usage(self, completion: int) -> bytes:
        """The usage object of a continuous chunk (field order of vLLM's UsageInfo)."""
        details = b"" if self.chat else b',"prompt_tokens_details":null'
        return (b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%b}'
                % (self.prompt_tokens, self.prompt_tokens + completion, completion, details))

    def on_token(self, index: int, text: str, last: bool) -> None:
        """The engine's token `index`: its chunk written, or (calibrated) handed to the
        connection's API-server process; while the stream's previous chunk still waits there,
        the token joins that chunk instead (vLLM's output collector merges the deltas its API
        server has not sent yet)."""
        process = self.conn.process
        if process is None:
            self._write(index == 0, index, text, last)
            return
        servers = self.conn.app.api_server
        if self.held is not None:  # merged: no chunk of its own
            self.held.append(text)
            self.held_index, self.held_last = index, last
            process.merged += 1
            if last and self.tail is not None:  # the usage chunk now comes with it
                process.charge(servers.cost(1, 1))
            return
        chunks = 1 + (index == 0 and bool(self.first)) + (last and self.tail is not None)
        usage = chunks if self.continuous else int(last and self.tail is not None)
        if not servers.merge:  # every token a chunk of its own, however late
            process.run(servers.cost(chunks, usage),
                        lambda: self._write(index == 0, index, text, last))
            return
        self.held, self.held_first = [text], index == 0
        self.held_index, self.held_last = index, last
        process.run(servers.cost(chunks, usage), self._release)

    def _release(self) -> None:
        """The process got to the held chunk: written with every token merged into it."""
        held, self.held = self.held or [], None
        self._write(self.held_first, self.held_index, "".join(held), self.held_last)

    def _write(self, first: bool, index: int, text: str, last: bool) -> None:
        """One chunk carrying `text`, the stream's tokens up to `index` (after the role chunk
        when `first`; the usage chunk and [DONE] after it when `last`)."""
        if self.continuous:
            end = (b',"usage":' if self.chat else b"") + self._usage(index + 1) + b"}\n\n"
        else:
            end = b"}\n\n" if self.chat else b"null}\n\n"
        event = self.prefix + text.encode() + (self.last if last else self.middle) + end
        events = [self.first, event] if first and self.first else [event]
        if last:
            if self.tail is not None:
                done = index + 1
                events.append(
                    f'{self.tail}{{"prompt_tokens":{self.prompt_tokens},"total_tokens":'
                    f'{self.prompt_tokens + done},"completion_tokens":{done}}}}}\n\n'.encode()
                )
            events.append(DONE)
        self.conn.send_events(tuple(events), last)


class CollectSink:
    """Gathers the tokens of a non-streamed request and answers once with the whole body."""

    __slots__ = ("conn", "request", "chat", "rid", "created", "model", "prompt_tokens", "parts",
                 "token_ids")

    def __init__(
        self,
        conn: Connection,
        request: HttpRequest,
        *,
        chat: bool,
        rid: str,
        created: int,
        model: str,
        prompt_tokens: int,
        token_ids: tuple[list[int], Callable[[str], int]] | None = None,
    ):
        self.conn, self.request, self.chat, self.rid = conn, request, chat, rid
        self.created, self.model, self.prompt_tokens = created, model, prompt_tokens
        self.token_ids = token_ids  # (the prompt's ids, a token's id) when the client asked
        self.parts: list[str] = []

    def on_token(self, index: int, text: str, last: bool) -> None:
        self.parts.append(text)
        if not last:
            return
        text = "".join(self.parts)
        n = len(self.parts)
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + n,
            "completion_tokens": n,
            "prompt_tokens_details": None,
        }
        if self.chat:
            body = {
                "id": self.rid,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning": None,
                        },
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "token_ids": None if self.token_ids is None
                        else [self.token_ids[1](part) for part in self.parts],
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None if self.token_ids is None else self.token_ids[0],
                "kv_transfer_params": None,
            }
        else:
            body = {
                "id": self.rid,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "prompt_token_ids": None,
                        "prompt_logprobs": None,
                        "token_ids": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": None,
            }
        if not self.conn.transport.is_closing():
            self.conn.send(self.request, 200, dumps(body))
