"""`kit sleep` / `kit wake` / `kit status` on the real rendered stack (issue 26), the stand-in as
the service with idle_sleep (it imitates vLLM's sleep mode: tests/standin/vllm_standin/sleep.py;
it is not vLLM): kit reaches the dev routes inside the container, never through the door; a
request sent through the door while the model sleeps is held by the engine and answered once
`kit wake` completes; a wake told to fail exits 1 with vLLM's cause and leaves it asleep."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.live_stack import SERVICE, LiveSite, running

pytestmark = pytest.mark.e2e

FAIL_FILE = "/tmp/kit-test-fail-wake"
WAKE_SECONDS = 0.5


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path_factory.mktemp("sleep") / "site", docker_client, prefix="slp",
                 env={"STANDIN_SLEEP_SECONDS": "0.2", "STANDIN_WAKE_SECONDS": str(WAKE_SECONDS),
                      "STANDIN_WAKE_FAIL_FILE": FAIL_FILE},
                 overrides={SERVICE: {"idle_sleep": {"after": "15m", "level": 1}}}) as site:
        yield site


def states(site: LiveSite) -> list[str]:
    result = site.kit("status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return [entry["state"] for entry in json.loads(result.stdout)["sleep"]]


def standin_state(site: LiveSite) -> dict:
    """The stand-in's own account (its /standin/sleep route, asked inside its container)."""
    code, out = site.container(SERVICE).exec_run(
        ["curl", "-sS", "http://127.0.0.1:8000/standin/sleep"])
    assert code == 0, out
    return json.loads(out)


def test_sleep_holds_a_request_at_the_engine_until_wake(site: LiveSite) -> None:
    key = f"Bearer {site.add_key('sleeper')}"
    assert states(site) == ["awake"]
    awake_bytes = standin_state(site)["gpu_memory_used_bytes"]
    slept = site.kit("sleep", SERVICE)
    assert slept.returncode == 0, slept.stdout + slept.stderr
    assert f"{SERVICE}: {SERVICE} now asleep" in slept.stdout
    again = site.kit("sleep", SERVICE)
    assert again.returncode == 0 and "was already asleep" in again.stdout
    assert states(site) == ["asleep"]
    asleep_bytes = standin_state(site)["gpu_memory_used_bytes"]
    assert asleep_bytes < 0.1 * awake_bytes
    assert site.status("/v1/models", key) == 200  # answered asleep, as vLLM does

    answers: list[tuple[int, float]] = []
    held = threading.Thread(target=lambda: answers.append(
        (site.completion(key), time.monotonic())), daemon=True)
    held.start()
    time.sleep(2)
    assert not answers, "answered while asleep"
    assert standin_state(site)["held"] == 1
    woke_at = time.monotonic()
    woken = site.kit("wake", SERVICE)
    assert woken.returncode == 0, woken.stdout + woken.stderr
    held.join(timeout=30)
    assert answers and answers[0][0] == 200
    assert answers[0][1] > woke_at + WAKE_SECONDS
    assert states(site) == ["awake"]
    print(f"GPU memory (the stand-in's figure) {awake_bytes / 2**30:.1f} GiB awake, "
          f"{asleep_bytes / 2**30:.1f} GiB asleep; the held request answered "
          f"{answers[0][1] - woke_at:.2f} s after kit wake began")


def test_the_door_refuses_the_sleep_routes_even_to_its_users(site: LiveSite) -> None:
    for credential in (site.basic("ops"), f"Bearer {site.add_key('intruder')}"):
        for path in ("/sleep?level=1", "/wake_up", "/is_sleeping", "/collective_rpc"):
            reply = site.gate().fetch("POST", path, body={}, credentials=credential)
            assert reply.status == 404, (path, reply.status)
            assert json.loads(reply.body)["error"]["type"] == "NotFoundError"
    assert states(site) == ["awake"]


def test_a_failed_wake_exits_1_with_the_cause_and_stays_asleep(site: LiveSite) -> None:
    container = site.container(SERVICE)
    assert site.kit("sleep", SERVICE).returncode == 0
    container.exec_run(["touch", FAIL_FILE])
    try:
        failed = site.kit("wake", SERVICE)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "POST /wake_up answered 500: Internal Server Error" in failed.stderr
        assert "CUDA error: out of memory" in failed.stderr
        assert states(site) == ["asleep"]
        status = site.kit("status")
        assert f"sleep mode: {SERVICE} ASLEEP" in status.stdout
    finally:
        container.exec_run(["rm", "-f", FAIL_FILE])
    assert site.kit("wake", SERVICE).returncode == 0
    assert states(site) == ["awake"]


def test_probe_and_up_pass_over_a_sleeping_service_without_waking_it(site: LiveSite) -> None:
    assert site.kit("sleep", SERVICE).returncode == 0
    wakes = standin_state(site)["wakes"]
    probe = site.kit("probe")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert "skipped: asleep (idle_sleep)" in probe.stdout
    up = site.kit("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert states(site) == ["asleep"]
    assert standin_state(site)["wakes"] == wakes  # neither woke it
    assert site.kit("wake", SERVICE).returncode == 0
