"""Sleep mode on the real rendered stack (issue 26): two stand-in services sharing GPU 0 as one
swap group (each takes 0.9 of it: one awake at a time), with idle_sleep after 10 s. The stand-in
imitates vLLM's sleep mode (tests/standin/vllm_standin/sleep.py; it is not vLLM).

- A client alternating between the two models under 16 streams: 0 failed requests, exactly one
  wake per switch, each switch costing the programmed sleep + wake time plus at most 50 ms.
- Probes, scrapes, /health, /v1/models and kit status over an idle period (until the model
  fell asleep under them, `after` after its last use, and 3 s more) never wake a model nor keep
  one awake.
- A wake told to fail: a JSON 503 naming the cause at the door, the model stays asleep, the
  partner put to sleep for it woken back, kit status shows the failure with vLLM's logged cause.
- kit sleep / kit wake by hand (through the waker), the dev routes refused at the door for every
  credential, the probe and kit up passing over a sleeping service without waking it.
- Each service on its own backend network: from inside one's replica (model code: hostile) the
  other's vLLM, dev routes included, is unreachable by name, and at its addresses wherever the
  engine isolates its networks (Docker's iptables), while the door serves both and the waker
  reaches both.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator

import pytest

from kit.engine.desired import VERIFIER_SERVICE, WAKER_SERVICE
from kit.plan.build import VERIFIER_PORT
from kit.plan.waker import ask_argv
from tests.support.live_stack import (
    NAME_CONNECT_S,
    SERVED_NAME,
    SERVICE,
    UNREACHABLE,
    LiveSite,
    curl,
    read_in,
    running,
)
from tests.support.swap_client import run_phase, switch_cost

pytestmark = pytest.mark.e2e

FAIL_FILE = "/tmp/kit-test-fail-wake"
SLEEP_SECONDS = 0.05
WAKE_SECONDS = 0.5
AFTER_S = 10
ASLEEP_CALLS_S = 3  # the idle calls go on this long on a model asleep: none wakes it
OTHER, OTHER_SERVED = "coder", "coder-chat"
MODELS = {SERVICE: SERVED_NAME, OTHER: OTHER_SERVED}
# min_awake 0s: a swap at once, so a switch's own cost is what the alternating client measures
# (a member kept awake its min_awake is the waker's own tests':
# tests/unit/dataplane/waker/test_waker.py)
SWAP = {"gpu_memory_utilization": 0.9,
        "idle_sleep": {"after": f"{AFTER_S}s", "level": 1, "swap_group": "gpu0",
                       "min_awake": "0s"}}


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path_factory.mktemp("sleep") / "site", docker_client, prefix="slp",
                 env={"STANDIN_SLEEP_SECONDS": str(SLEEP_SECONDS),
                      "STANDIN_WAKE_SECONDS": str(WAKE_SECONDS),
                      "STANDIN_WAKE_FAIL_FILE": FAIL_FILE},
                 more_services={OTHER: OTHER_SERVED},
                 overrides={SERVICE: SWAP, OTHER: SWAP}) as site:
        yield site


@pytest.fixture(scope="module")
def key(site: LiveSite) -> str:
    return f"Bearer {site.add_key('sleeper')}"


def states(site: LiveSite) -> dict[str, str]:
    result = site.kit("status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return {entry["service"]: entry["state"] for entry in json.loads(result.stdout)["sleep"]}


def account(site: LiveSite, service: str) -> dict:
    """The stand-in's own account (its /standin/sleep route, asked inside its container)."""
    return json.loads(read_in(site.container(service),
                              ["curl", "-sS", "http://127.0.0.1:8000/standin/sleep"]))


def waker_account(site: LiveSite, service: str) -> dict:
    """The waker's account of `service`: its /state, asked inside its container as kit status
    asks it (which shows it as is), without a kit process each time."""
    out = read_in(site.container(WAKER_SERVICE), ask_argv("/state", 10))
    status, _, body = out.partition("\n")
    assert status == "200", out
    return next(entry for entry in json.loads(body)["services"] if entry["service"] == service)


def wakes(site: LiveSite) -> dict[str, int]:
    return {service: account(site, service)["wakes"] for service in MODELS}


def ask(site: LiveSite, model: str, credentials: str):
    return site.gate().fetch("POST", "/v1/chat/completions", credentials=credentials, body={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def settle(site: LiveSite, awake: str) -> float:
    """`awake` awake (kit wake, through the waker: the other sleeps first); returns when (wall
    time). Read of the stand-ins themselves: a kit status on this loaded machine may take
    longer than `after`, and the model would fall asleep meanwhile."""
    woken = site.kit("wake", awake)
    assert woken.returncode == 0, woken.stdout + woken.stderr
    assert f"{awake} now awake" in woken.stdout or "was already awake" in woken.stdout
    at = time.time()
    assert all(account(site, other)["is_sleeping"] for other in MODELS if other != awake)
    return at


@pytest.mark.serial  # a median difference of ms: a neighbour's load moves it (docs/testing.md)
def test_a_client_alternating_between_a_swap_group_never_fails(
        site: LiveSite, key: str) -> None:
    settle(site, SERVICE)
    order = [OTHER, SERVICE] * 3
    figures = []
    since = time.time() - 1
    for service in order:
        before = wakes(site)
        phase = run_phase(site.gate, key, MODELS[service], streams=16, seconds=2.0)
        after = wakes(site)
        assert phase.failures == [], phase.failures[:3]
        assert {s: after[s] - before[s] for s in MODELS} == {
            s: int(s == service) for s in MODELS}, "exactly one wake per switch"
        first, rest = switch_cost(phase)
        figures.append((service, phase.requests, first, rest, waker_account(site, service)))
    engine_s = []
    for service, requests, first, rest, wake in figures:
        engine_s.append(wake["last_wake_engine_seconds"])
        print(f"switch to {service}: {requests} requests, 0 failed, 1 wake; the client's first "
              f"request {first * 1000:.0f} ms (median of 16), later ones {rest * 1000:.0f} ms; "
              f"the waker's wake {wake['last_wake_seconds'] * 1000:.0f} ms, of which the "
              f"engines' /sleep + /wake_up {wake['last_wake_engine_seconds'] * 1000:.0f} ms "
              f"(programmed {(SLEEP_SECONDS + WAKE_SECONDS) * 1000:.0f} ms)")
    # each switch woke its model (the other one slept first, unless it had idled asleep)
    assert min(engine_s) >= WAKE_SECONDS
    # At the door: a request's time in nginx before it went to the engine (request time minus
    # upstream time, nginx's access log). The held ones (the 16 longest of each switch) against
    # the others (the door's usual work: auth, routing, the waker's answer when awake) and the
    # time the engines took to sleep the other model and wake this one (the programmed times,
    # stretched by this machine's load): what a switch adds at the door is the difference.
    time.sleep(1.5)  # the access log is flushed each second
    at_door = sorted((float(rt) - float(urt) for rt, urt in re.findall(
        r'"POST /v1/chat/completions HTTP/1.1" 200 .* rt=([\d.]+) urt=([\d.]+) ',
        site.nginx_log(since))), reverse=True)
    held, usual = at_door[:16 * len(order)], at_door[16 * len(order):]
    added = (statistics.median(held) - statistics.median(usual)
             - statistics.median(engine_s))
    print(f"at the door: {len(held)} held requests, median {statistics.median(held) * 1000:.0f}"
          f" ms; {len(usual)} others, median {statistics.median(usual) * 1000:.0f} ms; the "
          f"engines' sleep + wake, median {statistics.median(engine_s) * 1000:.0f} ms: a switch "
          f"added {added * 1000:+.0f} ms at the door (medians)")
    assert added <= 0.050


def test_probes_and_scrapes_over_an_idle_period_never_wake_nor_keep_awake(
        site: LiveSite, key: str) -> None:
    settle(site, SERVICE)
    settle(site, OTHER)  # a wake of OTHER, its last use, whatever ran before on the stack
    before = wakes(site)
    gate = site.gate()
    started = time.monotonic()
    calls = 0
    asleep_seen: float | None = None  # when the stand-in itself said OTHER slept
    # until OTHER fell asleep under the calls, then ASLEEP_CALLS_S more of them on it asleep
    while asleep_seen is None or time.monotonic() - asleep_seen < ASLEEP_CALLS_S:
        assert time.monotonic() - started < 2 * AFTER_S, f"{OTHER} never fell asleep"
        for model in MODELS.values():  # the probe identity's completions: never a use
            assert ask(site, model, gate.credentials).status in (200, 503)
        for service in MODELS:
            assert gate.fetch("GET", f"/metrics/{service}", credentials=key).status == 200
        assert gate.fetch("GET", "/health").status == 200
        assert gate.fetch("GET", "/v1/models", credentials=key).status == 200
        calls += 2 + len(MODELS) + 2
        if asleep_seen is None and account(site, OTHER)["is_sleeping"]:
            asleep_seen = time.monotonic()
        time.sleep(0.3)
    idle_s = time.monotonic() - started
    assert wakes(site) == before
    assert states(site) == {SERVICE: "asleep", OTHER: "asleep"}
    slept = waker_account(site, OTHER)
    asleep_at = slept["since"] - slept["last_wake"]  # its last use: the wake
    assert AFTER_S <= asleep_at <= AFTER_S + 3
    print(f"{calls} probe, scrape, health and model-list calls over {idle_s:.0f} s "
          f"(after = {AFTER_S} s): 0 wakes; {OTHER} fell asleep {asleep_at:.1f} s after its "
          "last use")
    reply = ask(site, OTHER_SERVED, gate.credentials)
    assert reply.status == 503 and "the probe does not wake it" in reply.body.decode()


def test_a_failed_wake_is_a_json_503_naming_the_cause_and_stays_asleep(
        site: LiveSite, key: str) -> None:
    settle(site, SERVICE)
    container = site.container(OTHER)
    container.exec_run(["touch", FAIL_FILE])
    try:
        partner_before = account(site, SERVICE)
        since = int(time.time()) - 1
        # a use of SERVICE right before (on this loaded machine it may have idled asleep since
        # settle): OTHER's wake now puts it to sleep to make room
        assert ask(site, SERVED_NAME, key).status == 200
        reply = ask(site, OTHER_SERVED, key)
        assert reply.status == 503, reply.body
        error = json.loads(reply.body)["error"]
        assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
        assert f"{OTHER} answered 500 to POST /wake_up" in error["message"]
        assert reply.headers["Retry-After"] == "10"
        # SERVICE, put to sleep to make room for OTHER, was woken back when OTHER's wake failed
        partner = account(site, SERVICE)
        assert not partner["is_sleeping"]
        slept, woke = (partner[n] - partner_before[n] for n in ("sleeps", "wakes"))
        assert slept == woke >= 1, (slept, woke)  # every sleep undone
        log = site.container(WAKER_SERVICE).logs(since=since).decode(errors="replace")
        assert f"{SERVICE} asleep (to make room for {OTHER})" in log, log
        assert f"{SERVICE} woken back: it slept to make room for {OTHER}" in log, log
        again = ask(site, OTHER_SERVED, key)  # not retried at once: the same cause, fast
        assert again.status == 503 and "its last wake failed" in again.body.decode()
        assert account(site, OTHER)["failed_wakes"] == 1
        assert states(site)[OTHER] == "asleep"
        status = site.kit("status")
        assert f"sleep mode: {OTHER} ASLEEP" in status.stdout
        assert "its last wake FAILED" in status.stdout
        assert "vLLM's log: RuntimeError: CUDA error: out of memory" in status.stdout
        woken = site.kit("wake", OTHER)
        assert woken.returncode == 1
        assert "CUDA error: out of memory" in woken.stderr
        up = site.kit("up")  # kit up's gate fails on it, naming the cause
        assert up.returncode != 0, up.stdout
        assert f"wake {OTHER}" in up.stdout and "its last wake failed" in up.stdout
        assert "vLLM's log: RuntimeError: CUDA error: out of memory" in up.stdout
    finally:
        container.exec_run(["rm", "-f", FAIL_FILE])
    settle(site, OTHER)


def test_kit_sleep_then_a_request_through_the_door_wakes_it(site: LiveSite, key: str) -> None:
    settle(site, SERVICE)
    slept = site.kit("sleep", SERVICE)  # (on this loaded machine it may have idled asleep)
    assert slept.returncode == 0, slept.stdout + slept.stderr
    assert (f"{SERVICE}: {SERVICE} now asleep" in slept.stdout
            or f"{SERVICE}: {SERVICE} was already asleep" in slept.stdout)
    again = site.kit("sleep", SERVICE)
    assert again.returncode == 0 and "was already asleep" in again.stdout
    asleep_bytes = account(site, SERVICE)["gpu_memory_used_bytes"]
    before = wakes(site)[SERVICE]
    assert site.completion(key) == 200  # held at the door while the waker wakes it
    assert wakes(site)[SERVICE] == before + 1
    awake_bytes = account(site, SERVICE)["gpu_memory_used_bytes"]
    assert asleep_bytes < 0.1 * awake_bytes
    print(f"GPU memory (the stand-in's figure) {awake_bytes / 2**30:.1f} GiB awake, "
          f"{asleep_bytes / 2**30:.1f} GiB asleep")


def test_the_door_refuses_the_sleep_routes_even_to_its_users(site: LiveSite, key: str) -> None:
    for credential in (site.basic("ops"), key):
        for path in ("/sleep?level=1", "/wake_up", "/is_sleeping", "/collective_rpc",
                     "/wake/tiny", "/hand/wake/tiny", "/hand/sleep/tiny"):
            reply = site.gate().fetch("POST", path, body={}, credentials=credential)
            assert reply.status == 404, (path, reply.status)
            assert json.loads(reply.body)["error"]["type"] == "NotFoundError"
        # the door's internal location: nginx's own 404, as for its other /_kit/ locations
        assert site.gate().fetch("GET", "/_kit/wake/tiny", credentials=credential).status == 404


def test_probe_and_up_pass_over_a_sleeping_service_without_waking_it(site: LiveSite) -> None:
    settle(site, OTHER)
    before = wakes(site)
    probe = site.kit("probe")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert "skipped: asleep (idle_sleep)" in probe.stdout
    up = site.kit("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert states(site)[SERVICE] == "asleep"
    assert wakes(site) == before  # neither woke it


def test_a_replica_cannot_reach_another_service_s_replica(site: LiveSite, key: str) -> None:
    """Model code in one service's container tries the other's vLLM (its dev routes: /sleep,
    /wake_up, /is_sleeping) by name and at each of its addresses. Each service's replicas are
    on a network of their own, with the front door and the waker: the name does not resolve;
    an address is refused by the engine's isolation between networks, which Docker enforces
    with iptables — an engine run with --iptables=false (kit's test engines) routes between all
    of its networks, and the control (the verifier on the auth network, which no replica is on)
    shows it: then the addresses are reported, not asserted."""
    routes = (("GET", "/is_sleeping"), ("POST", "/sleep?level=1"), ("POST", "/wake_up"))
    for inside, other in ((SERVICE, OTHER), (OTHER, SERVICE)):
        container = site.container(inside)
        assert set(container.attrs["NetworkSettings"]["Networks"]) == {
            site.network(f"backend-{inside}")}, "its own network only"
        for method, path in routes:
            code, said = curl(container, f"http://{other}:8000{path}", method=method,
                              connect_s=NAME_CONNECT_S)
            assert code in UNREACHABLE, f"from {inside}: {other}{path} answered {said}"
        print(f"from {inside}: {other} by name: {UNREACHABLE[code]}")
        verifier = site.container(VERIFIER_SERVICE).attrs["NetworkSettings"]["Networks"]
        control = [curl(container, f"http://{n['IPAddress']}:{VERIFIER_PORT}/")[0]
                   for n in verifier.values()]
        isolating = all(code in UNREACHABLE for code in control)
        networks = site.container(other).attrs["NetworkSettings"]["Networks"]
        for address in [n["IPAddress"] for n in networks.values() if n["IPAddress"]]:
            for method, path in routes:
                code, said = curl(container, f"http://{address}:8000{path}", method=method)
                if isolating:
                    assert code in UNREACHABLE, f"from {inside}: {address}{path} answered {said}"
            print(f"from {inside}: {other} at {address}: "
                  + (UNREACHABLE[code] if isolating else
                     f"answered {said}: this engine does not isolate its networks (the "
                     "verifier's answered too: dockerd --iptables=false)"))
    waker = set(site.container(WAKER_SERVICE).attrs["NetworkSettings"]["Networks"])
    assert {site.network(f"backend-{SERVICE}"), site.network(f"backend-{OTHER}")} <= waker
    for service, model in MODELS.items():  # the door serves both (waking each in turn)
        assert ask(site, model, key).status == 200, service
