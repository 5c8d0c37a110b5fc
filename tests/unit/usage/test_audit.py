"""kit audit verify names the first altered, deleted or reordered record (segment, line, seq,
request id); pruned segments pass when pruned.jsonl accounts for them; a chain rewritten from
scratch or cut at its end is caught by the heads earlier verifies kept. Export: the records as
stored, or CSV whose cells cannot run."""

import csv
import errno
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.plan.usage import USAGE_SERVICE
from kit.site import Site
from kit.usage import audit
from kit.usage.audit import EXPORT_COLUMNS, Verdict, export, read_anchors, verify_site
from kit.usage.ledger import LEDGER_DIR, LedgerReader
from kit.usage.period import period
from kit.usage.totals import gather, rows
from tests.support.anchor_writer import start_anchor_writer
from tests.support.fake_engine import FakeEngine
from tests.support.synthetic_ledger import (
    chained,
    folder_files,
    ledger_files,
    ledger_site,
    record,
    segment_lines,
    set_segment_lines,
)
from tests.support.usage_collector import (
    CollectorProcess,
    append_spool,
    nobody_flood,
    spool_line,
)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
DAYS = ("2026-11-01", "2026-11-20", "2026-11-29")


def three_a_day(**fields) -> dict[str, list[dict]]:
    return chained({day: [record(f"{day}T0{h}:00:00.000Z", **fields) for h in range(3)]
                    for day in DAYS})


class Audited:
    """A site whose usage-ledger container holds `files`, verified as `kit audit verify` does."""

    def __init__(self, root: Path, files: dict[str, bytes]):
        self.engine = FakeEngine()
        self.files = files
        self.site = Site.load(ledger_site(root, self.engine, files), check_host=False)

    def replace(self, files: dict[str, bytes]) -> None:
        self.files.clear()
        self.files.update(files)

    def verify(self) -> Verdict:
        return verify_site(self.site, self.engine, NOW)[0]


def problem(verdict: Verdict) -> tuple[str, int | None, str | None, str]:
    finding = verdict.finding
    assert finding is not None, "the verify passed"
    return finding.where, finding.seq, finding.request_id, finding.problem


def test_a_whole_ledger_passes_and_its_head_becomes_an_anchor(tmp_path: Path) -> None:
    chain = three_a_day()
    audited = Audited(tmp_path, ledger_files(chain))
    verdict, kept = verify_site(audited.site, audited.engine, NOW)
    assert verdict.ok and (verdict.records, verdict.segments, verdict.pruned) == (9, 3, 0)
    assert verdict.head is not None and (verdict.head.seq, verdict.head.hash) == (
        9, chain["2026-11-29"][-1]["hash"])
    assert kept and read_anchors(audited.site.layout.usage_anchors) == [verdict.head]
    again, kept_again = verify_site(audited.site, audited.engine, NOW)
    assert again.ok and again.anchors == 1 and not kept_again


def test_an_edited_field_names_the_record(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    lines = segment_lines(files, "2026-11-20")
    lines[1] = lines[1].replace(b'"prompt_tokens":10', b'"prompt_tokens":1')
    set_segment_lines(files, "2026-11-20", lines)
    where, seq, request_id, what = problem(Audited(tmp_path, files).verify())
    assert (where, seq, request_id) == ("segments/2026-11-20.jsonl line 2", 5, "req000005")
    assert what.startswith("altered: its hash does not match")


def test_a_deleted_line_names_the_gap(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    lines = segment_lines(files, "2026-11-20")
    set_segment_lines(files, "2026-11-20", [lines[0], lines[2]])
    where, seq, _, what = problem(Audited(tmp_path, files).verify())
    assert (where, seq) == ("segments/2026-11-20.jsonl line 2", 6)
    assert what == "seq 5 missing before this record: deleted"


def test_two_swapped_lines_are_a_reordering(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    lines = segment_lines(files, "2026-11-20")
    set_segment_lines(files, "2026-11-20", [lines[1], lines[0], lines[2]])
    where, seq, request_id, what = problem(Audited(tmp_path, files).verify())
    assert (where, seq, request_id) == ("segments/2026-11-20.jsonl line 1", 5, "req000005")
    assert what == ("out of order: seq 5 stands where seq 4 belongs (seq 4 is at "
                    "segments/2026-11-20.jsonl line 2)")


def test_a_segment_deleted_without_a_pruned_entry(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    del files[f"{LEDGER_DIR}/segments/2026-11-20.jsonl"]
    where, seq, _, what = problem(Audited(tmp_path, files).verify())
    assert (where, seq) == ("segments/2026-11-29.jsonl line 1", 7)
    assert what == ("seqs 4..6 missing before this segment: a segment or records deleted "
                    "without an entry in pruned.jsonl")


def test_pruned_segments_with_their_entries_pass(tmp_path: Path) -> None:
    files = ledger_files(three_a_day(), pruned=("2026-11-01", "2026-11-20"))
    verdict = Audited(tmp_path, files).verify()
    assert verdict.ok and (verdict.records, verdict.pruned, verdict.segments) == (3, 6, 1)
    assert verdict.head is not None and verdict.head.seq == 9


def test_a_pruned_entry_that_skips_records_is_named(tmp_path: Path) -> None:
    files = ledger_files(three_a_day(), pruned=("2026-11-01", "2026-11-20"))
    entries = files[f"{LEDGER_DIR}/pruned.jsonl"].splitlines(keepends=True)
    second = json.loads(entries[1])
    entries[1] = json.dumps({**second, "first_seq": 5}).encode() + b"\n"
    files[f"{LEDGER_DIR}/pruned.jsonl"] = b"".join(entries)
    where, _, _, what = problem(Audited(tmp_path, files).verify())
    assert where == "pruned.jsonl line 2" and what.endswith("seq 4 missing")


def test_a_segment_still_there_after_its_entry_must_end_where_the_entry_says(
        tmp_path: Path) -> None:
    """The collector writes pruned.jsonl, then removes the file: stopped in between, both are
    there, and they must agree."""
    chain = three_a_day()
    files = ledger_files(chain, pruned=("2026-11-01",))
    files.update({k: v for k, v in ledger_files(chain).items() if k.endswith("11-01.jsonl")})
    assert Audited(tmp_path / "a", dict(files)).verify().ok
    lines = segment_lines(files, "2026-11-01")
    set_segment_lines(files, "2026-11-01", lines[:2])
    where, _, _, what = problem(Audited(tmp_path / "b", files).verify())
    assert (where, what) == (
        "pruned.jsonl line 1", "says segments/2026-11-01.jsonl ends at seq 3, but the file "
        "ends at seq 2 (or with another hash)")


def test_a_chain_rewritten_from_scratch_is_caught_by_an_anchor(tmp_path: Path) -> None:
    audited = Audited(tmp_path, ledger_files(three_a_day()))
    assert audited.verify().ok
    audited.replace(ledger_files(three_a_day(prompt=1)))  # every hash recomputed
    where, seq, request_id, what = problem(audited.verify())
    assert (where, seq, request_id) == ("segments/2026-11-29.jsonl line 3", 9, "req000009")
    assert what.startswith("the chain was rewritten: a verify at 2026-12-01T12:00:00+00:00 saw "
                           "seq 9 with hash")


def test_a_chain_cut_at_its_end_is_caught_by_an_anchor(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    audited = Audited(tmp_path, files)
    assert audited.verify().ok
    set_segment_lines(files, "2026-11-29", segment_lines(files, "2026-11-29")[:2])
    where, seq, _, what = problem(audited.verify())
    assert (where, seq) == ("the end of the ledger", 9)
    assert what.startswith("the chain ends at seq 8, but a verify at")


def test_export_jsonl_is_the_records_as_stored(tmp_path: Path) -> None:
    files = ledger_files(three_a_day())
    audited = Audited(tmp_path, files)
    ledger = LedgerReader(audited.engine, f"unit01-{USAGE_SERVICE}-1")
    chosen = period("2026-11-20", "2026-11-20", NOW, default_since=None)
    exported = b"".join(export(ledger, chosen, "jsonl"))
    assert exported == files[f"{LEDGER_DIR}/segments/2026-11-20.jsonl"]


def test_export_csv_cells_cannot_run_in_a_spreadsheet(tmp_path: Path) -> None:
    chain = chained({"2026-11-20": [record("2026-11-20T01:00:00.000Z", who="=HYPERLINK(\"x\")"),
                                    record("2026-11-20T02:00:00.000Z", who="-", model=None,
                                           prompt=None, completion=None, ended="refused_auth")]})
    audited = Audited(tmp_path, ledger_files(chain))
    ledger = LedgerReader(audited.engine, f"unit01-{USAGE_SERVICE}-1")
    text = b"".join(export(ledger, period(None, None, NOW, default_since=None), "csv")).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == EXPORT_COLUMNS
    assert [row["who"] for row in rows] == ["'=HYPERLINK(\"x\")", "'-"]
    assert rows[1]["prompt_tokens"] == "" and rows[0]["seq"] == "1"
    assert rows[1]["hash"] == chain["2026-11-20"][1]["hash"]


def test_records_cut_from_the_end_are_named_by_the_collectors_own_head(tmp_path: Path) -> None:
    """No verify ran before: state.json's last_seq/last_hash (written after the lines they
    cover) is the head the chain must reach."""
    files = ledger_files(three_a_day())
    set_segment_lines(files, "2026-11-29", segment_lines(files, "2026-11-29")[:1])
    where, seq, _, what = problem(Audited(tmp_path, files).verify())
    assert (where, seq) == ("the end of the ledger", 9)
    assert what == ("the chain ends at seq 7, but the collector's state.json saw seq 9: records "
                    "were removed from its end, or it was rewritten")


def test_an_empty_pruned_segment_accounts_for_nothing(tmp_path: Path) -> None:
    files = ledger_files(three_a_day(), pruned=("2026-11-01",))
    empty = {"segment": "2026-10-31.jsonl", "first_seq": None, "last_seq": None,
             "last_hash": None, "reason": "retention", "at": "2026-11-30T00:00:00.000Z"}
    files[f"{LEDGER_DIR}/pruned.jsonl"] = json.dumps(empty).encode() + b"\n" + files[
        f"{LEDGER_DIR}/pruned.jsonl"]
    verdict = Audited(tmp_path, files).verify()
    assert verdict.ok and (verdict.records, verdict.pruned) == (6, 3)


def test_two_verifies_keeping_their_heads_at_once_lose_neither(tmp_path: Path) -> None:
    """Two processes keep a head at the same moment, each reading the anchors slowly: without
    the file's lock both would read none and the later write would drop the other's anchor;
    with it the second reads again after the first wrote, and keeps both."""
    anchors, go = tmp_path / "site" / ".kit" / "usage-anchors.json", tmp_path / "go"
    writers = [start_anchor_writer(anchors, seq, go) for seq in (7, 9)]
    go.touch()
    said = [writer.communicate(timeout=120)[0] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0] and said == ["kept\n"] * 2
    assert sorted(anchor.seq for anchor in read_anchors(anchors)) == [7, 9]
    assert anchors.stat().st_mode & 0o777 == 0o600


def test_an_anchor_that_cannot_be_kept_is_an_error_not_a_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: Path, *_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    audited = Audited(tmp_path, ledger_files(three_a_day()))
    monkeypatch.setattr(audit, "atomic_write", full)
    with pytest.raises(KitError) as raised:
        audited.verify()
    assert "cannot write" in raised.value.message and "df -h" in str(raised.value.fix)


def test_the_collectors_own_ledger_verifies_and_sums(tmp_path: Path) -> None:
    """Writer and reader agree: the real collector (kit/dataplane/collector/usage_ledger.py, as a
    process) turns 40 spool lines into a ledger; verify passes it up to the collector's own head,
    and the sums are the spool's."""
    spool, folder = tmp_path / "door.jsonl", tmp_path / "ledger"
    append_spool(spool, [spool_line(n, who="key:alice" if n % 2 else "user:bob",
                                    prompt=str(n), completion="1") for n in range(1, 41)])
    collector = CollectorProcess(spool, folder, grace=0.2).start()
    try:
        collector.wait_for(lambda health: health["last_seq"] == 40, "40 records")
    finally:
        assert collector.stop() == 0
    audited = Audited(tmp_path / "site-root", folder_files(folder))
    verdict = audited.verify()
    state = json.loads((folder / "state.json").read_text())
    assert verdict.ok and verdict.records == 40, verdict
    assert verdict.head is not None and verdict.head.hash == state["last_hash"]
    ledger = LedgerReader(audited.engine, f"unit01-{USAGE_SERVICE}-1")
    found = gather(ledger, period(None, None, NOW, default_since=None), None, NOW)
    sums = {row.key: (row.figures.requests, row.figures.prompt_tokens) for row in
            rows(found, ("who",))}
    assert sums == {("key:alice",): (20, sum(range(1, 41, 2))),
                    ("user:bob",): (20, sum(range(2, 41, 2)))}


def test_a_ledger_past_nobodys_share_verifies_sums_and_shows_an_edit(tmp_path: Path) -> None:
    """Nobody's records, written up to their day's share and the rest counted, are in the one
    chain: verify passes it and names an edit of one of them; kit usage counts what was written
    of them as it counts a credential's."""
    spool, folder = tmp_path / "door.jsonl", tmp_path / "ledger"
    flood = nobody_flood(2_000, per_window=100)
    for seq in range(100, 2_001, 100):
        flood[seq - 1] = spool_line(seq, prompt="5", completion="1")
    append_spool(spool, flood)
    collector = CollectorProcess(spool, folder, grace=0.2, max_bytes=400_000,
                                 retention_days=3).start()
    try:
        health = collector.wait_for(lambda h: h["door_seq"].get("boot-a", {}).get(
            "through") == 2_000 and not h["aggregating"], "the flood read")
    finally:
        assert collector.stop() == 0
    dropped = health["disk"]["nobody"]["requests_dropped"]
    assert 0 < dropped < 1_980
    files = folder_files(folder)
    audited = Audited(tmp_path / "site-root", files)
    verdict = audited.verify()
    assert verdict.ok and verdict.records == health["last_seq"], verdict
    ledger = LedgerReader(audited.engine, f"unit01-{USAGE_SERVICE}-1")
    found = gather(ledger, period(None, None, NOW, default_since=None), None, NOW)
    sums = {row.key: row.figures.requests for row in rows(found, ("who",))}
    assert sums == {("key:alice",): 20, ("-",): 1_980 - dropped}
    day = next(name for name in files if "/segments/" in name).rpartition("/")[2][:10]
    lines = segment_lines(files, day)
    number, line = next((number, line) for number, line in enumerate(lines, 1)
                        if json.loads(line)["who"] == "-")
    edited = json.loads(line)
    edited["requests"] += 1
    lines[number - 1] = json.dumps(edited, separators=(",", ":")).encode() + b"\n"
    set_segment_lines(files, day, lines)
    where, seq, _, what = problem(audited.verify())
    assert (where, seq) == (f"segments/{day}.jsonl line {number}", edited["seq"])
    assert what.startswith("altered: its hash does not match")
