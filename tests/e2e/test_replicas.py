"""Replicas on the real engine (issue 10): four replicas of one model (header affinity) and a
second model in two tensor-parallel-2 replicas (prefix affinity), behind the rendered nginx.

Which replica served a request is read from the replicas themselves (the stand-in's
vllm:request_success_total and vllm:num_requests_running, fetched from inside one replica's
container over the private network, all replicas in one exec so the samples are simultaneous).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import yaml

from kit.plan.build import REPLICA_FAIL_TIMEOUT
from tests.support.live_stack import (
    DOMAIN,
    SERVED_NAME,
    SERVICE,
    LiveSite,
    checked,
    finished,
    read_in,
    running,
    wait_for,
    write_spec,
)

pytestmark = pytest.mark.e2e

SECOND, SECOND_SERVED = "duo", "duo-chat"
TINY_REPLICAS = [f"{SERVICE}-r{i}" for i in range(4)]
DUO_REPLICAS = [f"{SECOND}-r{i}" for i in range(2)]
SESSION_HEADER = "X-Session-ID"
METRIC = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with running(
        tmp_path_factory.mktemp("replicas") / "site", docker_client, prefix="rep",
        more_services={SECOND: SECOND_SERVED},
        proxy={"rate_limit_per_ip": 100000, "rate_limit_per_credential": 100000},
        overrides={
            SERVICE: {"gpus": [0, 1, 2, 3], "tensor_parallel": 1, "gpu_memory_utilization": 0.9,
                      "routing": {"affinity": "header", "header": SESSION_HEADER}},
            SECOND: {"gpus": [4, 5, 6, 7], "tensor_parallel": 2, "replicas": 2,
                     "gpu_memory_utilization": 0.9, "routing": {"affinity": "prefix"}},
        },
    ) as site:
        yield site


def post(site: LiveSite, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """One chat completion through the front door (TLS to 127.0.0.1, the domain in SNI)."""
    context = ssl.create_default_context(cafile=str(site.layout.ca_cert))
    connection = http.client.HTTPSConnection(DOMAIN, site.https_port, context=context, timeout=30)
    raw = socket.create_connection(("127.0.0.1", site.https_port), 30)
    connection.sock = context.wrap_socket(raw, server_hostname=DOMAIN)  # not DOMAIN's address
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {
            "Content-Type": "application/json", "Authorization": site.basic("ops"),
            **(headers or {})})
        response = connection.getresponse()
        body = json.loads(response.read() or b"{}")
        if response.status == 503:  # kit's own 503 always says when to come back
            body["retry_after"] = response.headers.get("Retry-After")
        return response.status, body
    finally:
        connection.close()


def chat(model: str, text: str, tokens: int = 1) -> dict:
    return {"model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": text}]}


def metrics(site: LiveSite, hosts: list[str]) -> dict[str, dict[str, float]]:
    """Every replica's vllm:* gauges and counters (summed over labels), read at one moment."""
    script = "; ".join(f'echo "== {h}"; curl -s -m 5 http://{h}:8000/metrics' for h in hosts)
    reader = next(c for c in map(site.container, hosts) if c.status == "running")
    text = read_in(reader, ["sh", "-c", script])
    found: dict[str, dict[str, float]] = {}
    for part in text.split("== ")[1:]:
        host, _, body = part.partition("\n")
        values: dict[str, float] = {}
        for name, value in METRIC.findall(body):
            values[name] = values.get(name, 0.0) + float(value)
        found[host.strip()] = values
    return found


def served_each(site: LiveSite, hosts: list[str],
                sends: dict[str, Callable]) -> dict[str, dict[str, int]]:
    """How many requests each replica finished while each `send()` ran, in turn (every one
    answered 200). Nothing else sends completions, so the counters read after one send are
    the counters before the next: one read between two sends, not two."""
    done = "vllm:request_success_total"
    before = metrics(site, hosts)
    found = {}
    for name, send in sends.items():
        replies = send()
        for status, body in replies if isinstance(replies, list) else [replies]:
            assert status == 200, body
        after = metrics(site, hosts)
        found[name] = {h: round(after[h].get(done, 0) - before[h].get(done, 0)) for h in hosts}
        before = after
    return found


def served(site: LiveSite, hosts: list[str], send) -> dict[str, int]:
    """How many requests each replica finished while `send()` ran (every one answered 200)."""
    return served_each(site, hosts, {"send": send})["send"]


def test_every_replica_is_its_own_pinned_container_and_both_models_answer(site: LiveSite):
    gpus = {h: site.container(h).attrs["HostConfig"]["DeviceRequests"][0]["DeviceIDs"]
            for h in TINY_REPLICAS + DUO_REPLICAS}
    assert gpus == {"tiny-r0": ["0"], "tiny-r1": ["1"], "tiny-r2": ["2"], "tiny-r3": ["3"],
                    "duo-r0": ["4", "5"], "duo-r1": ["6", "7"]}
    labels = site.container("tiny-r2").labels
    assert (labels["io.kit.service"], labels["io.kit.replica"]) == (SERVICE, "2")
    listed = site.gate().fetch("GET", "/v1/models", credentials=site.basic("ops")).json()
    assert {m["id"] for m in listed["data"]} == {SERVED_NAME, SECOND_SERVED}
    assert served(site, DUO_REPLICAS, lambda: post(site, chat(SECOND_SERVED, "hi")))  # duo only
    for model, hosts in ((SERVED_NAME, TINY_REPLICAS), (SECOND_SERVED, DUO_REPLICAS)):
        counts = served(site, hosts, lambda m=model: post(site, chat(m, "hi")))
        assert sum(counts.values()) == 1, counts
    # kit status and the probe see every replica
    status = json.loads(checked(site.kit("status", "--json")).stdout)
    assert status["replicas"] == {SERVICE: {"healthy": 4, "replicas": 4, "in_rotation": 4},
                                  SECOND: {"healthy": 2, "replicas": 2, "in_rotation": 2}}
    probe = json.loads(checked(site.kit("probe", "--json")).stdout)
    replicas = {c["name"]: c["ok"] for c in probe["checks"] if c["name"].startswith("replica ")}
    assert replicas == {f"replica {h}": True for h in TINY_REPLICAS + DUO_REPLICAS}


def test_least_connections_keeps_16_streams_even_across_4_replicas(site: LiveSite):
    key = site.add_key(f"even-{secrets.token_hex(2)}")
    load = site.loadgen(f"Bearer {key}", streams=16, tokens=120, requests=50, duration=6,
                        announce=True)
    assert load.stderr.readline() == "streaming\n"
    samples = []
    while load.poll() is None and len(samples) < 20:
        running = metrics(site, TINY_REPLICAS)
        samples.append([running[h].get("vllm:num_requests_running", 0) for h in TINY_REPLICAS])
        time.sleep(0.2)
    figures = finished(load)
    assert figures["failures"] == {} and figures["ok"] > 16, figures
    means = [statistics.mean(column) for column in zip(*samples, strict=True)]
    ratio = max(means) / min(means)
    print(f"in flight per replica (mean of {len(samples)} samples): {means}, max/min {ratio:.3f}")
    assert ratio <= 1.25, (means, samples)


def test_the_same_session_header_lands_on_one_replica(site: LiveSite):
    sessions = [f"session-{i}" for i in range(12)]
    turns = {session: 100 if session == sessions[0] else 5 for session in sessions}
    homes = {}
    for session, counts in served_each(site, TINY_REPLICAS, {s: lambda s=s: [
            post(site, chat(SERVED_NAME, f"turn {n}"), {SESSION_HEADER: s})
            for n in range(turns[s])] for s in sessions}).items():
        (home,) = [h for h, n in counts.items() if n]  # every request of it on one replica
        homes[session] = home
        assert counts[home] == turns[session], counts
    assert len(set(homes.values())) >= 3, homes  # sessions spread over the replicas


def test_the_same_conversation_lands_on_one_replica(site: LiveSite):
    def conversation(n: int, turns: int) -> dict:
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": f"Question number {n}?"}]
        for turn in range(turns):
            messages += [{"role": "assistant", "content": f"Answer {turn}."},
                         {"role": "user", "content": f"And then {turn}?"}]
        return {"model": SECOND_SERVED, "max_tokens": 1, "messages": messages}

    counts = served(site, DUO_REPLICAS, lambda: [
        post(site, conversation(7, turn % 5)) for turn in range(100)])
    assert sorted(counts.values()) == [0, 100], counts  # it grows, and keeps its replica
    conversations = served_each(site, DUO_REPLICAS, {
        str(n): lambda n=n: post(site, conversation(n, 0)) for n in range(8)})
    homes = {h for counts in conversations.values() for h, c in counts.items() if c}
    assert homes == set(DUO_REPLICAS)  # different conversations use both


def test_a_session_moves_only_when_its_replica_leaves(site: LiveSite):
    sessions = [f"move-{i}" for i in range(16)]

    def homes(chosen: list[str], hosts: list[str] = TINY_REPLICAS) -> dict[str, str]:
        """The replica of `hosts` that served each session's request (one each, in turn)."""
        counted = served_each(site, hosts, {s: lambda s=s: post(
            site, chat(SERVED_NAME, "hi"), {SESSION_HEADER: s}) for s in chosen})
        found = {}
        for session, counts in counted.items():
            (found[session],) = [h for h, n in counts.items() if n]
        return found

    before = homes(sessions)
    leaving = before[sessions[0]]
    site.container(leaving).stop(timeout=5)
    try:
        # counted by the replicas still there (a read of the stopped one only waited out curl's
        # 5 s, for nothing): every request answered 200 and exactly one of them served it
        during = homes(sessions, [h for h in TINY_REPLICAS if h != leaving])
        assert all(during[s] == before[s] for s in sessions if before[s] != leaving), (before,
                                                                                      during)
    finally:
        site.container(leaving).start()
        deadline = time.monotonic() + 60
        while site.container(leaving).attrs["State"].get("Health", {}).get("Status") != "healthy":
            assert time.monotonic() < deadline, f"{leaving} did not come back"
            time.sleep(0.5)
    # nginx tries it again after fail_timeout: within the 11 s this test used to sleep, the
    # session that moved is home again, and then every session is
    wait_for(f"{sessions[0]} back on {leaving}",
             lambda: homes(sessions[:1])[sessions[0]] == leaving, REPLICA_FAIL_TIMEOUT + 1)
    assert homes(sessions) == before


def test_a_killed_replica_costs_only_its_streams_and_rejoins(site: LiveSite):
    key = site.add_key(f"kill-{secrets.token_hex(2)}")
    load = site.loadgen(f"Bearer {key}", streams=16, tokens=250, announce=True)
    assert load.stderr.readline() == "streaming\n"
    victim = site.container("tiny-r1")
    serving = metrics(site, ["tiny-r1"])["tiny-r1"].get("vllm:num_requests_running", 0)
    victim.kill()
    time.sleep(1)
    # every request that starts 1 s after the kill succeeds (the kill is still fresh: nginx
    # meets the dead replica, skips it and sends the request on)
    after = site.loadgen(f"Bearer {key}", streams=16, tokens=20, requests=3)
    figures, later = finished(load), finished(after)
    print(f"killed tiny-r1 serving {serving:.0f}: {figures['failures']}, ok {figures['ok']}; "
          f"started 1 s later: ok {later['ok']}, failed {later['failures']}")
    assert 0 < figures["failed"] <= serving, figures
    assert later["failures"] == {} and later["ok"] == 48, later
    # kit status shows it; Docker counts `docker kill` as a manual stop (no restart policy), so
    # the operator's `kit up` restarts it (a crash of vLLM itself restarts on its own)
    status = json.loads(checked(site.kit("status", "--json")).stdout)
    entry = next(c for c in status["containers"] if c["service"] == "tiny-r1")
    assert entry["state"] == "exited" and status["replicas"][SERVICE]["healthy"] == 3, status
    assert any("start container" in line and "tiny-r1" in line for line in status["drift"])
    checked(site.kit("up"))
    counts = served(site, TINY_REPLICAS, lambda: [
        post(site, chat(SERVED_NAME, "back?"), {SESSION_HEADER: f"rejoin-{i}"})
        for i in range(40)])
    assert counts["tiny-r1"] > 0, counts  # it rejoined


def test_a_replica_that_crashes_restarts_by_itself_and_rejoins(site: LiveSite):
    """vLLM dying on its own (not `docker kill`): the restart policy brings it back, on the
    address nginx knows, and nginx sends it requests again after fail_timeout."""
    victim = site.container("tiny-r3")
    restarts = victim.attrs["RestartCount"]
    os.kill(victim.attrs["State"]["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        victim.reload()
        if (victim.attrs["RestartCount"] > restarts
                and victim.attrs["State"].get("Health", {}).get("Status") == "healthy"):
            break
        assert time.monotonic() < deadline, victim.attrs["State"]
        time.sleep(0.5)
    # passive health: nginx tries it again after fail_timeout; asked until it serves, within
    # the 11 s this test used to sleep before its one round of 40 requests
    wait_for("tiny-r3 serving again", lambda: served(site, TINY_REPLICAS, lambda: [
        post(site, chat(SERVED_NAME, "back?")) for _ in range(8)])["tiny-r3"] > 0,
        REPLICA_FAIL_TIMEOUT + 1)


def test_with_no_replica_left_the_front_door_answers_503_json(site: LiveSite):
    for host in DUO_REPLICAS:
        site.container(host).stop(timeout=5)
    try:
        status, body = post(site, chat(SECOND_SERVED, "anyone?"))
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError", body
    finally:  # kit up starts them and reloads nginx, which forgets they had failed
        checked(site.kit("up"))


def test_a_rolling_update_under_64_streams_fails_none_and_keeps_3_in_service(site: LiveSite):
    """Change the service (max_num_seqs) and `kit up` while batches of 64 streams run: each
    replica leaves nginx, drains, is replaced and comes back; never fewer than 3 serve."""
    key = site.add_key(f"roll-{secrets.token_hex(2)}")
    spec = yaml.safe_load(site.spec_path.read_text())
    spec["services"][0]["max_num_seqs"] = 200
    write_spec(site.spec_path, spec)
    before = {h: site.container(h).id for h in TINY_REPLICAS}
    pool = site.layout.replica_pool(SERVICE)
    in_service: list[int] = []
    batches: list[dict] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            down = {line.split("server ")[1].split(":")[0]
                    for line in pool.read_text().splitlines() if line.endswith(" down;")}
            # one list call, labels from the list itself: a container the rollout removes
            # between a list and an inspect of it (containers.list inspects each) is no 404
            listed = site.client.api.containers(filters={
                "label": [f"com.docker.compose.project={site.name}", f"io.kit.service={SERVICE}"],
                "health": "healthy"})
            healthy = {c["Labels"]["com.docker.compose.service"] for c in listed}
            in_service.append(len(healthy - down))
            time.sleep(0.2)

    def load() -> None:
        while not done.is_set():
            batches.append(finished(site.loadgen(f"Bearer {key}", streams=64, tokens=60)))

    threads = [threading.Thread(target=sample), threading.Thread(target=load)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        started = time.monotonic()
        rolled = site.kit("up")
        took = time.monotonic() - started
        time.sleep(2)
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=120)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "roll tiny one replica at a time" in rolled.stdout, rolled.stdout
    assert rolled.stdout.count("back in nginx") == 4, rolled.stdout
    after = {h: site.container(h).id for h in TINY_REPLICAS}
    assert all(after[h] != before[h] for h in TINY_REPLICAS)  # every replica was replaced
    requests = sum(b["requests"] for b in batches)
    failed = {k: v for b in batches for k, v in b["failures"].items()}
    print(f"rolling update took {took:.0f}s: {requests} requests in {len(batches)} batches of "
          f"64 streams, failed {failed}; replicas in service min {min(in_service)}, "
          f"samples {len(in_service)}")
    assert failed == {} and requests >= 64 * 5, batches
    assert min(in_service) >= 3 and 4 in in_service, in_service
    assert " down;" not in pool.read_text()


def test_a_replica_that_fails_mid_rollout_stops_it_with_the_others_serving(site: LiveSite):
    """A change that breaks vLLM's start (its GPU is too small for the weights: CUDA out of
    memory at load) reaches only the first replica: the rollout stops there, kit up exits 1
    with the diagnosis, the three old replicas serve on without a failed request; the spec
    put back, the next kit up brings the first one back."""
    original = site.spec_path.read_text()
    spec = yaml.safe_load(original)
    spec["services"][0]["env"]["STANDIN_GPU_MEMORY_GIB"] = "1"
    write_spec(site.spec_path, spec)
    before = {h: site.container(h).id for h in TINY_REPLICAS}
    broken, requests, failed = site.up_under_load(16)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "rolling update of tiny stopped at tiny-r0 (0 of 4 replaced)" in broken.stderr, (
        broken.stderr)
    assert "CUDA out of memory" in broken.stderr, broken.stderr
    pool = site.layout.replica_pool(SERVICE).read_text()
    assert f"server {TINY_REPLICAS[0]}:8000 max_fails=1 fail_timeout=10s down;" in pool
    assert all(site.container(h).id == before[h] for h in TINY_REPLICAS[1:])
    print(f"rollout stopped at the first replica: {requests} requests (16 streams), "
          f"failed {failed}")
    assert failed == {} and requests >= 16 * 3
    # status names the replica nginx leaves out (it runs; it carries no request)
    report = json.loads(site.kit("status", "--json").stdout)
    rotation = {c["service"]: c["in_rotation"] for c in report["containers"]
                if c.get("replica_of") == SERVICE}
    assert rotation == {h: h != TINY_REPLICAS[0] for h in TINY_REPLICAS}, rotation
    assert report["replicas"][SERVICE]["in_rotation"] == 3, report["replicas"]
    assert f"out of rotation: {TINY_REPLICAS[0]} (nginx sends it no request" in site.kit(
        "status").stdout
    site.spec_path.write_text(original)
    repaired = site.kit("up")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert " down;" not in site.layout.replica_pool(SERVICE).read_text()
    assert site.container(TINY_REPLICAS[0]).status == "running"


def test_fewer_replicas_under_32_streams_fail_none(site: LiveSite):
    """Drop two of the four replicas while batches of 32 streams run: nginx reloads without
    them, each drains, and only then is it removed; no request fails. (Runs after the other
    tests of this site: it leaves two replicas.)"""
    spec = yaml.safe_load(site.spec_path.read_text())
    spec["services"][0]["gpus"] = [0, 1]
    write_spec(site.spec_path, spec)
    result, requests, failed = site.up_under_load(32)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("retire replica") == 2, result.stdout
    assert "remove container" not in result.stdout, result.stdout
    print(f"two replicas retired: {requests} requests (32 streams), failed {failed}")
    assert failed == {} and requests >= 32 * 3
    left = {c.labels["com.docker.compose.service"] for c in site.client.containers.list(
        all=True, filters={"label": [f"com.docker.compose.project={site.name}",
                                     f"io.kit.service={SERVICE}"]})}
    assert left == set(TINY_REPLICAS[:2])


def test_a_single_replica_service_is_503_json_while_it_restarts(
    tmp_path, docker_client, test_images, free_port, cleanup_project
):
    """One replica cannot roll: kit up says so (with its last start time), and the gap is a
    JSON 503 with Retry-After that a client may retry, never nginx's 502."""
    site = LiveSite.create(tmp_path / "single", docker_client, free_port(), free_port(),
                           prefix="one")
    cleanup_project(site.name)
    site.up()
    spec = yaml.safe_load(site.spec_path.read_text())
    spec["services"][0]["max_num_seqs"] = 200
    write_spec(site.spec_path, spec)
    answers: list[tuple[int, dict]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            answers.append(post(site, chat(SERVED_NAME, "still there?")))
            time.sleep(0.2)

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        result = site.kit("up")
    finally:
        done.set()
        asking.join(timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"tiny has one replica: it is down until its replacement is healthy "
                     r"\(its last start took \d+s\)", result.stdout), result.stdout
    statuses = {status for status, _ in answers}
    assert statuses <= {200, 503} and 503 in statuses, answers
    unavailable = [body for status, body in answers if status == 503]
    assert all(body["error"]["type"] == "ServiceUnavailableError" and body["retry_after"] == "5"
               for body in unavailable), unavailable
    assert answers[-1][0] == 200
