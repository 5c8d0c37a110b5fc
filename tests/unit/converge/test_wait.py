"""The health wait against the fake engine: a start that fails ends the wait at once, with the
log tail and the diagnosis, long before the timeout."""

import time
from pathlib import Path

import pytest

from kit.converge.wait import wait_healthy
from kit.engine.desired import DesiredState
from kit.errors import KitError
from tests.support.fake_engine import FakeEngine
from tests.support.fake_stack import IMAGES, converge, desired_state, stack_folder
from tests.support.sites import REPO

FAILURES = REPO / "tests" / "data" / "vllm-failures"
TIMEOUT = 600  # far beyond the test: a failure must end the wait long before


def started(root: Path) -> tuple[FakeEngine, DesiredState]:
    """The stack built on the fake; backend `a` restarted and starting again."""
    site = stack_folder(root)
    engine, desired = FakeEngine(IMAGES), desired_state(site)
    converge(engine, desired, site / ".kit" / "applied.json")
    engine.set_health("p-a-1", "starting")
    return engine, desired


def test_an_exit_while_starting_ends_the_wait_with_the_log_and_the_cause(
    tmp_path: Path,
) -> None:
    engine, desired = started(tmp_path)
    engine.write_log("p-a-1", (FAILURES / "kv-cache-too-small.txt").read_text())
    engine.schedule("p-a-1", after=3, Status="exited", Running=False, ExitCode=1)
    began = time.monotonic()
    with pytest.raises(KitError) as failed:
        wait_healthy(engine, desired, (desired.service("a"),), timeout=TIMEOUT)
    assert time.monotonic() - began < 5
    message = str(failed.value)
    assert "service a did not become healthy" in message
    assert "its container exited (code 1)" in message
    assert "KV cache" in message  # the log tail (the recorded vLLM failure)
    assert "cause:" in message and "spec key:" in message  # the diagnosis


def test_a_restart_by_the_engine_counts_as_a_failure(tmp_path: Path) -> None:
    engine, desired = started(tmp_path)
    engine.schedule("p-a-1", after=2, restarts=1)
    with pytest.raises(KitError, match="exited and was restarted"):
        wait_healthy(engine, desired, (desired.service("a"),), timeout=TIMEOUT)


def test_healthy_services_end_the_wait(tmp_path: Path) -> None:
    engine, desired = started(tmp_path)
    engine.schedule("p-a-1", after=3, Health={"Status": "healthy"})
    seconds = wait_healthy(engine, desired, (desired.service("a"), desired.service("b")),
                           timeout=TIMEOUT)
    assert set(seconds) == {"a", "b"} and seconds["a"] > 0
