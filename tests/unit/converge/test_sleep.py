"""`kit sleep` / `kit wake` and `kit status`'s awake/asleep (issue 26), on the fake engine: every
replica of the service, reached by curl inside its container (never through the front door),
idempotent, exit 1 naming the replica and vLLM's cause when one could not, exit 2 for a service
without idle_sleep; a site without idle_sleep is never asked."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

import kit.commands.sleep
from kit.converge.sleep import asleep_services, failed_wakes
from kit.front_door.gate import ASLEEP_SKIP
from kit.front_door.replica_check import replica_checks
from kit.site import Site
from kit.stack.up import up_site
from kit.views.status import gather, render_text
from tests.support.cli import run_kit
from tests.support.sites import REPO, spec_in_folder
from tests.support.sleepy_engine import SleepyEngine

EXAMPLE = REPO / "tests" / "data" / "replicas" / "site.yaml"
QWEN = ["gpu02-qwen32b-r0-1", "gpu02-qwen32b-r1-1"]


def sleepy_site(root: Path, level: int = 2) -> Path:
    """The replicas example with idle_sleep on qwen32b (two tensor-parallel-2 replicas)."""
    folder = spec_in_folder(EXAMPLE, root / "replicas")
    spec = folder / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "    replicas: 2\n", f"    replicas: 2\n    idle_sleep: {{after: 15m, level: {level}}}\n"))
    return spec


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> SleepyEngine:
    engine = SleepyEngine()
    monkeypatch.setattr(kit.commands.sleep, "connect", lambda _: engine)
    return engine


def brought_up(spec: Path, engine: SleepyEngine) -> Site:
    site = Site.load(spec, check_host=False)
    up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    return site


def test_sleep_and_wake_every_replica_idempotently(tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path)
    brought_up(spec, engine)
    result = run_kit("sleep", spec, "qwen32b")
    assert result.exit_code == 0, result.output
    assert engine.asleep == set(QWEN)
    assert [path for _, path in engine.posts] == ["/sleep?level=2"] * 2
    assert "qwen32b: qwen32b-r0 now asleep" in result.output

    again = run_kit("sleep", spec, "qwen32b")
    assert again.exit_code == 0, again.output
    assert len(engine.posts) == 2 and "was already asleep" in again.output

    engine.posts.clear()
    woken = run_kit("wake", spec, "qwen32b")
    assert woken.exit_code == 0, woken.output
    assert engine.asleep == set()
    # level 2: the weights reloaded and the prefix cache reset after each replica's wake
    assert engine.posts == [(name, path) for name in QWEN for path in
                            ("/wake_up", "/collective_rpc", "/reset_prefix_cache")]
    assert run_kit("wake", spec, "qwen32b").output.count("was already awake") == 2


def test_status_asks_is_sleeping_of_the_sleeping_services_only(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path, level=1)
    site = brought_up(spec, engine)
    engine.asleep.add(QWEN[1])
    report = gather(site, engine)
    assert sorted(engine.asked) == QWEN
    assert [(s.replica, s.state) for s in report.sleep] == [("qwen32b-r0", "awake"),
                                                             ("qwen32b-r1", "asleep")]
    text = render_text(report, datetime.now(UTC))
    assert "sleep mode: qwen32b-r1 ASLEEP" in text and "sleep mode: qwen32b-r0 AWAKE" in text
    assert report.to_json(datetime.now(UTC))["sleep"][1] == {
        "service": "qwen32b", "replica": "qwen32b-r1", "state": "asleep"}


def test_a_site_without_idle_sleep_is_never_asked(tmp_path: Path, engine: SleepyEngine) -> None:
    spec = spec_in_folder(EXAMPLE, tmp_path / "plain") / "site.yaml"
    site = brought_up(spec, engine)
    report = gather(site, engine)
    assert engine.asked == [] and report.sleep == ()
    assert "sleep" not in report.to_json(datetime.now(UTC))


def test_a_failed_wake_exits_1_naming_the_replica_and_vllms_cause(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path, level=1)
    brought_up(spec, engine)
    assert run_kit("sleep", spec, "qwen32b").exit_code == 0
    engine.fail_wake.add(QWEN[0])
    result = run_kit("wake", spec, "qwen32b")
    assert result.exit_code == 1, result.output
    assert ("qwen32b-r0: POST /wake_up answered 500: Internal Server Error (its log: "
            "RuntimeError: CUDA error: out of memory)") in result.output
    assert engine.asleep == set(QWEN)  # it stays asleep; nothing went on past the failure


def test_bad_service_names_exit_2_with_the_fix(tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path)
    brought_up(spec, engine)
    calls = len(engine.calls)
    plain = run_kit("sleep", spec, "llama8b")
    assert plain.exit_code == 2
    assert "service 'llama8b' has no idle_sleep" in plain.output
    assert "add `idle_sleep: {after: 15m}` to services[0] and run kit up" in plain.output
    unknown = run_kit("wake", spec, "qwen")
    assert unknown.exit_code == 2 and "name one of: llama8b, qwen32b" in unknown.output
    assert len(engine.calls) == calls  # nothing asked of the engine


def test_a_stopped_replica_or_one_without_dev_mode_exits_1(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path)
    brought_up(spec, engine)
    engine.no_dev_mode.add(QWEN[0])
    result = run_kit("sleep", spec, "qwen32b")
    assert result.exit_code == 1
    assert "qwen32b-r0: its vLLM has no /is_sleeping" in result.output
    assert "run kit up: it recreates the container" in result.output
    engine.no_dev_mode.clear()
    engine.stop(QWEN[1])
    result = run_kit("sleep", spec, "qwen32b")
    assert result.exit_code == 1 and "qwen32b-r1 is not running" in result.output
    assert engine.posts == []  # refused before any replica changed
    text = render_text(gather(Site.load(spec, check_host=False), engine), datetime.now(UTC))
    assert "sleep mode: qwen32b-r1 UNKNOWN (not running)" in text


def test_the_probe_sends_no_completion_to_a_sleeping_service(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path)
    site = brought_up(spec, engine)
    engine.asleep.add(QWEN[1])  # one replica asleep: a request routed to it would be held
    asleep = asleep_services(site, lambda: engine)
    assert asleep == {"qwen32b"}
    engine.calls.clear()
    checks = {check.name: check for check in replica_checks(site, lambda: engine, asleep)}
    for host in ("qwen32b-r0", "qwen32b-r1"):
        assert checks[f"replica {host}"].skipped and checks[f"replica {host}"].ok
        assert checks[f"replica {host}"].detail == ASLEEP_SKIP
    assert checks["replica llama8b-r0"].ok and not checks["replica llama8b-r0"].skipped
    completions = [about for method, about in engine.calls
                   if method == "exec" and "/v1/chat/completions" in about]
    assert len(completions) == 4  # llama8b's four replicas only


def test_a_site_without_idle_sleep_never_connects_for_the_probe(tmp_path: Path) -> None:
    spec = spec_in_folder(EXAMPLE, tmp_path / "plain") / "site.yaml"

    def no_engine() -> SleepyEngine:
        raise AssertionError("connected")

    assert asleep_services(Site.load(spec, check_host=False), no_engine) == frozenset()


def test_sleep_by_hand_never_cuts_requests_in_flight(tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path)
    brought_up(spec, engine)
    engine.busy[QWEN[1]] = 3  # the second: the first must not be asleep alone meanwhile
    result = run_kit("sleep", spec, "qwen32b")
    assert result.exit_code == 1, result.output
    assert "qwen32b-r1 has 3 request(s) in flight" in result.output
    assert engine.posts == [] and engine.asleep == set()
    del engine.busy[QWEN[1]]
    assert run_kit("sleep", spec, "qwen32b").exit_code == 0
    assert engine.asleep == set(QWEN)


def test_with_the_waker_running_it_makes_the_change_and_says_why_not(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path, level=1)
    brought_up(spec, engine)
    engine.waker = {"/hand/sleep/qwen32b": (200, {"changed": True, "state": "asleep"}),
                    "/hand/wake/qwen32b": (200, {"changed": False, "state": "awake"})}
    slept = run_kit("sleep", spec, "qwen32b")
    assert slept.exit_code == 0, slept.output
    assert "qwen32b: qwen32b-r0 now asleep" in slept.output
    assert engine.posts == []  # the waker made it, not kit's curl
    woken = run_kit("wake", spec, "qwen32b")
    assert woken.output.count("was already awake") == 2
    assert engine.waker_asked == ["/hand/sleep/qwen32b", "/hand/wake/qwen32b"]

    engine.write_log(QWEN[0], "Traceback (most recent call last):\n"
                     "RuntimeError: CUDA error: out of memory\n")
    engine.waker["/hand/wake/qwen32b"] = (503, {"error": {
        "message": "qwen32b-r0 answered 500 to POST /wake_up (Internal Server Error)",
        "type": "ServiceUnavailableError", "param": None, "code": 503}})
    failed = run_kit("wake", spec, "qwen32b")
    assert failed.exit_code == 1
    assert ("qwen32b: the waker (sleep-waker) could not wake it: qwen32b-r0 answered 500 to "
            "POST /wake_up (Internal Server Error) (vLLM's log: RuntimeError: CUDA error: out "
            "of memory)") in failed.output


def test_status_shows_the_wakers_account_and_a_failed_wakes_cause(
        tmp_path: Path, engine: SleepyEngine) -> None:
    spec = sleepy_site(tmp_path, level=1)
    site = brought_up(spec, engine)
    engine.asleep.update(QWEN)
    engine.fail_wake.add(QWEN[0])
    engine.write_log(QWEN[0], "Traceback (most recent call last):\n"
                     "RuntimeError: CUDA error: out of memory\n")
    engine.waker = {"/state": (200, {"services": [{
        "service": "qwen32b", "state": "asleep", "since": 1_800_000_000.0, "wakes": 3,
        "last_wake": 1_799_999_000.0, "last_wake_seconds": 0.71,
        "failure": "qwen32b-r0 answered 500 to POST /wake_up (Internal Server Error)"}]})}
    report = gather(site, engine)
    text = render_text(report, datetime.now(UTC))
    assert ("sleep mode: qwen32b-r0 ASLEEP since 2027-01-15 08:00:00 UTC, 3 wake(s), last "
            "2027-01-15 07:43:20 UTC (0.71 s)") in text
    assert "its last wake FAILED: qwen32b-r0 answered 500 to POST /wake_up" in text
    assert "vLLM's log: RuntimeError: CUDA error: out of memory" in text
    entry = report.to_json(datetime.now(UTC))["sleep"][0]
    assert entry["waker"]["wakes"] == 3
    assert entry["waker"]["cause"] == "RuntimeError: CUDA error: out of memory"
    (check,) = failed_wakes(site, lambda: engine)  # kit up's and kit probe's gate fail on it
    assert (check.name, check.ok) == ("wake qwen32b", False)
    assert check.detail == ("its last wake failed: qwen32b-r0 answered 500 to POST /wake_up "
                            "(Internal Server Error); vLLM's log: RuntimeError: CUDA error: out "
                            "of memory (it stays asleep; see kit logs, then kit wake qwen32b)")
    engine.waker = {"/state": (200, {"services": [{"service": "qwen32b", "state": "asleep"}]})}
    assert failed_wakes(site, lambda: engine) == []


def swap_site(root: Path) -> Path:
    """The replicas example with both services on GPUs 0-3 as one swap group."""
    folder = spec_in_folder(EXAMPLE, root / "swap")
    spec = folder / "site.yaml"
    text = spec.read_text().replace("gpus: [4, 5, 6, 7]", "gpus: [0, 1, 2, 3]")
    text = text.replace("    max_num_seqs: 128\n", "    max_num_seqs: 128\n    idle_sleep: "
                        "{after: 15m, swap_group: g}\n")
    text = text.replace("    max_num_seqs: 64\n", "    max_num_seqs: 64\n    idle_sleep: "
                        "{after: 15m, level: 2, swap_group: g}\n")
    spec.write_text(text)
    return spec


def test_up_starts_a_swap_group_one_member_at_a_time(tmp_path: Path,
                                                     engine: SleepyEngine) -> None:
    spec = swap_site(tmp_path)
    lines: list[str] = []
    site = Site.load(spec, check_host=False)
    up_site(site, timeout=5, probe=False, report=lines.append, warn=lambda _: None,
            connect=lambda: engine)
    llama = [f"gpu02-llama8b-r{i}-1" for i in range(4)]
    assert engine.asleep == set(llama)  # the first member slept before the second started
    assert sorted(engine.posts) == sorted((name, "/sleep?level=1") for name in llama)
    steps = [line for line in lines if "qwen32b-r0" in line or line.startswith("sleep ")]
    assert steps[:4] == [f"sleep {name}: swap group g: qwen32b-r0 starts next" for name in llama]
    assert "create container gpu02-qwen32b-r0-1" in steps[4]
    assert not any(line.startswith("sleep gpu02-qwen32b") for line in lines)  # replicas: together

    engine.posts.clear()  # a second up with nothing changed: nothing to sleep
    up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    assert engine.posts == []
