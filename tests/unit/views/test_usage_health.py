"""`kit status`'s view of the usage ledger: the collector's own /health (a real collector run on
a spool here), asked through the engine's exec; a collector that is missing, stopped or
answers nonsense is shown as not recording, never as healthy."""

import json
from datetime import UTC, datetime
from pathlib import Path

from kit.engine.observe import ContainerState
from kit.plan.usage import HEALTH_ARGV, USAGE_SERVICE
from kit.views.usage_health import ledger_health
from tests.support.fake_engine import ExecOnlyEngine
from tests.support.usage_collector import (
    CollectorProcess,
    append_spool,
    run_with_a_lost_record,
    spool_line,
)

COLLECTOR = ContainerState(
    id="c0ffee", name="site-usage-ledger-1", service=USAGE_SERVICE, number=1, config_hash=None,
    state="running", health="healthy", restart_count=0, exit_code=0,
    started_at=datetime(2026, 12, 1, tzinfo=UTC), image="vllm/vllm-openai:v0.33.0",
    image_id="sha256:1", gpu_ids=(), host_ports=())


def test_status_shows_the_collectors_own_account(tmp_path: Path) -> None:
    health, _ = run_with_a_lost_record(tmp_path)  # seq 4 never arrives
    engine = ExecOnlyEngine(COLLECTOR.id)
    engine.exec_results[tuple(HEALTH_ARGV)] = [(0, json.dumps(health))]
    view = ledger_health(engine, (COLLECTOR,))
    report = view.to_json()
    assert report["records"] == 4 and report["lost"] == 1 and report["unreadable_lines"] == 0
    line = view.lines()[0]
    assert line.startswith("usage ledger: ") and "4 records" in line and "1 lost" in line
    assert "of 1.0 GB" in line  # the collector's --max-bytes
    assert view.lines()[1].startswith("  1 record LOST: the door numbered them but never wrote")


def test_a_full_ledger_disk_is_shown_as_records_waiting_not_lost(tmp_path: Path) -> None:
    """The ledger's disk full: kit status says since when, how much waits in the spool, that
    none is lost and what to do (the collector's own account of it: a full disk sets
    disk_full_since and keeps the lines in the spool)."""
    spool, ledger = tmp_path / "door.jsonl", tmp_path / "ledger"
    append_spool(spool, [spool_line(seq) for seq in (1, 2)])
    collector = CollectorProcess(spool, ledger).start()
    try:
        health = collector.wait_for(lambda h: h["records"] == 2, "the records")
    finally:
        collector.stop()
    health = {**health, "ok": False, "disk_full_since": "2026-12-01T10:00:00.000Z",
              "spool_pending_bytes": 3 << 20}
    engine = ExecOnlyEngine(COLLECTOR.id)
    engine.exec_results[tuple(HEALTH_ARGV)] = [(0, json.dumps(health))]
    lines = ledger_health(engine, (COLLECTOR,)).lines()
    assert lines[0].startswith("usage ledger: PROBLEM, 2 records") and "0 lost" in lines[0]
    assert lines[1] == (
        "  DISK FULL since 2026-12-01T10:00:00.000Z: the door keeps serving and its records "
        "wait in the spool (3.0 MB), none lost; free space on the disk of the engine's volumes "
        "(or lower usage.max_disk) and the collector catches up by itself")
    assert not any("LOST" in line for line in lines)


def test_a_collector_that_is_not_running_is_not_recording() -> None:
    stopped = ContainerState(**{**COLLECTOR.__dict__, "state": "exited"})
    view = ledger_health(ExecOnlyEngine(), (stopped,))
    assert view.health is None and view.to_json() == {
        "ok": False, "problem": f"no {USAGE_SERVICE} container runs"}
    assert view.lines()[0].startswith("usage ledger: NOT RECORDING")


def test_an_unreadable_answer_is_a_problem_not_a_guess() -> None:
    engine = ExecOnlyEngine(COLLECTOR.id)
    engine.exec_results[tuple(HEALTH_ARGV)] = [(0, "<html>"), (1, "Connection refused")]
    assert "unreadable" in (ledger_health(engine, (COLLECTOR,)).problem or "")
    assert "exit 1" in (ledger_health(engine, (COLLECTOR,)).problem or "")
