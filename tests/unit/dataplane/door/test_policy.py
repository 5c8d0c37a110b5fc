"""Per-credential policy at the real nginx + njs door (docs/policy.md), before the vLLM stand-in,
without Docker: a model a credential may not use does not exist for it on every route (the same
404 as an unknown model, and missing from /v1/models), with the body parsed once, by the parse
the routing uses (duplicate keys: the last wins, as in vLLM's json; names compared exactly); an
expired credential gets the 401 a wrong one gets, with no reload, and a policy change reaches
every worker with the reload credential changes use.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from kit.credentials.policy import PolicyChange
from kit.credentials.store import existing, with_policy, write
from kit.front_door.client import basic_header
from kit.layout import SiteLayout
from kit.plan.build import BATCH_PACE_HOLD_MS, BATCH_PACE_WINDOW_MS, BATCH_PROMPT_BYTES_PER_ENGINE_S
from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.budget_burst import spend_in_a_burst
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.door_sequential import back_to_back
from tests.support.raw_http import RawReply
from tests.support.raw_http import request as raw_request
from tests.support.sites import base_site
from tests.support.usage_collector import CollectorProcess

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
PASSWORD = "a-long-enough-password-41"
DAILY = 60  # tokens a day of the key "daily"
MONTHLY = 40  # tokens a month of the key "monthly"
RESTARTED = 60  # tokens a day of the key "steady", spent across a restart of nginx
SEQUENTIAL = 150  # tokens a day of the key "sequential", raised by as much each round
BURST = 1000  # tokens a day of the key "burst", spent by 64 concurrent streams
MAX_MODEL_LEN = 8192  # the base site's service's: the most a request without max_tokens costs
# tokens a day of each "ends_…" key: its requests reserve ~155 tokens each and spend at most
# 51; three leaked reservations (with what the three spent) would leave too little for one more
ENDING_BUDGET = 400
ROUTES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}],
                                   "max_tokens": 2},
          "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
          "/v1/embeddings": {"input": "Hi"}}


@dataclass
class PolicyDoor:
    door: Door
    layout: SiteLayout
    keys: dict[str, str]  # name → the key


def add_key(spec: Path, name: str, *options: str) -> str:
    added = run_kit("keys", "add", spec, name, "--offline", *options)
    assert added.exit_code == 0, added.output
    return added.output.split(f"key {name}: ")[1].split()[0]


def set_policy(layout: SiteLayout, kind: str, name: str, **fields: object) -> None:
    """A policy written as `kit keys|users set` writes it, with values the CLI would refuse
    (a model the site no longer serves, an expiry seconds away)."""
    write(layout, with_policy(layout, existing(layout, kind, name), kind, name,
                              PolicyChange(fields), fresh=False))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyDoor]:
    root = tmp_path_factory.mktemp("policy")
    spec = base_site(root) / "site.yaml"
    render_site(Site.load(spec))
    layout = SiteLayout(spec.parent)
    keys = {"all": add_key(spec, "all"),
            "listed": add_key(spec, "listed", "--models", SERVED, "--class", "batch"),
            "narrow": add_key(spec, "narrow"),
            "soon": add_key(spec, "soon"),
            "daily": add_key(spec, "daily", "--tokens-per-day", str(DAILY)),
            "monthly": add_key(spec, "monthly", "--tokens-per-day", str(10 * MONTHLY),
                               "--tokens-per-month", str(MONTHLY)),
            "minute": add_key(spec, "minute", "--requests-per-minute", "3"),
            "sequential": add_key(spec, "sequential", "--tokens-per-day", str(SEQUENTIAL)),
            "burst": add_key(spec, "burst", "--tokens-per-day", str(BURST)),
            "whole": add_key(spec, "whole", "--tokens-per-day", str(MAX_MODEL_LEN)),
            **{f"ends_{ending}": add_key(spec, f"ends_{ending}", "--tokens-per-day",
                                         str(ENDING_BUDGET)) for ending in ENDINGS}}
    added = run_kit("users", "add", spec, "ann", "--password-stdin", "--offline",
                    stdin=PASSWORD + "\n")
    assert added.exit_code == 0, added.output
    set_policy(layout, "key", "narrow", models=["retired-model"])
    set_policy(layout, "user", "ann", models=["retired-model"])
    (root / "work").mkdir()
    with serving_door(spec.parent / "nginx", root / "work", ["llama8b"],
                      root / "models" / "llama-8b", SERVED, HOST, verifier=True,
                      STANDIN_TOKEN_INTERVAL_MS="5", STANDIN_LOAD_SECONDS="0.1") as serving:
        yield PolicyDoor(serving, layout, keys)


def send(door: PolicyDoor, method: str, path: str, who: str, body: bytes = b"") -> RawReply:
    authorization = basic_header("ann", PASSWORD) if who == "ann" else f"Bearer {door.keys[who]}"
    headers = [("Authorization", authorization), ("Content-Type", "application/json")]
    return door.door.exchange(raw_request(method, path, HOST, headers, body))


def unknown_model(door: PolicyDoor, path: str, model: str) -> RawReply:
    """What an unrestricted key gets for a model the site does not serve, named `model`."""
    reply = send(door, "POST", path, "all", json.dumps({**ROUTES[path], "model": "x-none"})
                 .encode())
    assert reply.status == 404, reply.body
    return RawReply(404, reply.headers, reply.body.replace(b"x-none", model.encode()))


@pytest.mark.parametrize("path", sorted(ROUTES))
@pytest.mark.parametrize("who", ["narrow", "ann"])
def test_a_model_not_on_the_list_does_not_exist(door: PolicyDoor, path: str, who: str) -> None:
    body = json.dumps({**ROUTES[path], "model": SERVED}).encode()
    refused = send(door, "POST", path, who, body)
    expected = unknown_model(door, path, SERVED)
    assert (refused.status, refused.body) == (expected.status, expected.body)
    assert refused.headers["content-type"] == expected.headers["content-type"]
    if path != "/v1/embeddings":  # the generative stand-in has no embeddings route
        for allowed in ("all", "listed"):
            assert send(door, "POST", path, allowed, body).status == 200


@pytest.mark.parametrize("who", ["narrow", "ann"])
def test_models_lists_only_what_the_credential_may_use(door: PolicyDoor, who: str) -> None:
    for allowed in ("all", "listed"):
        listed = json.loads(send(door, "GET", "/v1/models", allowed).body)
        assert [entry["id"] for entry in listed["data"]] == [SERVED]
        one = send(door, "GET", f"/v1/models/{SERVED}", allowed)
        assert one.status == 200 and json.loads(one.body)["id"] == SERVED
    refused = send(door, "GET", "/v1/models", who)
    assert refused.status == 200 and json.loads(refused.body) == {"object": "list", "data": []}
    hidden = send(door, "GET", f"/v1/models/{SERVED}", who)
    unknown = send(door, "GET", "/v1/models/x-none", "all")
    assert (hidden.status, hidden.body) == (404, unknown.body.replace(b"x-none", SERVED.encode()))


@pytest.mark.parametrize("body", [
    b'{"model": "llama-3.1-8b", "model": "retired-model", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "retired-model", "model": "llama-3.1-8b", "prompt": "Hi", "max_tokens": 2}',
    b'{"mod\\u0065l": "llama-3.1-8b", "model": "llama-3.1-8b", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "llama-3.1-8\\u0062", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "Llama-3.1-8b", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "LLAMA-3.1-8B", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "llama-3.1-8b ", "prompt": "Hi", "max_tokens": 2}',
    b'{"prompt": "Hi", "max_tokens": 2}',
], ids=["dup-last-retired", "dup-last-served", "escaped-key", "escaped-value", "case",
        "upper", "space", "no-model"])
def test_no_spelling_of_the_body_crosses_the_list(door: PolicyDoor, body: bytes) -> None:
    """The narrow key is refused whatever the spelling; what the door routes for the
    unrestricted key is what vLLM (Python's json: last duplicate wins) reads."""
    narrow = send(door, "POST", "/v1/completions", "narrow", body)
    assert narrow.status in (400, 404), narrow.body
    served = json.loads(body).get("model", SERVED) == SERVED
    assert send(door, "POST", "/v1/completions", "all", body).status == (200 if served else 404)


def test_an_expired_credential_is_refused_like_a_wrong_one(door: PolicyDoor) -> None:
    """An expiry 2 s ahead, made live by a reload: the key works until then and gets the
    wrong key's 401 (body and WWW-Authenticate) from the first request after, on every
    worker, without another reload."""
    assert send(door, "GET", "/v1/models", "soon").status == 200
    expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=3)
    set_policy(door.layout, "key", "soon", expires=expires.strftime("%Y-%m-%dT%H:%M:%SZ"))
    conf = door.layout.nginx_dir / "nginx.conf"
    door.door.reload(conf, conf.read_text())
    assert time.time() < expires.timestamp() - 0.5, "the reload took too long to tell"
    assert send(door, "GET", "/v1/models", "soon").status == 200
    while time.time() < expires.timestamp():
        time.sleep(0.05)
    wrong = door.door.exchange(raw_request("GET", "/v1/models", HOST,
                                           [("Authorization", "Bearer sk-kit-wrong")]))
    for _ in range(2 * len(door.door.workers())):  # fresh connections: several workers
        refused = send(door, "GET", "/v1/models", "soon")
        assert (refused.status, refused.body) == (401, wrong.body)
        assert refused.headers["www-authenticate"] == wrong.headers["www-authenticate"]
    assert send(door, "GET", "/v1/models", "all").status == 200


@contextmanager
def allowed_for_ann(door: PolicyDoor, needed: bool) -> Iterator[None]:
    """The Basic user may use the model for the block (its list is put back after)."""
    conf = door.layout.nginx_dir / "nginx.conf"
    if needed:
        set_policy(door.layout, "user", "ann", models=[SERVED])
        door.door.reload(conf, conf.read_text())
    try:
        yield
    finally:
        if needed:
            set_policy(door.layout, "user", "ann", models=["retired-model"])
            door.door.reload(conf, conf.read_text())


@pytest.mark.parametrize(("who", "priority"), [("all", 0), ("listed", 1), ("ann", 0)])
@pytest.mark.parametrize("body", [
    {"model": SERVED, "prompt": "Hi", "max_tokens": 2},
    {"model": SERVED, "prompt": "Hi", "max_tokens": 2, "priority": -100},
    {"model": SERVED, "prompt": "Hi", "max_tokens": 2, "stream": True, "priority": -1},
], ids=["plain", "own-priority", "stream"])
def test_with_a_batch_credential_every_generation_says_its_class(
        door: PolicyDoor, who: str, priority: int, body: dict) -> None:
    """The site has a batch key, so vLLM reads `priority` 1 from it and 0 from the others —
    whatever the client sent (the door's key is the last, and Python's json keeps the last);
    the client's bytes come first, unchanged."""
    sent = json.dumps(body).encode()
    with door.door.upstream_bodies() as bodies, allowed_for_ann(door, who == "ann"):
        assert send(door, "POST", "/v1/completions", who, sent).status == 200
    (upstream,) = bodies
    assert upstream.startswith(sent[:-1]) and upstream.endswith(f',"priority":{priority}}}'
                                                                .encode())
    assert json.loads(upstream)["priority"] == priority


@pytest.mark.parametrize(("who", "priority"), [("all", 0), ("listed", 1)])
@pytest.mark.parametrize(("path", "stream"), [("/v1/responses", False),
                                              ("/v1/responses", True),
                                              ("/v1/embeddings", False)],
                         ids=["responses", "responses-stream", "embeddings"])
def test_no_route_lets_a_client_pick_its_own_priority(
        door: PolicyDoor, who: str, priority: int, path: str, stream: bool) -> None:
    """Issue 42: vLLM 0.33's responses and embeddings requests take `priority` too, so the
    door says the class there as on the generations: a client's own -100 never reaches vLLM,
    batch or interactive."""
    body = {"model": SERVED, "input": "Hi", "priority": -100, **({"stream": True} if stream
                                                                 else {})}
    sent = json.dumps(body).encode()
    with door.door.upstream_bodies() as bodies:
        assert send(door, "POST", path, who, sent).status == 200
    (upstream,) = bodies
    assert upstream.startswith(sent[:-1]) and json.loads(upstream)["priority"] == priority


@pytest.mark.parametrize(("path", "request_field"), [("/v1/completions", "prompt"),
                                                    ("/v1/responses", "input"),
                                                    ("/v1/embeddings", "input")],
                         ids=["completions", "responses", "embeddings"])
def test_without_a_batch_credential_the_door_still_owns_priority(
        door: PolicyDoor, path: str, request_field: str) -> None:
    """The services run vLLM's priority scheduler from the start (issue 42), so with no batch
    credential on the site a client's own `priority` must not reach it either: 0 is appended."""
    conf = door.layout.nginx_dir / "nginx.conf"
    cleared = PolicyChange({}, ("class",))
    write(door.layout, with_policy(door.layout, existing(door.layout, "key", "listed"), "key",
                                   "listed", cleared, fresh=False))
    door.door.reload(conf, conf.read_text())
    try:
        assert json.loads(door.layout.door_policy.read_text())["batch"] is False
        sent = json.dumps({"model": SERVED, request_field: "Hi", "priority": -100}).encode()
        with door.door.upstream_bodies() as bodies:
            assert send(door, "POST", path, "listed", sent).status == 200
        (upstream,) = bodies
        assert upstream == sent[:-1] + b',"priority":0}'
    finally:
        set_policy(door.layout, "key", "listed", **{"class": "batch"})
        door.door.reload(conf, conf.read_text())


def test_an_empty_object_goes_upstream_as_it_came(door: PolicyDoor) -> None:
    """Nothing to run, nothing to say: `{}` is not made into `{,"priority":0}` (vLLM then
    answers its own 400 for the missing fields)."""
    with door.door.upstream_bodies() as bodies:
        assert send(door, "POST", "/v1/completions", "all", b" { } ").status == 200
    assert bodies == [b" { } "]


def test_a_batch_credential_never_holds_every_slot(door: PolicyDoor) -> None:
    """The base site's service has 64 slots: a batch key gets 32 streams at once, the 8 more
    it asks for get 429 at the door; an interactive key gets all 40."""
    # 3 s streams (5 ms a token): all 40 are in flight at once even on a loaded machine
    streams = ("--model", SERVED, "--streams", "40", "--tokens", "600")
    batch = door.door.load("--auth", f"Bearer {door.keys['listed']}", *streams)
    assert (batch["ok"], batch["failures"]) == (32, {"status 429": 8}), batch
    interactive = door.door.load("--auth", f"Bearer {door.keys['all']}", *streams)
    assert interactive["ok"] == 40, interactive


def test_batch_prompts_are_paced_while_interactive_requests_come(door: PolicyDoor) -> None:
    """Right after an interactive request, 16 batch requests of 16 KiB at once go upstream one
    after another at the plan's bytes a second (a quarter second apart on one engine), those
    whose turn is over the hold away get 429 with Retry-After; once no interactive request came
    for the window, batch goes at once again."""
    rate = BATCH_PROMPT_BYTES_PER_ENGINE_S
    prompt = "x" * (rate // 4)
    body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": 1}).encode()
    interactive = json.dumps({"model": SERVED, "prompt": "Hi", "max_tokens": 1}).encode()

    def batch(_: int) -> tuple[float, RawReply]:
        reply = send(door, "POST", "/v1/completions", "listed", body)
        return time.monotonic(), reply

    with door.door.upstream_bodies() as bodies:
        assert send(door, "POST", "/v1/completions", "all", interactive).status == 200
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(batch, range(16)))
        admitted = sorted(at - started for at, reply in replies if reply.status == 200)
        refused = [reply for _, reply in replies if reply.status != 200]
        assert len(bodies) == 1 + len(admitted)
        time.sleep(BATCH_PACE_WINDOW_MS / 1000)
        at_once = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            later = list(pool.map(batch, range(8)))
    hold_s = BATCH_PACE_HOLD_MS / 1000
    # turns 0, 0.25, ... s: those up to the hold admitted, each a quarter second after the last
    assert 12 <= len(admitted) <= 14, (admitted, [r.status for r in refused])
    assert admitted[-1] - admitted[0] >= hold_s - 0.5, admitted
    assert all(b - a >= 0.15 for a, b in pairwise(admitted)), admitted  # 0.25 s, jitter aside
    assert {(r.status, r.headers.get("retry-after")) for r in refused} == {(429, "1")}, refused
    assert b"paced" in refused[0].body
    assert all(reply.status == 200 for _, reply in later), later
    assert max(at for at, _ in later) - at_once < 1, later


def spend_until_refused(door: PolicyDoor, who: str) -> tuple[list[int], RawReply]:
    """Requests one after another until the door refuses one: each admitted one's tokens (as
    the engine counted them) and the refusal."""
    body = json.dumps({"model": SERVED, "prompt": "Hi", "max_tokens": 5}).encode()
    spent: list[int] = []
    while len(spent) < 100:
        reply = send(door, "POST", "/v1/completions", who, body)
        if reply.status != 200:
            return spent, reply
        usage = json.loads(reply.body)["usage"]
        spent.append(usage["prompt_tokens"] + usage["completion_tokens"])
    raise AssertionError(f"{who}: never refused after {sum(spent)} tokens")


def seconds_to(ends: dt.datetime) -> float:
    return (ends - dt.datetime.now(dt.UTC)).total_seconds()


@pytest.mark.parametrize(("who", "budget", "window"), [("daily", DAILY, "day"),
                                                        ("monthly", MONTHLY, "month")])
def test_the_request_that_crosses_a_budget_is_the_last_one_admitted(
        door: PolicyDoor, who: str, budget: int, window: str) -> None:
    """Admitted while the tokens counted are below the budget: the one that crosses it is the
    last; then 429 insufficient_quota with Retry-After to the window's UTC reset, on every
    route the credential may use, after a reload too (the count lives in a shared zone)."""
    spent, refused = spend_until_refused(door, who)
    assert sum(spent[:-1]) < budget <= sum(spent), spent
    now = dt.datetime.now(dt.UTC)
    day = dt.datetime.combine(now.date(), dt.time(), dt.UTC)
    ends = (day + dt.timedelta(days=1) if window == "day" else
            dt.datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=dt.UTC))
    error = json.loads(refused.body)["error"]
    assert (refused.status, error["type"], error["code"]) == (429, "insufficient_quota", 429)
    assert f"budget of {budget} a {window} (UTC)" in error["message"]
    assert ends.strftime("%Y-%m-%dT%H:%M:%S") in error["message"]
    assert abs(int(refused.headers["retry-after"]) - seconds_to(ends)) <= 2
    conf = door.layout.nginx_dir / "nginx.conf"
    door.door.reload(conf, conf.read_text())  # what a credential change does: counts kept
    for path in sorted(ROUTES):
        again = send(door, "POST", path, who, json.dumps({**ROUTES[path], "model": SERVED})
                     .encode())
        assert (again.status, json.loads(again.body)["error"]["type"]) == (
            429, "insufficient_quota")
    assert send(door, "POST", "/v1/completions", "all",
                json.dumps(ROUTES["/v1/completions"] | {"model": SERVED}).encode()).status == 200


def test_a_client_sending_request_after_request_never_passes_the_crossing_one(
        door: PolicyDoor) -> None:
    """Tokens are counted as the answer's usage passes the door, before its last bytes: a
    client that sends its next request the moment it has read the end of the one before (a
    stream's `[DONE]`, an answer's last byte), on a connection opened beforehand, is admitted
    while the count is below the budget and refused from the request after the crossing one —
    streams with and without include_usage, and whole answers, in turn, round after round."""
    conf = door.layout.nginx_dir / "nginx.conf"
    counted = 0
    for round_number in range(1, 7):
        budget = counted + SEQUENTIAL
        if round_number > 1:  # the count kept, the budget raised: a new crossing to reach
            set_policy(door.layout, "key", "sequential", tokens_per_day=budget)
            door.door.reload(conf, conf.read_text())
        spent, refused = back_to_back(door.door, HOST, door.keys["sequential"], SERVED)
        assert (refused.status, json.loads(refused.body)["error"]["type"]) == (
            429, "insufficient_quota"), refused
        assert counted + sum(spent[:-1]) < budget <= counted + sum(spent), (round_number,
                                                                          counted, spent)
        counted += sum(spent)


def test_64_concurrent_streams_pass_a_budget_by_less_than_one_requests_reservation(
        door: PolicyDoor) -> None:
    """Each admitted request reserves its worst case (its body's bytes for its prompt +
    max_tokens) until it ends, and a request is admitted while the count and the reservations
    in flight are below the budget: 64 streams at once spend it and pass it by less than one
    reservation. (Before reservations: 65 admitted, 3,315 tokens for 1,000.)"""
    burst = spend_in_a_burst(door.door, HOST, door.keys["burst"], SERVED, budget=BURST)
    print(burst.describe())
    assert not burst.others, burst.others
    assert BURST <= burst.tokens < BURST + burst.reservation, burst.describe()


def test_a_request_without_max_tokens_reserves_max_model_len(door: PolicyDoor) -> None:
    """A request that names no max_tokens may cost its service's max_model_len (8,192): while
    one is in flight (its engine stopped), a key whose budget is that much refuses the next
    request for the requests in flight (429 RateLimitError, Retry-After 1), and admits it once
    the first ended; an `n` the door cannot read is refused for a key with a budget."""
    whole = json.dumps({"model": SERVED, "stream": True,
                        "messages": [{"role": "user", "content": "Hi"}]}).encode()
    small = json.dumps({"model": SERVED, "max_tokens": 5,
                        "messages": [{"role": "user", "content": "Hi"}]}).encode()
    with door.door.inside():
        sock = door.door.connect()
    os.kill(door.door.standin.pid, signal.SIGSTOP)
    try:
        sock.sendall(_request(door, "whole", whole))
        time.sleep(0.5)  # admitted, its reservation made; the engine does not answer
        refused = send(door, "POST", "/v1/chat/completions", "whole", small)
    finally:
        os.kill(door.door.standin.pid, signal.SIGCONT)
    with sock:
        while sock.recv(65536):
            pass
    error = json.loads(refused.body)["error"]
    assert (refused.status, error["type"], refused.headers["retry-after"]) == (
        429, "RateLimitError", "1"), refused.body
    assert "requests in flight may use what is left" in error["message"]
    assert send(door, "POST", "/v1/chat/completions", "whole", small).status == 200
    many = send(door, "POST", "/v1/chat/completions", "whole",
                json.dumps(json.loads(small) | {"n": "many"}).encode())
    assert (many.status, json.loads(many.body)["error"]["param"]) == (400, "n")


def _completed(door: PolicyDoor, key: str, body: bytes) -> None:
    assert send(door, "POST", "/v1/chat/completions", key, body).status == 200


def _aborted(door: PolicyDoor, key: str, body: bytes) -> None:
    door.door.abort_after(_request(door, key, body), 3)


def _left_before_the_answer(door: PolicyDoor, key: str, body: bytes) -> None:
    with door.door.inside():
        sock = door.door.connect()
    with sock:
        sock.sendall(_request(door, key, body))


def _refused_by_vllm(door: PolicyDoor, key: str, body: bytes) -> None:
    too_long = json.loads(body) | {"max_tokens": 10**6}
    assert send(door, "POST", "/v1/chat/completions", key,
                json.dumps(too_long).encode()).status == 400


def _no_replica(door: PolicyDoor, key: str, body: bytes) -> None:
    door.door.standin.kill()
    try:
        assert send(door, "POST", "/v1/chat/completions", key, body).status == 503
    finally:
        door.door.restart_standin()


def _across_a_reload(door: PolicyDoor, key: str, body: bytes) -> None:
    with door.door.inside():
        sock = door.door.connect()
    with sock:
        sock.sendall(_request(door, key, body))  # 200 ms at 5 ms a token
        sock.recv(65536)  # its answer began
        conf = door.layout.nginx_dir / "nginx.conf"
        # the client reads on while nginx reloads, as a client does: an old worker waits for the
        # client to close its side (lingering close, 5 s) before it ends
        with ThreadPoolExecutor(1) as reader:
            ended = reader.submit(_read_to_the_end, sock)
            door.door.reload(conf, conf.read_text())  # returns once the old worker has gone
            ended.result()


def _read_to_the_end(sock: socket.socket) -> None:
    while sock.recv(65536):
        pass
    sock.close()


def _request(door: PolicyDoor, key: str, body: bytes) -> bytes:
    headers = [("Authorization", f"Bearer {door.keys[key]}"),
               ("Content-Type", "application/json")]
    return raw_request("POST", "/v1/chat/completions", HOST, headers, body)


ENDINGS = {"completed": _completed, "aborted": _aborted,
           "left_before_the_answer": _left_before_the_answer,
           "refused_by_vllm": _refused_by_vllm, "no_replica": _no_replica,
           "across_a_reload": _across_a_reload}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_reservation_is_released_however_its_request_ends(door: PolicyDoor,
                                                            ending: str) -> None:
    """Three requests ending the same way, each reserving more than a third of what the budget
    leaves: were any reservation kept, the next request would be refused for requests in
    flight; it is admitted (and a request without max_tokens, which reserves max_model_len,
    once more)."""
    key = f"ends_{ending}"
    body = json.dumps({"model": SERVED, "stream": True, "max_tokens": 40,
                       "messages": [{"role": "user", "content": "Count slowly."}]}).encode()
    for _ in range(3):
        ENDINGS[ending](door, key, body)
    # an abort or a close is seen when nginx next writes (the stream's next token): until then
    # the door refuses for requests in flight, with nothing spent; a kept reservation never ends
    deadline = time.monotonic() + 2
    while (check := send(door, "POST", "/v1/chat/completions", key, body)).status == 429 and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    assert check.status == 200, check.body


def test_requests_per_minute_refused_until_the_minute_ends(door: PolicyDoor,
                                                           tmp_path: Path) -> None:
    """Three a minute: the fourth in the same UTC minute gets the rate-limit 429 with
    Retry-After to the minute's end, and is let in from the next minute on (the windows of
    budgets roll over the same way, a UTC day or month); an unlimited key is not counted.
    The site's door again, with nginx's clock set ahead (tests/support/nginx_ns.shifted_clock)
    so that its minute ends about 10 s after it starts, not up to a minute later."""
    started = time.time() + 2  # a door starts in about 2 s
    ahead = round(60 - 10 - started % 60) % 60
    with serving_door(door.layout.nginx_dir, tmp_path, ["llama8b"],
                      door.layout.root.parent / "models" / "llama-8b", SERVED, HOST,
                      verifier=True, clock_offset_s=ahead, STANDIN_TOKEN_INTERVAL_MS="5",
                      STANDIN_LOAD_SECONDS="0.1") as shifted:
        minute = PolicyDoor(shifted, door.layout, door.keys)
        if 60 - shifted.now() % 60 < 5:  # the four requests in one minute
            time.sleep(60 - shifted.now() % 60)
        body = json.dumps(ROUTES["/v1/completions"] | {"model": SERVED}).encode()
        assert [send(minute, "POST", "/v1/completions", "minute", body).status
                for _ in range(3)] == [200] * 3
        refused = send(minute, "POST", "/v1/completions", "minute", body)
        error = json.loads(refused.body)["error"]
        assert (refused.status, error["type"]) == (429, "RateLimitError")
        assert abs(int(refused.headers["retry-after"]) - (60 - shifted.now() % 60)) <= 2
        assert send(minute, "POST", "/v1/completions", "all", body).status == 200
        time.sleep(60 - shifted.now() % 60 + 0.1)  # the window resets at the minute, UTC
        assert send(minute, "POST", "/v1/completions", "minute", body).status == 200


@pytest.mark.parametrize("who", ["narrow", "ann"])
def test_a_services_metrics_are_only_for_credentials_that_may_use_its_models(
        door: PolicyDoor, who: str) -> None:
    """/metrics/{service} names no model in its path but vLLM's figures name the service's
    models: a credential whose list holds none of them gets the door's 404 for an unknown path."""
    for allowed in ("all", "listed"):
        figures = send(door, "GET", "/metrics/llama8b", allowed)
        assert figures.status == 200 and b"vllm:num_requests_running" in figures.body
    hidden = send(door, "GET", "/metrics/llama8b", who)
    unknown = send(door, "GET", "/v1/no-such-path", "all")
    assert (hidden.status, hidden.body) == (404, unknown.body)
    with allowed_for_ann(door, who == "ann"):
        if who == "ann":
            assert send(door, "GET", "/metrics/llama8b", who).status == 200


def test_a_budget_window_continues_across_a_restart_of_nginx(tmp_path: Path) -> None:
    """nginx's zones die with it (njs 0.8.9 keeps no state file), so the usage ledger's
    collector writes each credential's tokens of the current UTC day and month beside the spool
    and a new nginx seeds its windows from them: the count goes on where it was, neither lost
    nor counted twice, and a reload after it seeds nothing again."""
    spec = base_site(tmp_path) / "site.yaml"
    render_site(Site.load(spec))
    layout = SiteLayout(spec.parent)
    keys = {"steady": add_key(spec, "steady", "--tokens-per-day", str(RESTARTED))}
    work = tmp_path / "work"
    work.mkdir()
    collector = CollectorProcess(work / "spool" / "door.jsonl", tmp_path / "ledger",
                                 extra=["--budget-seed", str(work / "spool" / "budget-seed.json")])

    def serving() -> contextmanager:
        return serving_door(layout.nginx_dir, work, ["llama8b"], tmp_path / "models" / "llama-8b",
                            SERVED, HOST, STANDIN_TOKEN_INTERVAL_MS="5",
                            STANDIN_LOAD_SECONDS="0.1")

    body = json.dumps({"model": SERVED, "prompt": "Hi", "max_tokens": 5}).encode()
    with serving() as first:
        before = [json.loads(send(PolicyDoor(first, layout, keys), "POST", "/v1/completions",
                                  "steady", body).body)["usage"] for _ in range(2)]
        first.flush_logs()
        spent_before = sum(usage["prompt_tokens"] + usage["completion_tokens"]
                           for usage in before)
        collector.start()
        try:
            collector.wait_for(lambda health: health["budget_windows"].get("key:steady", [
                "", 0])[1] == spent_before, "the key's tokens in its window")
        finally:
            collector.stop()
    seed = json.loads((work / "spool" / "budget-seed.json").read_text())
    assert seed["credentials"] == {"key:steady": [spent_before, spent_before]}, seed
    with serving() as second:  # a new nginx: new zones
        door = PolicyDoor(second, layout, keys)
        spent, refused = spend_until_refused(door, "steady")
        assert spent_before + sum(spent[:-1]) < RESTARTED <= spent_before + sum(spent), (
            spent_before, spent)
        assert (refused.status, json.loads(refused.body)["error"]["type"]) == (
            429, "insufficient_quota")
        conf = layout.nginx_dir / "nginx.conf"
        second.reload(conf, conf.read_text())
        assert send(door, "POST", "/v1/completions", "steady", body).status == 429
