"""kit/dataplane/collector/usage_ledger.py: the collector run as the compose file runs it (a process
on a spool file and a ledger folder, asked over HTTP), killed, starved of disk and fed hostile
lines; and its parts in-process where a property is easier to state there."""

import argparse
import base64
import datetime
import json
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kit import names
from kit.credentials import material
from kit.dataplane.collector import usage_ledger
from kit.views.usage_health import LedgerHealth
from tests.support import nginx_ns
from tests.support.usage_collector import (
    CollectorProcess,
    append_spool,
    by_door_seq,
    chain_breaks,
    chained,
    ledger_record,
    ledger_records,
    nobody_flood,
    real_nginx_spool,
    spool_line,
    write_segment,
)


@pytest.fixture
def run(tmp_path: Path):
    """run(**options) → a started CollectorProcess on tmp_path/door.jsonl and tmp_path/ledger;
    every one still running at the end must exit 0 on SIGTERM."""
    started: list[CollectorProcess] = []

    def start(**options) -> CollectorProcess:
        collector = CollectorProcess(tmp_path / "door.jsonl", tmp_path / "ledger", **options)
        started.append(collector)
        return collector.start()

    yield start
    for collector in started:
        if collector.process is not None and collector.process.poll() is None:
            assert collector.stop() == 0


def test_principal_names_are_kits_user_names() -> None:
    """The collector runs alone in its container, so it carries its own copy of the pattern."""
    assert usage_ledger.PRINCIPAL_NAME == names.USER_NAME
    assert usage_ledger.GATE_CLAIM == material.GATE_CLAIM


def test_records_appear_in_order_with_a_valid_chain_and_are_served(run, tmp_path) -> None:
    spool = tmp_path / "door.jsonl"
    # two workers' buffers, each flushed whole: seqs interleaved as nginx writes them
    append_spool(spool, [spool_line(seq) for seq in (1, 3, 5, 7)])
    append_spool(spool, [spool_line(seq, who="user:bob", model="org/big-model", prompt="",
                                    completion="", ttft="", end="client_abort", status="499")
                         for seq in (2, 4, 6)])
    collector = run()
    health = collector.wait_for(lambda h: h["records"] == 7, "7 records")
    records = ledger_records(tmp_path / "ledger")
    assert [r["seq"] for r in records] == list(range(1, 8))
    assert chain_breaks(records) == []
    assert health["last_hash"] == records[-1]["hash"]
    assert sorted(r["door_seq"] for r in records) == list(range(1, 8))
    first = records[0]
    assert [*first] == [*usage_ledger.RECORD_FIELDS, "hash"]
    assert first | {"hash": ""} == {
        "seq": 1, "time": "2025-12-01T22:43:20.001Z", "request_id": f"{1:032x}",
        "who": "key:alice", "client": "10.0.0.7", "model": "tiny",
        "route": "/v1/chat/completions", "method": "POST", "status": 200, "prompt_tokens": 12,
        "completion_tokens": 30, "ttft_ms": 51, "duration_ms": 1234, "bytes_in": 321,
        "bytes_out": 4567, "ended": "completed", "door_boot": "boot-a", "door_seq": 1,
        "claimed": None, "hash": ""}
    aborted = next(r for r in records if r["who"] == "user:bob")
    assert (aborted["prompt_tokens"], aborted["completion_tokens"], aborted["ttft_ms"],
            aborted["status"]) == (None, None, None, 499)
    # the saved state is what /health says, the segment is named by the UTC day of appending
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert [p.name for p in (tmp_path / "ledger" / "segments").iterdir()] == [f"{today}.jsonl"]
    state_file = tmp_path / "ledger" / "state.json"
    collector.wait_for(lambda h: state_file.exists()
                       and json.loads(state_file.read_text())["last_seq"] == 7, "state saved")
    saved = json.loads(state_file.read_text())
    assert {key: saved[key] for key in ("last_hash", "lost", "series")} == {
        key: health[key] for key in ("last_hash", "lost", "series")}
    assert health["lost"] == {"total": 0, "door_seq_gaps": {}, "unreadable_lines": 0,
                              "torn_lines": 0}
    assert health["ok"] and health["problems"] == [] and health["spool_pending_bytes"] == 0
    assert health["lag_seconds"] == 0.0 and health["records_per_second"] > 0
    assert health["disk"]["ledger_bytes"] > 0 and health["disk"]["free_bytes"] > 0
    metrics = set(collector.get("/metrics").splitlines())
    assert {'kit_usage_requests_total{who="key:alice",model="tiny",ended="completed"} 4',
            'kit_usage_requests_total{who="user:bob",model="org/big-model",'
            'ended="client_abort"} 3',
            'kit_usage_prompt_tokens_total{who="key:alice",model="tiny"} 48',
            'kit_usage_completion_tokens_total{who="key:alice",model="tiny"} 120',
            'kit_usage_completion_tokens_total{who="user:bob",model="org/big-model"} 0',
            "kit_usage_records_total 7", "kit_usage_lost_records_total 0",
            "kit_usage_unreadable_lines_total 0", "kit_usage_lag_seconds 0.0",
            "# TYPE kit_usage_ledger_bytes gauge"} <= metrics
    with pytest.raises(OSError, match="404"):
        collector.get("/state.json")


def test_hostile_field_values_are_never_written_as_is(run, tmp_path) -> None:
    spool = tmp_path / "door.jsonl"
    replaced = [  # a failed Basic name, an engine's usage and a URI are client or model text
        spool_line(1, who='user:eve"} 1\nkit_usage_records_total 9'),
        spool_line(2, who="user:" + "a" * 40),
        spool_line(3, who="admin"),
        spool_line(4, model="gpt-4"),
        spool_line(5, model="tiny\n"),
        spool_line(6, route="/v1/../../etc/passwd"),
        spool_line(7, method='GE"T'),
        spool_line(8, prompt="NaN", completion="-1"),
        spool_line(9, prompt="1e3", ttft="soon"),
        spool_line(10, addr="<script>"),
        spool_line(21, addr="fe80::1%a b<script>"),
        # nginx's escape=json passes bytes >= 0x80 through: a URI and a Basic name not UTF-8
        json.dumps(spool_line(22, route="/v1/@@", who="user:@@")).encode().replace(
            b"@@", b"\xff\xfe") + b"\n",
    ]
    unreadable = [
        spool_line(11, status="2OO"),
        spool_line(12, duration="inf"),
        spool_line(13, end="completed\n"),
        spool_line(14, t="1764629000"),
        spool_line(15, id="../x"),
        {**spool_line(16), "bytes_out": 4567},  # not text
        {key: value for key, value in spool_line(17).items() if key != "end"},
        spool_line(18, v="2"),
        "not json at all\n",
        "[1, 2, 3]\n",
        json.dumps(spool_line(19)) + " " * (usage_ledger.MAX_LINE + 10) + "\n",
    ]
    append_spool(spool, [*replaced, *unreadable, spool_line(20)])
    collector = run(grace=0.3)
    # 1..3 and 22 name nobody once replaced: counted per address and minute (1..3 alike)
    health = collector.wait_for(lambda h: h["records"] == 11, "11 records")
    records = by_door_seq(ledger_records(tmp_path / "ledger"))
    assert sorted(records) == [*range(1, 11), 20, 21, 22]
    assert (records[22]["route"], records[22]["who"], records[22]["requests"]) == (
        "other", "-", 1)
    assert records[1] is records[3] and (records[1]["who"], records[1]["requests"]) == ("-", 3)
    assert [records[seq]["model"] for seq in (4, 5)] == [None, None]
    assert records[6]["route"] == "other" and records[7]["method"] == "OTHER"
    assert (records[8]["prompt_tokens"], records[8]["completion_tokens"]) == (None, None)
    assert (records[9]["prompt_tokens"], records[9]["ttft_ms"]) == (None, None)
    assert records[10]["client"] is None and records[21]["client"] is None
    text = "".join(p.read_text() for p in (tmp_path / "ledger" / "segments").iterdir())
    for hostile in ("eve", "aaaa", "admin", "gpt-4", "../", "GE", "NaN", "soon", "script"):
        assert hostile not in text
    # lines 11..19 carry a readable (boot, seq): unreadable, and not lost as well
    assert health["lost"]["unreadable_lines"] == 11
    assert health["replaced_values"] == {"who": 4, "model": 2, "route": 2, "method": 1,
                                         "tokens": 3, "ttft": 1, "client": 2}
    time.sleep(0.5)
    health = collector.health()
    assert health["lost"]["total"] == 0, health
    metrics = collector.get("/metrics")
    assert "kit_usage_records_total 11\n" in metrics and "user:eve" not in metrics


def test_label_values_are_escaped() -> None:
    assert usage_ledger._label('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


def test_out_of_order_within_the_grace_is_not_lost_and_a_real_gap_is_counted(
        run, tmp_path) -> None:
    spool = tmp_path / "door.jsonl"
    collector = run(grace=2.0)
    append_spool(spool, [spool_line(seq) for seq in (1, 3)])
    collector.wait_for(lambda h: h["records"] == 2, "2 records")
    time.sleep(0.3)  # within the grace: the other worker's buffer (2) comes late
    append_spool(spool, [spool_line(2), spool_line(4), spool_line(6)])
    collector.wait_for(lambda h: h["records"] == 5, "5 records")
    health = collector.wait_for(lambda h: h["lost"]["total"] == 1, "seq 5 lost", timeout=10)
    assert health["lost"]["door_seq_gaps"] == {"boot-a": 1}
    assert health["door_seq"]["boot-a"]["through"] == 6
    assert "kit_usage_lost_records_total 1\n" in collector.get("/metrics")
    # a new boot (nginx restarted) counts from 1 on its own
    append_spool(spool, [spool_line(seq, boot="boot-b") for seq in (1, 2, 4)])
    health = collector.wait_for(lambda h: h["lost"]["total"] == 2, "boot-b's 3 lost")
    assert health["lost"]["door_seq_gaps"] == {"boot-a": 1, "boot-b": 1}
    # the line that was declared lost turns up after all: written, taken off the count
    append_spool(spool, [spool_line(5)])
    health = collector.wait_for(lambda h: h["records"] == 9, "the late line")
    assert health["lost"]["door_seq_gaps"] == {"boot-b": 1}
    assert (health["lost"]["total"], health["late_lines"]) == (1, 1)
    records = ledger_records(tmp_path / "ledger")
    assert chain_breaks(records) == [] and len({r["request_id"] + r["door_boot"]
                                                for r in records}) == 9


def test_the_ledgers_size_counts_records_as_soon_as_they_are_served(run, tmp_path) -> None:
    """Health served between two prunes (an hour apart here) already counts the records
    appended since: the size is kept at each append, not only recounted by the prune."""
    append_spool(tmp_path / "door.jsonl", [spool_line(seq) for seq in (1, 2, 3)])
    collector = run(state_interval=3600)
    collector.wait_for(lambda h: h["records"] == 3, "3 records")
    append_spool(tmp_path / "door.jsonl", [spool_line(seq) for seq in (4, 5)])
    health = collector.wait_for(lambda h: h["records"] == 5, "5 records")
    segment, = (tmp_path / "ledger" / "segments").iterdir()
    assert health["disk"]["ledger_bytes"] >= segment.stat().st_size > 0


def test_kill_9_at_any_moment_neither_loses_nor_duplicates(run, tmp_path) -> None:
    """nginx keeps appending while the collector is killed five times at random moments (the
    state is saved only every 0.5 s, so most kills fall between a segment's fsync and the
    state's rename); after the last restart every door seq is in the ledger exactly once."""
    spool = tmp_path / "door.jsonl"
    rng = random.Random(24)
    next_seq = 1
    collector = run(state_interval=0.5)
    for _ in range(5):
        for _ in range(rng.randint(3, 8)):
            append_spool(spool, [spool_line(seq) for seq in range(next_seq, next_seq + 800)])
            next_seq += 800
        time.sleep(rng.uniform(0.05, 0.6))
        collector.kill()
        collector.start()
    total = next_seq - 1
    health = collector.wait_for(lambda h: h["records"] == total, f"{total} records", 60)
    records = ledger_records(tmp_path / "ledger")
    assert [r["door_seq"] for r in records] == list(range(1, total + 1))
    assert chain_breaks(records) == []
    assert health["lost"]["total"] == 0 and health["lost"]["unreadable_lines"] == 0
    print(f"{total} records, {health['duplicates_skipped']} spool lines skipped as already "
          f"written, {health['lost']['torn_lines']} torn lines cut, after 5 kills")


def test_a_torn_last_line_is_cut_counted_and_written_again(run, tmp_path) -> None:
    spool, ledger = tmp_path / "door.jsonl", tmp_path / "ledger"
    append_spool(spool, [spool_line(seq) for seq in (1, 2, 3)])
    collector = run()
    collector.wait_for(lambda h: h["records"] == 3, "3 records")
    assert collector.stop() == 0
    # the kill came in the middle of writing record 4 (its state never saved)
    append_spool(spool, [spool_line(4)])
    segment = next((ledger / "segments").iterdir())
    with segment.open("a") as file:
        file.write('{"seq":4,"time":"2025-12-01T22:43')
    collector.start()
    health = collector.wait_for(lambda h: h["records"] == 4, "4 records")
    assert health["lost"]["torn_lines"] == 1
    records = ledger_records(ledger)
    assert [r["door_seq"] for r in records] == [1, 2, 3, 4] and chain_breaks(records) == []


def test_retention_and_max_bytes_remove_the_oldest_segments_logged_first(run, tmp_path) -> None:
    """A ledger laid down before this collector (no state.json: rebuilt from the segments):
    retention 2 days removes the 2020 and 3-days-old segments, --max-bytes 1 then yesterday's;
    today's, being appended, stays, and the health says it alone is over the bound."""
    ledger = tmp_path / "ledger"
    today = datetime.datetime.now(datetime.UTC).date()
    days = ["2020-01-01", *((today - datetime.timedelta(days=n)).isoformat() for n in (3, 1))]
    records = chained([ledger_record(seq, seq) for seq in range(1, 7)])
    for index, day in enumerate(days):
        write_segment(ledger, day, records[2 * index:2 * index + 2])
    append_spool(tmp_path / "door.jsonl", [spool_line(1), spool_line(2)])
    collector = run(retention_days=2, max_bytes=1)
    health = collector.wait_for(lambda h: h["disk"]["segments_pruned"] == 3, "3 pruned")
    assert health["records"] == 8 and not health["ok"]
    assert health["disk"]["over_max_bytes"]
    assert "today's segment alone is over the credentials' part of --max-bytes (all but " \
        "nobody's 10 %)" in health["problems"]
    assert [p.name for p in (ledger / "segments").iterdir()] == [f"{today.isoformat()}.jsonl"]
    pruned = [json.loads(line) for line in (ledger / "pruned.jsonl").read_text().splitlines()]
    assert [{key: entry[key] for key in ("segment", "first_seq", "last_seq", "last_hash",
                                         "reason")} for entry in pruned] == [
        {"segment": f"{day}.jsonl", "first_seq": 2 * i + 1, "last_seq": 2 * i + 2,
         "last_hash": records[2 * i + 1]["hash"], "reason": reason}
        for i, (day, reason) in enumerate(zip(days, ("retention", "retention", "max_bytes"),
                                              strict=True))]
    assert all(entry["at"].endswith("Z") for entry in pruned)
    # the chain goes on from the last record laid down
    kept = ledger_records(ledger)
    assert [r["seq"] for r in kept] == [7, 8]
    assert chain_breaks(kept, previous=records[-1]["hash"]) == []


def test_hole_punching_gives_the_spools_disk_back(run, tmp_path) -> None:
    spool = tmp_path / "door.jsonl"
    append_spool(spool, [spool_line(seq) for seq in range(1, 6001)])  # ~2 MB
    before = os.stat(spool)
    collector = run()
    collector.wait_for(lambda h: h["records"] == 6000 and h["hole_punching"]["supported"],
                       "6000 records and a hole")
    deadline = time.monotonic() + 10
    while os.stat(spool).st_blocks * 512 > 64 << 10:
        assert time.monotonic() < deadline, os.stat(spool)
        time.sleep(0.05)
    after = os.stat(spool)
    assert after.st_size == before.st_size  # nginx's O_APPEND offset is untouched
    print(f"spool {before.st_size} bytes: {before.st_blocks * 512} on disk before, "
          f"{after.st_blocks * 512} after")
    # a restart reads on from the checkpoint, not the zeros behind it
    assert collector.stop() == 0
    append_spool(spool, [spool_line(6001)])
    collector.start()
    health = collector.wait_for(lambda h: h["records"] == 6001, "6001 records")
    assert health["lost"]["unreadable_lines"] == 0 and health["duplicates_skipped"] == 0


def test_a_filesystem_that_refuses_holes_is_reported(monkeypatch, tmp_path) -> None:
    puncher = usage_ledger.HolePuncher()
    spool = tmp_path / "door.jsonl"
    spool.write_bytes(b"x" * 10000)

    def refuse(*_args) -> int:
        return -1

    monkeypatch.setattr(puncher, "fallocate", refuse)
    monkeypatch.setattr(usage_ledger.ctypes, "get_errno", lambda: usage_ledger.errno.EOPNOTSUPP)
    puncher.punch(str(spool), os.stat(spool).st_ino, 10000)
    assert (puncher.supported, puncher.error) == (
        False, f"fallocate(PUNCH_HOLE): {os.strerror(usage_ledger.errno.EOPNOTSUPP)}")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                    or shutil.which("nsenter") is None, reason="needs root, unshare, nsenter")
def test_a_full_disk_is_survived_reported_and_caught_up(run, tmp_path) -> None:
    """The ledger on a 256 KiB tmpfs in the collector's own mount namespace, filled up: the
    collector keeps running and answering, says since when the disk is full, keeps every line
    in the spool, and writes them all once a file is removed."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    filler = ledger / "filler"
    wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o size=256k kit-ledger-test "{ledger}" && '
            f'(dd if=/dev/zero of="{filler}" bs=4k 2>/dev/null; true) && exec "$0" "$@"']
    append_spool(tmp_path / "door.jsonl", [spool_line(seq) for seq in range(1, 201)])
    collector = run(wrap=wrap)
    health = collector.wait_for(lambda h: h["disk_full_since"] is not None, "a full disk")
    assert health["records"] == 0 and not health["ok"] and health["spool_pending_bytes"] > 0
    assert health["lag_seconds"] > 0  # behind: the lines wait in the spool
    assert any("disk is full" in problem for problem in health["problems"])
    assert "kit_usage_disk_full 1\n" in collector.get("/metrics")
    time.sleep(1.0)  # retried meanwhile, still alive
    assert collector.process is not None and collector.process.poll() is None
    assert collector.health()["records"] == 0
    pid = collector.process.pid
    subprocess.run(["nsenter", "-t", str(pid), "-m", "rm", str(filler)], check=True)
    health = collector.wait_for(lambda h: h["records"] == 200 and h["disk_full_since"] is None,
                                "200 records once there is room")
    assert health["ok"] and any("the disk was full from" in p for p in health["problems"])
    segments = subprocess.run(["nsenter", "-t", str(pid), "-m", "sh", "-c",
                               f'cat "{ledger}"/segments/*.jsonl'], check=True,
                              capture_output=True, text=True).stdout
    records = [json.loads(line) for line in segments.splitlines()]
    assert [r["door_seq"] for r in records] == list(range(1, 201))
    assert chain_breaks(records) == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                    or shutil.which("nsenter") is None, reason="needs root, unshare, nsenter")
def test_a_full_spool_disk_is_reported_while_it_lasts(tmp_path) -> None:
    """The spool's folder on a 256 KiB tmpfs, filled up: nginx could not write its lines
    there, so the collector says so (not ok, the spool's free bytes, a problem naming it)
    while it lasts, and nothing once there is room again."""
    folder = tmp_path / "spool"
    folder.mkdir()
    append_spool(tmp_path / "lines", [spool_line(seq) for seq in range(1, 4)])
    filler = folder / "filler"
    wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o size=256k kit-spool-test "{folder}" && '
            f'cp "{tmp_path}/lines" "{folder}/door.jsonl" && '
            f'(dd if=/dev/zero of="{filler}" bs=4k 2>/dev/null; true) && exec "$0" "$@"']
    collector = CollectorProcess(folder / "door.jsonl", tmp_path / "ledger", wrap=wrap).start()
    try:
        health = collector.wait_for(lambda h: h["records"] == 3, "the lines written")
        assert not health["ok"] and health["spool"]["free_bytes"] < 64 << 10
        assert any("the spool's disk is full" in p for p in health["problems"]), health
        assert collector.process is not None
        subprocess.run(["nsenter", "-t", str(collector.process.pid), "-m", "rm", str(filler)],
                       check=True)
        health = collector.wait_for(lambda h: h["ok"], "ok once there is room")
        assert health["spool"]["free_bytes"] > 64 << 10
        assert not any("spool's disk" in p for p in health["problems"])
    finally:
        assert collector.stop() == 0


def test_door_sequence_in_process() -> None:
    door = usage_ledger.DoorSequence()
    for seq in (1, 4, 2, 6, 7):
        assert door.status(seq) == "new"
        door.admit(seq, now=0.0)
    assert door.status(2) == door.status(6) == "duplicate"
    assert door.through == 2 and [run[:2] for run in door.seen] == [[4, 4], [6, 7]]
    assert door.declare(now=0.5, grace=1.0) == 0
    assert door.declare(now=1.0, grace=1.0) == 2  # 3 and 5
    assert door.through == 7 and door.lost == 2 and door.status(5) == "late"
    door.admit(5, now=2.0)
    assert door.lost == 1 and door.lost_ranges == [[3, 3]] and door.status(5) == "duplicate"
    again = usage_ledger.DoorSequence.from_json(json.loads(json.dumps(door.to_json())), 0.0)
    assert again.to_json() == door.to_json()


def test_bad_arguments_exit_2_naming_them(tmp_path) -> None:
    script = str(usage_ledger.__file__)
    common = ["--spool", "s", "--ledger", str(tmp_path), "--retention-days", "1",
              "--max-bytes", "1", "--port", "1"]
    models, routes = ["--models", '["tiny"]'], ["--routes", '["/v1/models"]']
    for extra, says in (([*routes, "--models", '{"a": 1}'], "--models"),
                        ([*models, "--routes", "not json"], "--routes"),
                        ([*models], "--routes"),
                        ([*models, *routes, "--grace", "-1"], "--grace"),
                        ([*models, *routes, "--max-bytes", "0"], "--max-bytes")):
        done = subprocess.run(["python3", script, *common, *extra], capture_output=True,
                              text=True)
        assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_line_with_no_end_is_skipped_and_counted_once(run, tmp_path) -> None:
    """Not what nginx writes (its lines are far shorter): skipped in pieces, memory bounded."""
    spool = tmp_path / "door.jsonl"
    collector = run(grace=0.2)
    append_spool(spool, [spool_line(1), b"x" * (3 * usage_ledger.MAX_LINE)])
    collector.wait_for(lambda h: h["lost"]["unreadable_lines"] == 1, "the long line counted")
    append_spool(spool, [b"x" * 100 + b"\n", spool_line(2)])
    health = collector.wait_for(lambda h: h["records"] == 2, "2 records")
    assert health["lost"]["unreadable_lines"] == 1 and health["lost"]["total"] == 0


def test_an_unreadable_state_is_rebuilt_from_the_segments_without_duplicates(
        run, tmp_path) -> None:
    spool, ledger = tmp_path / "door.jsonl", tmp_path / "ledger"
    append_spool(spool, [spool_line(seq) for seq in (1, 2, 3)])
    collector = run()
    collector.wait_for(lambda h: h["records"] == 3, "3 records")
    assert collector.stop() == 0
    (ledger / "state.json").write_text("{not json")
    append_spool(spool, [spool_line(4)])
    collector.start()
    health = collector.wait_for(lambda h: h["records"] == 4, "4 records")
    assert health["duplicates_skipped"] == 3
    assert any(problem.startswith("state.json unreadable") for problem in health["problems"])
    records = ledger_records(ledger)
    assert [r["door_seq"] for r in records] == [1, 2, 3, 4] and chain_breaks(records) == []


def test_with_every_segment_pruned_and_no_state_the_chain_goes_on_from_pruned_jsonl(
        run, tmp_path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    last = chained([ledger_record(seq, seq) for seq in range(1, 7)])[-1]
    (ledger / "pruned.jsonl").write_text(json.dumps({
        "segment": "2020-01-01.jsonl", "first_seq": 1, "last_seq": 6, "last_hash": last["hash"],
        "reason": "retention", "at": "2020-02-01T00:00:00.000Z"}) + "\n")
    append_spool(tmp_path / "door.jsonl", [spool_line(1)])
    collector = run()
    collector.wait_for(lambda h: h["records"] == 7, "record 7")
    records = ledger_records(ledger)
    assert [r["seq"] for r in records] == [7]
    assert chain_breaks(records, previous=last["hash"]) == []


def test_memory_stays_bounded_as_the_spool_grows(run, tmp_path) -> None:
    """Four times the spool, the same peak: read in chunks, counters by label set only."""
    spool = tmp_path / "door.jsonl"

    def peak_kib(collector: CollectorProcess) -> int:
        assert collector.process is not None
        status = Path(f"/proc/{collector.process.pid}/status").read_text()
        return int(next(line for line in status.splitlines()
                        if line.startswith("VmHWM:")).split()[1])

    append_spool(spool, [spool_line(seq) for seq in range(1, 10001)])
    collector = run()
    collector.wait_for(lambda h: h["records"] == 10000, "10000 records", 60)
    first = peak_kib(collector)
    append_spool(spool, [spool_line(seq) for seq in range(10001, 50001)])
    collector.wait_for(lambda h: h["records"] == 50000, "50000 records", 120)
    second = peak_kib(collector)
    grown = (os.stat(spool).st_size >> 10)
    print(f"peak RSS {first} KiB after 10000 records, {second} KiB after 50000 "
          f"(spool {grown} KiB)")
    assert second - first < 8 << 10 < grown


@pytest.mark.skipif(nginx_ns.available() is not None or os.geteuid() != 0,
                    reason=str(nginx_ns.available()))
def test_a_real_nginx_spool_with_hostile_requests_is_read(tmp_path) -> None:
    """What a real nginx writes with escape=json (quotes and newlines escaped, bytes >= 0x80
    passed through): every line read, the hostile values replaced, nothing unreadable but the
    line whose seq is not a number."""
    hostile_user = base64.b64encode(b'e"v\nil:pw').decode()
    raw_user = base64.b64encode(b"\xff\xfe:pw").decode()
    spool = real_nginx_spool(tmp_path, [
        "-u alice:pw 'http://127.0.0.1:8080/v1/chat/completions?seq=1&model=tiny&prompt=5'",
        "'http://127.0.0.1:8080/v1/%FF%FE?seq=2'",
        "--path-as-is 'http://127.0.0.1:8080/v1/chat/../../v1/../etc/passwd?seq=3'",
        f"-H 'Authorization: Basic {hostile_user}' 'http://127.0.0.1:8080/v1/models?seq=4'",
        f"-H 'Authorization: Basic {raw_user}' 'http://127.0.0.1:8080/v1/models?seq=5'",
        "'http://127.0.0.1:8080/v1/models?seq=6&model=tiny%22,%22who%22:%22key:root'",
        "-X 'BREW' 'http://127.0.0.1:8080/v1/models?seq=7&prompt=1e3'",
        "'http://127.0.0.1:8080/v1/models?seq=x8'",
    ])
    assert b"\xff\xfe" in spool.read_bytes()  # nginx passed the bytes through
    collector = CollectorProcess(spool, tmp_path / "ledger", grace=0.2).start()
    try:
        # every seq in the ledger: 2-3 and 4-6 alike, nobody's, aggregated per address and
        # window (one record each, or two where the grace of 0.2 s ran out between two curls);
        # and the unreadable line counted in a /health asked after that (health is asked
        # before the ledger is read: one asked first can predate the last line's reading)
        health = collector.wait_for(lambda h: h["lost"]["unreadable_lines"] >= 1 and set(
            by_door_seq(ledger_records(tmp_path / "ledger"))) == set(range(1, 8)),
            "seqs 1-7 in the ledger and the unreadable line counted")
    finally:
        assert collector.stop() == 0
    records = by_door_seq(ledger_records(tmp_path / "ledger"))
    assert all("door_seqs" in records[seq] for seq in range(2, 8))  # nobody's: aggregated
    assert {seq: (r["who"], r["model"], r["route"], r["method"], r["prompt_tokens"])
            for seq, r in records.items()} == {
        1: ("user:alice", "tiny", "/v1/chat/completions", "GET", 5),
        2: ("-", None, "other", "GET", None),
        3: ("-", None, "other", "GET", None),
        4: ("-", None, "/v1/models", "GET", None),
        5: ("-", None, "/v1/models", "GET", None),
        6: ("-", None, "/v1/models", "GET", None),
        7: ("-", None, "/v1/models", "OTHER", None),
    }
    assert all(r["status"] == 200 and r["client"] == "127.0.0.1"
               for r in records.values())
    assert chain_breaks(ledger_records(tmp_path / "ledger")) == []
    assert health["lost"]["unreadable_lines"] == 1


def test_the_budget_seed_holds_each_credentials_current_day_and_month(run, tmp_path) -> None:
    """--budget-seed: each credential's prompt + completion tokens of the current UTC day and
    month (a record counts in the day it ended; an older day's only in its month; a past
    month's not at all; nobody's and refused-without-tokens not at all), written atomically,
    readable by nginx's workers, and the same after a kill -9 and a restart (kept in
    state.json, with the records after its checkpoint taken back once)."""
    now = datetime.datetime.now(datetime.UTC)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    earlier = month_start if now - month_start > datetime.timedelta(days=1) else None
    past_month = month_start - datetime.timedelta(days=3)
    lines = [spool_line(1, who="key:alice", t=f"{now.timestamp():.3f}"),  # 12 + 30
             spool_line(2, who="key:alice", t=f"{now.timestamp():.3f}", prompt="5",
                        completion=""),
             spool_line(3, who="user:bob", t=f"{past_month.timestamp():.3f}"),
             spool_line(4, who="-", t=f"{now.timestamp():.3f}", status="401",
                        end="refused_auth"),
             spool_line(5, who="user:carol", t=f"{now.timestamp():.3f}", prompt="",
                        completion="", status="429", end="refused_limit")]
    if earlier is not None:
        lines.append(spool_line(6, who="key:alice", t=f"{earlier.timestamp():.3f}"))
    append_spool(tmp_path / "door.jsonl", lines)
    seed = tmp_path / "budget-seed.json"
    collector = run(extra=["--budget-seed", str(seed)])
    collector.wait_for(lambda h: h["records"] == len(lines), "every record")
    expected = {"key:alice": [47, 47 + (42 if earlier is not None else 0)]}
    deadline = time.monotonic() + 10
    while not seed.exists() or json.loads(seed.read_text())["credentials"] != expected:
        assert time.monotonic() < deadline, seed.read_text()
        time.sleep(0.05)
    written = json.loads(seed.read_text())
    assert (written["day"], written["month"]) == (now.strftime("%Y-%m-%d"), now.strftime("%Y-%m"))
    assert seed.stat().st_mode & 0o777 == 0o644
    assert not (tmp_path / "budget-seed.json.tmp").exists()
    collector.kill()
    seed.unlink()
    append_spool(tmp_path / "door.jsonl", [spool_line(len(lines) + 1, who="user:bob",
                                                      t=f"{now.timestamp():.3f}")])
    collector.start()
    expected["user:bob"] = [42, 42]
    deadline = time.monotonic() + 10
    while not seed.exists() or json.loads(seed.read_text())["credentials"] != expected:
        assert time.monotonic() < deadline, seed.read_text() if seed.exists() else "no seed"
        time.sleep(0.05)
    assert collector.health()["budget_seed"] == {"path": str(seed), "error": None}


def test_requests_nobody_authenticated_are_one_record_per_address_and_window(
        run, tmp_path) -> None:
    """Issue 42 item 6: one unauthenticated HTTP/2 connection made 7,427 records in 7.6 s. Now
    a flood of refusals is one record per address (and who, route, status, end) and window,
    holding how many they were and the door seqs it stands for; the requests of credentials
    in between are recorded alone, and every request is counted once."""
    spool = tmp_path / "door.jsonl"
    flood = [spool_line(seq, who="-", addr="203.0.113.9", model="", prompt="", completion="",
                        ttft="", status="401", end="refused_auth") for seq in range(1, 7001)]
    for seq in range(100, 7001, 700):  # a credential's requests amid the flood
        flood[seq - 1] = spool_line(seq)
    append_spool(spool, flood)
    collector = run()
    health = collector.wait_for(lambda h: h["door_seq"].get("boot-a", {}).get("through") == 7000
                                and not h["aggregating"], "the flood read")
    records = ledger_records(tmp_path / "ledger")
    assert len(records) == 10 + 1 and chain_breaks(records) == []
    aggregate = records[-1]
    assert (aggregate["who"], aggregate["client"], aggregate["status"], aggregate["ended"],
            aggregate["requests"], aggregate["request_id"]) == (
        "-", "203.0.113.9", 401, "refused_auth", 6990, None)
    assert aggregate["door_seqs"][0] == [1, 99] and len(aggregate["door_seqs"]) == 11
    assert sorted(by_door_seq(records)) == list(range(1, 7001))
    assert ["-", "", "refused_auth", 6990, 0, 0] in health["series"]
    assert health["lost"]["total"] == 0
    assert 'kit_usage_requests_total{who="-",model="",ended="refused_auth"} 6990' in \
        collector.get("/metrics")


def test_a_flood_from_many_addresses_is_bounded_per_window(run, tmp_path) -> None:
    """An attacker with many addresses: past MAX_AGGREGATES keys in one window, the window's
    others share one record per who and end."""
    spool = tmp_path / "door.jsonl"
    count = usage_ledger.MAX_AGGREGATES + 300
    append_spool(spool, [spool_line(seq, who="-", addr=f"2001:db8::{seq:x}", model="",
                                    status="404", end="refused_request", prompt="",
                                    completion="", ttft="") for seq in range(1, count + 1)])
    collector = run()
    collector.wait_for(lambda h: h["door_seq"].get("boot-a", {}).get("through") == count
                       and not h["aggregating"], "the flood read")
    records = ledger_records(tmp_path / "ledger")
    assert len(records) == usage_ledger.MAX_AGGREGATES + 1
    assert (records[-1]["client"], records[-1]["requests"]) == (None, 300)
    assert sum(record["requests"] for record in records) == count


def refused_at(at: float, seqs: range) -> list[dict]:
    """Spool lines of refused requests nobody authenticated, all at `at` by the door's clock."""
    return [spool_line(seq, who="-", t=f"{at:.3f}", status="401", end="refused_auth", model="",
                       prompt="", completion="", ttft="") for seq in seqs]


def killed_with_40_open(run, tmp_path: Path, at: float, window: str) -> CollectorProcess:
    """A collector (--aggregate-seconds `window`) killed -9 once it saved an open aggregate of
    40 refusals made at `at`."""
    append_spool(tmp_path / "door.jsonl", refused_at(at, range(1, 41)))
    collector = run(extra=("--aggregate-seconds", window))
    state = tmp_path / "ledger" / "state.json"
    collector.wait_for(lambda h: state.exists() and [a["requests"] for a in json.loads(
        state.read_text())["aggregating"]] == [40], "40 saved")
    collector.kill()
    return collector


def test_an_open_aggregate_survives_a_kill(run, tmp_path) -> None:
    """What a window holds so far is in state.json with the checkpoint: a kill -9 loses none
    of it and counts none twice."""
    now = time.time()
    collector = killed_with_40_open(run, tmp_path, now, "3600")
    append_spool(tmp_path / "door.jsonl", refused_at(now, range(41, 61)))
    collector.start()
    health = collector.wait_for(
        lambda h: h["door_seq"].get("boot-a", {}).get("through") == 60, "60 read")
    assert [(a["requests"], a["door_seqs"]) for a in health["aggregating"]] == [(60, [[1, 60]])]
    assert health["records"] == 0 and health["duplicates_skipped"] == 0


def test_an_open_aggregate_closes_after_the_window_is_made_longer(run, tmp_path) -> None:
    """usage.aggregate_seconds changed (10 s to an hour, the collector recreated with an
    aggregate open): it is written once the new window's length has passed since its window
    began, by the door's time. Its key held the window's number, which read in hours put its
    end thousands of years on: it was never written."""
    ahead = time.time() + 100  # the door's clock: its window not over when the first run stops
    killed_with_40_open(run, tmp_path, ahead, "10")
    # an hour on, by the door's clock
    append_spool(tmp_path / "door.jsonl", [spool_line(41, t=f"{ahead + 3700:.3f}")])
    longer = run(extra=("--aggregate-seconds", "3600"))
    health = longer.wait_for(lambda h: h["records"] == 2, "the aggregate and the request")
    assert health["aggregating"] == []
    assert [record.get("requests") for record in ledger_records(tmp_path / "ledger")] == [
        None, 40]


def test_a_prune_for_space_of_credentials_records_is_loud(run, tmp_path) -> None:
    """Issue 42 item 6: the disk bound removing requests of credentials is a problem in
    /health (not ok), a counter in /metrics, and its pruned.jsonl line says how many."""
    ledger = tmp_path / "ledger"
    yesterday = (datetime.datetime.now(datetime.UTC).date()
                 - datetime.timedelta(days=1)).isoformat()
    write_segment(ledger, yesterday, chained([ledger_record(seq, seq) for seq in range(1, 4)]))
    append_spool(tmp_path / "door.jsonl", [spool_line(1)])
    collector = run(max_bytes=1)
    health = collector.wait_for(lambda h: h["disk"]["segments_pruned"] == 1, "1 pruned")
    assert not health["ok"] and health["disk"]["credential_requests_pruned"] == 3
    assert any(problem.startswith("3 requests of credentials were pruned to keep the ledger "
                                  f"under --max-bytes (usage.max_disk), the last 3 with "
                                  f"{yesterday}.jsonl (seqs 1..3)")
               for problem in health["problems"])
    assert "kit_usage_credential_requests_pruned_total 3\n" in collector.get("/metrics")
    entry = json.loads((ledger / "pruned.jsonl").read_text())
    assert (entry["reason"], entry["credential_requests"]) == ("max_bytes", 3)
    # kit status, on this very document: PROBLEM, and the prune said
    shown = LedgerHealth(health).lines()
    assert shown[0].startswith("usage ledger: PROBLEM, ")
    assert any("3 requests of credentials were pruned" in line for line in shown), shown


def test_a_flood_of_nobody_never_pushes_out_a_record_of_a_credential(run, tmp_path) -> None:
    """Issue 42 item 6, strictly: 10,000 addresses refused over 40 windows (~9,980 aggregate
    records, ~4.5 MB) against a 200 kB ledger whose older days hold credentials' records.
    Nobody's records take at most a day's part of their 10 % share; the rest are counted (in
    /health, its problems and /metrics), not written; no record of a credential is pruned, and
    every one is written, in one whole chain."""
    ledger, spool = tmp_path / "ledger", tmp_path / "door.jsonl"
    today = datetime.datetime.now(datetime.UTC).date()
    laid = chained([ledger_record(seq, seq) for seq in range(1, 7)])
    for index, days_ago in enumerate((2, 1)):
        write_segment(ledger, (today - datetime.timedelta(days=days_ago)).isoformat(),
                      laid[3 * index:3 * index + 3])
    flood = nobody_flood(10_000, per_window=250)
    for seq in range(500, 10_001, 500):  # a credential's requests amid the flood
        flood[seq - 1] = spool_line(seq)
    append_spool(spool, flood)
    collector = run(max_bytes=200_000, retention_days=3)
    state_file = ledger / "state.json"

    def saved() -> dict:  # saved after the prune of the same step: the prune saw it all
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        read = state.get("door_seq", {}).get("boot-a", {}).get("through") == 10_000
        return state if read and not state["aggregating"] else {}

    collector.wait_for(lambda _: bool(saved()), "the flood read and saved", timeout=120)
    state = saved()
    assert (state["disk"]["segments_pruned"], state["disk"]["credential_requests_pruned"]) \
        == (0, 0) and not (ledger / "pruned.jsonl").exists()
    records = ledger_records(ledger)
    assert chain_breaks(records) == [] and records[0]["seq"] == 1
    credentials = [record for record in records if record["who"] != "-"]
    assert len(credentials) == 6 + 20
    nobody = [record for record in records if record["who"] == "-"]
    share, day_share = usage_ledger.nobody_share(collector_options(200_000, 3))
    assert (share, day_share) == (20_000, 5_000)
    written = sum(usage_ledger.line_bytes(record) for record in nobody)
    assert 0 < written <= day_share
    health = collector.health()
    assert health["ok"] and health["lost"]["total"] == 0
    assert {key: health["disk"]["nobody"][key] for key in ("max_bytes", "day_max_bytes",
                                                          "bytes")} == {
        "max_bytes": share, "day_max_bytes": day_share, "bytes": written}
    dropped = health["disk"]["nobody"]["records_dropped"]
    assert dropped == 9_980 - len(nobody) > 9_900
    assert health["disk"]["nobody"]["requests_dropped"] == 9_980 - sum(
        record["requests"] for record in nobody)
    assert any(problem.startswith(f"{dropped} records of requests nobody authenticated "
                                  f"({dropped} requests) were counted and not written")
               for problem in health["problems"]), health["problems"]
    assert f"kit_usage_nobody_requests_dropped_total {dropped}\n" in collector.get("/metrics")
    print(f"{len(nobody)} records of nobody's written ({written} bytes of a day's {day_share}), "
          f"{dropped} counted and not written, 0 of {len(credentials)} credentials' pruned")
    # a restart from the saved state counts nothing twice and keeps nobody's bytes
    assert collector.stop() == 0
    collector.start()
    again = collector.wait_for(lambda h: h["records"] == health["records"], "restarted")
    assert again["disk"]["nobody"] == health["disk"]["nobody"]


def test_nobodys_records_counted_and_not_written_survive_kill_9(run, tmp_path) -> None:
    """A flood of nobody's requests past the day's share, the collector killed at random
    moments: every request is written once or counted dropped once, none both, none twice."""
    spool, ledger = tmp_path / "door.jsonl", tmp_path / "ledger"
    flood, rng = nobody_flood(6_000, per_window=200), random.Random(42)
    collector = run(max_bytes=400_000, retention_days=3, state_interval=0.5)
    for start in range(0, 6_000, 1_000):
        append_spool(spool, flood[start:start + 1_000])
        time.sleep(rng.uniform(0.05, 0.6))
        collector.kill()
        collector.start()
    health = collector.wait_for(lambda h: h["door_seq"].get("boot-a", {}).get("through")
                                == 6_000 and not h["aggregating"], "the flood read", 60)
    records = ledger_records(ledger)
    written = [seq for record in records for first, last in record["door_seqs"]
               for seq in range(first, last + 1)]
    assert len(written) == len(set(written)) and chain_breaks(records) == []
    assert len(written) + health["disk"]["nobody"]["requests_dropped"] == 6_000
    assert health["disk"]["nobody"]["records_dropped"] == 6_000 - len(records)
    assert sum(usage_ledger.line_bytes(record) for record in records) \
        == health["disk"]["nobody"]["bytes"] <= 400_000 // 10 // 4
    assert health["lost"]["total"] == 0


def collector_options(max_bytes: int, retention_days: int) -> argparse.Namespace:
    return usage_ledger.parse_options(["--spool", "s", "--ledger", "l", "--port", "1",
                                       "--models", "[]", "--routes", "[]", "--max-bytes",
                                       str(max_bytes), "--retention-days",
                                       str(retention_days)])


def test_fields_of_the_door_are_recorded_as_what_they_are() -> None:
    """Issue 42 items 7 and 8: a request nginx ended without an answer (status 000) is a
    record, not an unreadable line; a service's 4xx is `rejected`; `/v1/models/{id}` and
    `/metrics/{service}` are their routes (never the client's text); the name a request
    nobody authenticated claimed is `claimed`, never `who`."""
    checker = usage_ledger.Checker(["tiny"], ["/v1/chat/completions", "/v1/models/{model}",
                                              "/metrics/{path}", "/health"])
    unanswered, replaced = checker.record(spool_line(1, status="000", route="", method="",
                                                     end="refused_request", who="-"))
    assert (unanswered["status"], unanswered["route"], unanswered["method"], replaced) == (
        0, "other", "OTHER", [])
    assert checker.record(spool_line(2, status="400", end="rejected"))[0]["ended"] == "rejected"
    assert checker.record(spool_line(3, route="/v1/models/tiny"))[0]["route"] == \
        "/v1/models/{model}"
    assert checker.record(spool_line(4, route="/metrics/llama8b"))[0]["route"] == \
        "/metrics/{path}"
    assert checker.record(spool_line(5, route="/v1/models/a/b"))[0]["route"] == "other"
    claimed = checker.record(spool_line(6, who="-", claimed="user:carol"))[0]
    assert (claimed["who"], claimed["claimed"]) == ("-", "user:carol")
    hostile, replaced = checker.record(spool_line(7, who="-", claimed='user:"x'))
    assert hostile["claimed"] is None and replaced == ["claimed"]
    assert checker.record(spool_line(8))[0]["claimed"] is None  # a door without the key
    assert checker.record(spool_line(9, who="-", claimed="kit:gate"))[0]["claimed"] == "kit:gate"


def test_the_model_names_file_is_read_again_when_it_changes(run, tmp_path) -> None:
    """Issue 43 item 3: an adapter's name is a model the ledger records. The names are a file
    (an adapter added recreates no container): a request for a name added to it is recorded
    with that name once the file says so; an unreadable file keeps the names read before."""
    names = tmp_path / "models.json"
    names.write_text(json.dumps(["tiny"]))
    spool = tmp_path / "door.jsonl"
    append_spool(spool, [spool_line(1, model="legal")])
    collector = run(models_file=names)
    collector.wait_for(lambda h: h["records"] == 1, "1 record")
    names.write_text(json.dumps(["tiny", "legal"]))
    time.sleep(0.2)
    append_spool(spool, [spool_line(2, model="legal")])
    collector.wait_for(lambda h: h["records"] == 2, "2 records")
    names.write_text("not json")
    time.sleep(0.2)
    append_spool(spool, [spool_line(3, model="legal")])
    health = collector.wait_for(lambda h: h["records"] == 3, "3 records")
    assert [r["model"] for r in ledger_records(tmp_path / "ledger")] == [None, "legal", "legal"]
    assert any("models.json are unreadable" in problem for problem in health["problems"])


def test_only_the_door_and_loopback_are_answered(tmp_path) -> None:
    """Issue 42 item 14: like the waker, the collector answers the front door's address and
    its own loopback only; any other peer (a replica, on an engine without iptables) gets a
    403 and not a byte of who used what."""
    collector = CollectorProcess(tmp_path / "door.jsonl", tmp_path / "ledger",
                                 extra=("--door", "127.0.0.3")).start()
    try:
        def ask(source: str) -> bytes:
            with socket.create_connection(("127.0.0.1", collector.port), timeout=5,
                                          source_address=(source, 0)) as sock:
                sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
                return answer

        assert ask("127.0.0.1").startswith(b"HTTP/1.0 200")
        assert ask("127.0.0.3").startswith(b"HTTP/1.0 200")
        refused = ask("127.0.0.2")
        assert refused.startswith(b"HTTP/1.0 403") and b"series" not in refused
    finally:
        assert collector.stop() == 0
