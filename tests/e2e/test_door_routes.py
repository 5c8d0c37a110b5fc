"""Which of vLLM's routes the real front door passes, and what nginx itself answers (issue 22).

Every route vLLM 0.33.0 registers (tests/standin/vllm-0.33.0-routes.txt) is sent through the
real nginx with the real rendered config, once with a valid Basic and once with a valid Bearer
credential: a refused one is a JSON 404 and never reaches the vLLM stand-in (its access log, one
line per request it received, is the witness); a passed one reaches it. Path tricks go the same
way. nginx's own refusals of broken HTTP are provoked for real, each one: OpenAI-style JSON with
`Content-Type: application/json`, and valid UTF-8 whatever bytes the client sent.
"""

import json
import re
import secrets
import time
from collections.abc import Iterator

import pytest

from kit.front_door.client import Reply
from tests.support.live_stack import DOMAIN, SERVED_NAME, SERVICE, LiveSite, running
from tests.support.raw_http import RawReply, exchange, request
from tests.support.vllm_routes import classify, vllm_routes

pytestmark = pytest.mark.e2e

ERROR_KEYS = ["message", "type", "param", "code"]
CHAT = {"model": SERVED_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
PARAMETERS = {"{path}": "x", "{response_id}": "resp_1", "{model}": SERVED_NAME}


WITNESS = "/v1/chat/completions?witness="  # the request that closes a count of upstream ones


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    # connect_timeout: the stopped service's 502 (the last test) comes after 2 s, not 10
    with running(tmp_path_factory.mktemp("routes") / "site", docker_client,
                 prefix="rts", proxy={"connect_timeout": 2}) as site:
        yield site


@pytest.fixture(scope="module")
def credentials(site: LiveSite) -> dict[str, str]:
    return {"Basic": site.basic("ops"), "Bearer": f"Bearer {site.add_key('routes')}"}


def upstream_requests(site: LiveSite, credentials: dict[str, str]) -> list[tuple[str, str]]:
    """(method, target) of every request the vLLM stand-in received, in order, but its
    container's own healthcheck (GET /health from inside) and the witnesses. Callers count from
    a mark. The stand-in writes its line after each answer: a witness request, sent after the
    caller's, passes the door, and once its line is in the log so are those of the requests
    before it (a fixed wait cost 0.5 s a call)."""
    witness = WITNESS + secrets.token_hex(4)
    assert send(site, "POST", witness, credentials["Bearer"]).status == 200
    deadline = time.monotonic() + 10
    while True:
        logs = site.container(SERVICE).logs().decode(errors="replace")
        found = re.findall(r'"([A-Z]+) (\S+) HTTP/1\.[01]"', logs)
        if ("POST", witness) in found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ("POST", witness) in found, "the witness request never reached the stand-in"
    return [(method, target) for method, target in found[:found.index(("POST", witness))]
            if (method, target) != ("GET", "/health") and not target.startswith(WITNESS)]


def json_error(reply: Reply | RawReply, status: int) -> dict:
    """The reply is an OpenAI-style error with that status, its body valid UTF-8 JSON."""
    body = reply.body
    headers = reply.headers
    content_type = headers["content-type"] if isinstance(reply, RawReply) else headers[
        "Content-Type"]
    assert reply.status == status, (reply.status, body[:300])
    assert content_type == "application/json", (status, content_type, body[:300])
    error = json.loads(body.decode("utf-8", errors="strict"))["error"]
    assert list(error) == ERROR_KEYS and error["code"] == status, error
    return error


def concrete(path: str) -> str:
    for parameter, value in PARAMETERS.items():
        path = path.replace(parameter, value)
    return path


def send(site: LiveSite, method: str, path: str, credential: str) -> Reply:
    verb = "GET" if method in ("*", "WEBSOCKET") else method
    body = CHAT if verb == "POST" else None
    return site.gate().fetch(verb, path, body=body, credentials=credential)


def test_every_vllm_route_is_passed_or_refused_as_classified(
        site: LiveSite, credentials: dict[str, str]) -> None:
    mark = len(upstream_requests(site, credentials))
    routes = vllm_routes()
    refused, passed = [], []
    for method, path in routes:
        kind = classify(method, path)
        for scheme, credential in credentials.items():
            reply = send(site, method, concrete(path), credential)
            if kind == "refused":
                error = json_error(reply, 404)
                assert error["type"] == "NotFoundError", (method, path, scheme)
                refused.append(concrete(path))
            elif kind == "passed":
                assert reply.status != 404 or b'"detail"' in reply.body, (path, reply.body)
                passed.append((method, path))
    reached = upstream_requests(site, credentials)[mark:]
    reached_paths = [target.split("?")[0] for _, target in reached]
    leaked = sorted(set(refused) & set(reached_paths))
    assert not leaked, f"refused routes reached vLLM: {leaked}"
    for method, path in set(passed):
        assert reached.count((method, path)) >= 2, f"{method} {path} did not reach vLLM: {reached}"
    print(f"{len(routes)} routes x {len(credentials)} credentials: {len(refused)} refused "
          f"(none reached vLLM), {len(passed)} passed (all reached it)")


DEV_ROUTES = ["/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache", "/collective_rpc",
              "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/scale_elastic_ep", "/pause",
              "/resume", "/server_info", "/start_profile", "/release_kv_cache_memory"]


def test_the_dev_and_admin_routes_are_unreachable_whatever_the_credential(
        site: LiveSite, credentials: dict[str, str]) -> None:
    mark = len(upstream_requests(site, credentials))
    anyone = [None, "Basic " + "a" * 20, "Bearer sk-kit-nope", *credentials.values()]
    for path in DEV_ROUTES:
        for credential in anyone:
            for method in ("POST", "GET", "PUT", "DELETE"):
                reply = site.gate().fetch(method, path, body={"lora_name": "x"},
                                          credentials=credential)
                json_error(reply, 404)
    reached = {target.split("?")[0] for _, target in upstream_requests(site, credentials)[mark:]}
    assert not reached & set(DEV_ROUTES)


# Each raw request target and what the door must do: refuse it (a JSON 404, or 400 for what
# nginx cannot parse), or pass it to vLLM as the normalized path shown.
TRICKS = [
    ("/v1/load%5Flora%5Fadapter", 404),
    ("/v1/%6Coad_lora_adapter", 404),
    ("/V1/load_lora_adapter", 404),
    ("/v1/LOAD_LORA_ADAPTER", 404),
    ("//v1//load_lora_adapter", 404),
    ("/v1/load_lora_adapter/", 404),
    ("/v1/load_lora_adapter?x=1", 404),
    ("/v1/load_lora_adapter;x", 404),
    ("/v1/models/../load_lora_adapter", 404),
    ("/v1/chat/completions/../../v1/load_lora_adapter", 404),
    ("/v1/chat/completions/%2e%2e/%2e%2e/sleep", 404),
    ("/v1/chat/completions/..%2f..%2fsleep", 404),
    ("/v1/chat/completions%2f..%2f..%2fsleep", 404),
    ("/v1/chat/completions/", 404),
    ("/V1/chat/completions", 404),
    ("/v1/Chat/Completions", 404),
    ("/v1/chat/completions%00", 400),
    ("/v1/load_lora_adapter%00", 400),
    (f"https://{DOMAIN}/v1/load_lora_adapter", 404),
    ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
    ("//v1//chat//completions", "/v1/chat/completions"),
    ("/v1/load_lora_adapter/../chat/completions", "/v1/chat/completions"),
    ("/v1/load_lora_adapter/%2e%2e/chat/completions", "/v1/chat/completions"),
    ("/v1/./chat/completions", "/v1/chat/completions"),
    ("/v1/chat/completions?next=/v1/load_lora_adapter", "/v1/chat/completions"),
]


@pytest.mark.parametrize(("target", "expected"), TRICKS)
def test_path_tricks_meet_the_allow_list_as_nginx_normalized_them(
        site: LiveSite, credentials: dict[str, str], target: str, expected: int | str) -> None:
    mark = len(upstream_requests(site, credentials))
    body = json.dumps(CHAT).encode()
    for credential in credentials.values():
        raw = request("POST", target, DOMAIN, [("Authorization", credential),
                                               ("Content-Type", "application/json")], body)
        reply = exchange(site.gate(), raw)
        if isinstance(expected, int):
            json_error(reply, expected)
        else:
            assert reply.status == 200, (target, reply.status, reply.body[:300])
    reached = upstream_requests(site, credentials)[mark:]
    if isinstance(expected, int):
        assert not reached, f"{target} reached vLLM as {reached}"
    else:
        # vLLM got the path nginx matched (with the query string as sent), never the raw one.
        query = target.partition("?")[2]
        assert reached == [("POST", expected + (f"?{query}" if query else ""))] * 2, reached


def test_a_passed_route_takes_its_method_only(site: LiveSite, credentials: dict) -> None:
    reply = site.gate().fetch("GET", "/v1/chat/completions", credentials=credentials["Basic"])
    assert json_error(reply, 405)["message"] == "/v1/chat/completions takes POST only."
    assert reply.headers["Allow"] == "POST"


# ---- nginx's own refusals -------------------------------------------------------------------

def host_request(*headers: tuple[str, str], method: str = "GET", target: str = "/v1/models",
                 version: str = "HTTP/1.1", body: bytes = b"") -> bytes:
    return request(method, target, DOMAIN, list(headers), body, version)


BROKEN = {
    "duplicate Host": (400, host_request(("Host", "other.test"))),
    "Content-Length with chunked": (400, host_request(
        ("Content-Length", "5"), ("Transfer-Encoding", "chunked"), method="POST",
        target="/v1/chat/completions", body=b"0\r\n\r\n")),
    "invalid Content-Length": (400, host_request(("Content-Length", "abc"), method="POST")),
    "duplicate Authorization": (400, host_request(("Authorization", "Basic eDp5"),
                                                  ("Authorization", "Bearer sk-kit-x"))),
    "an invalid request line": (400, b"GET\r\n\r\n"),
    "TRACE": (405, host_request(method="TRACE", target="/")),
    "a URI longer than the header buffers": (414, host_request(target="/v1/" + "a" * 9000)),
    "a header line longer than the header buffers": (431, host_request(("X-Big", "b" * 9000))),
    "a Transfer-Encoding nginx does not know": (501, host_request(
        ("Transfer-Encoding", "gzip"), method="POST", target="/v1/chat/completions")),
    "HTTP/2.0 in an HTTP/1 request line": (505, host_request(version="HTTP/2.0")),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_nginx_refusals_of_broken_http_are_json(site: LiveSite, case: str) -> None:
    status, raw = BROKEN[case]
    json_error(exchange(site.gate(), raw), status)  # the HTTPS server
    json_error(exchange(site.gate(), raw, tls=False), status)  # the port-80 redirector


def test_plain_http_on_the_https_port_is_json(site: LiveSite) -> None:
    reply = exchange(site.gate(), host_request(), tls=False, port=site.https_port)
    assert "HTTPS" in json_error(reply, 400)["message"]


def test_a_raw_ff_byte_in_the_model_comes_back_as_valid_utf8(
        site: LiveSite, credentials: dict[str, str]) -> None:
    for model in (b"\xff", b"tiny\xff\xfe-chat", b"\xc3", b"\xed\xa0\x80"):  # invalid UTF-8
        body = b'{"model": "' + model + b'", "max_tokens": 1, "messages": []}'
        raw = request("POST", "/v1/chat/completions", DOMAIN,
                      [("Authorization", credentials["Bearer"]),
                       ("Content-Type", "application/json")], body)
        error = json_error(exchange(site.gate(), raw), 404)
        assert "\ufffd" in error["message"] and error["param"] == "model", error
    for escaped in ('"\\ud800"', '"\\udfff x"'):  # lone surrogates, escaped in valid JSON
        body = f'{{"model": {escaped}, "messages": []}}'.encode()
        raw = request("POST", "/v1/chat/completions", DOMAIN,
                      [("Authorization", credentials["Bearer"])], body)
        json_error(exchange(site.gate(), raw), 404)
    raw = request("GET", "/v1/models/%FF%FE", DOMAIN, [("Authorization", credentials["Basic"])])
    assert "\ufffd" in json_error(exchange(site.gate(), raw), 404)["message"]


def test_errors_behind_the_door_are_json(site: LiveSite, credentials: dict[str, str]) -> None:
    """500: the verifier unreachable for a credential not yet verified; 502: the service behind
    /metrics/<service> down. Run last in this module: it stops containers."""
    site.verifier.stop(timeout=1)
    try:
        fresh = request("GET", "/v1/models", DOMAIN, [("Authorization", "Basic c3Q6eHh4eHh4eA==")])
        json_error(exchange(site.gate(), fresh, timeout=90), 500)  # after the connect timeouts
    finally:
        site.verifier.start()
    site.container(SERVICE).stop(timeout=1)
    metrics = request("GET", f"/metrics/{SERVICE}", DOMAIN,
                      [("Authorization", credentials["Bearer"])])
    json_error(exchange(site.gate(), metrics, timeout=90), 502)
