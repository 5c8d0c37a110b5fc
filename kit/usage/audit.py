"""`kit audit`: whether the usage ledger is whole, and its records exported.

`verify` walks every segment in order: each record's seq follows the one before (from 1, no gaps)
and its hash is `record_hash(previous hash, record)` (kit/dataplane/collector/usage_ledger.py, the
one definition). A segment that retention or the disk bound removed is accounted for by its line in
pruned.jsonl: its seqs are skipped and the first kept record chains from its `last_hash`. The
first record that breaks this is named (segment file, line, seq, request id) with what is
wrong. An edit breaks the record's own hash; a deletion leaves a gap in seq; a reordering puts a
seq where another belongs.

A chain rewritten from scratch (every hash recomputed) passes those checks, so each passing
verify keeps the head it saw (seq, hash, time) in the site's .kit/ (kit/layout.py
`usage_anchors`; added under that file's lock, so two verifies at once keep both), and every
later verify finds each kept head still in the chain; the collector's own head in state.json
(last_seq, last_hash) is checked the same way, so records cut from the end since the
collector's last write are named even without an anchor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kit.dataplane.collector.usage_ledger import GENESIS, RECORD_FIELDS, record_hash
from kit.files import atomic_write, write_failure
from kit.site_lock import state_file_lock
from kit.state import json_object, read_state
from kit.usage.health import CollectorHealth
from kit.usage.ledger import (
    PRUNED,
    STATE,
    LedgerReader,
    Line,
    open_ledger,
    record_of,
    records,
    segment_day,
)
from kit.usage.period import Period
from kit.usage.tables import csv_lines

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

LOOK_AHEAD = 100_000  # lines read past a seq gap to tell a reordering from a deletion


@dataclass(frozen=True)
class ChainHead:
    """The last record of the chain as a verify saw it."""

    seq: int
    hash: str
    at: str  # when it was seen (ISO 8601 UTC)

    @property
    def seen_by(self) -> str:
        return "the collector's state.json" if self.at == STATE else f"a verify at {self.at}"


def collector_head(saved: CollectorHealth | None) -> ChainHead | None:
    """The last record the collector says it wrote (its saved account, state.json, read before
    the walk: it is saved after the lines it covers, so an honest chain reaches it)."""
    head = None if saved is None else saved.head
    return None if head is None else ChainHead(*head, STATE)


@dataclass(frozen=True)
class Finding:
    """The first thing wrong, where it is."""

    where: str  # segments/YYYY-MM-DD.jsonl line N, or pruned.jsonl line N
    problem: str
    seq: int | None = None
    request_id: str | None = None

    def __str__(self) -> str:
        record = "" if self.seq is None else f" (seq {self.seq}" + (
            f", request id {self.request_id})" if self.request_id else ")")
        return f"{self.where}{record}: {self.problem}"


@dataclass(frozen=True)
class PrunedRange:
    """Records the collector removed, as its pruned.jsonl line says: which, when and why."""

    first_seq: int
    last_seq: int
    segment: str
    reason: str  # "retention" (usage.retention_days) or "max_bytes" (usage.max_disk)
    at: str
    credential_requests: int | None  # requests of credentials it held (None: not counted)

    def __str__(self) -> str:
        why = {"retention": "older than usage.retention_days",
               "max_bytes": "to keep the ledger under usage.max_disk"}.get(self.reason,
                                                                          self.reason)
        held = "" if self.credential_requests is None else (
            f", holding {self.credential_requests:,} requests of credentials")
        return (f"seqs {self.first_seq}..{self.last_seq} (segments/{self.segment}) pruned at "
                f"{self.at}, {why}{held}")


@dataclass(frozen=True)
class Verdict:
    records: int  # records read and chained
    pruned: int  # records accounted for by pruned.jsonl
    segments: int  # segment files read
    head: ChainHead | None  # the last record (None: an empty ledger)
    anchors: int  # earlier heads found still in the chain
    finding: Finding | None
    pruned_ranges: tuple[PrunedRange, ...] = ()  # what was pruned, in the chain's order

    @property
    def ok(self) -> bool:
        return self.finding is None

    def to_json(self) -> dict:
        return {"ok": self.ok, "records": self.records, "pruned_records": self.pruned,
                "segments": self.segments, "head": None if self.head is None else asdict(
                    self.head), "anchors_checked": self.anchors,
                "pruned_ranges": [asdict(pruned) for pruned in self.pruned_ranges],
                "problem": None if self.finding is None else {
                    **asdict(self.finding), "message": str(self.finding)}}


class _Pruned:
    """pruned.jsonl's entries by segment day, consumed in order as the walk passes them."""

    def __init__(self, entries: list[tuple[int, dict]]):
        self.bad: Finding | None = None
        self.by_day: list[tuple[str, int, dict]] = []
        for number, entry in entries:
            day = segment_day(str(entry.get("segment", "")))
            first, last = entry.get("first_seq"), entry.get("last_seq")
            if day is not None and first is last is entry.get("last_hash") is None:
                continue  # an empty segment was pruned: it held no record
            if day is None or not isinstance(first, int) or not isinstance(last, int) or (
                    not isinstance(entry.get("last_hash"), str)) or first > last:
                self.bad = self.bad or Finding(
                    f"{PRUNED} line {number}", "not an entry of a pruned segment (segment, "
                    "first_seq <= last_seq, last_hash)")
                continue
            self.by_day.append((day.isoformat(), number, entry))
        self.by_day.sort(key=lambda item: item[0])

    def before(self, day: str) -> Iterator[tuple[int, dict]]:
        """The entries of segments older than `day` not yet passed (all: "~")."""
        while self.by_day and self.by_day[0][0] < day:
            _, number, entry = self.by_day.pop(0)
            yield number, entry

    def of(self, day: str) -> tuple[int, dict] | None:
        """The entry of the segment of `day` itself (pruned.jsonl written, file not yet
        removed: the collector stopped in between)."""
        if self.by_day and self.by_day[0][0] == day:
            _, number, entry = self.by_day.pop(0)
            return number, entry
        return None


class _Walk:
    def __init__(self, anchors: list[ChainHead]):
        self.expected, self.previous = 1, GENESIS
        self.records = self.pruned = self.segments = 0
        self.pruned_ranges: list[PrunedRange] = []
        self.anchors: dict[int, list[ChainHead]] = {}
        for anchor in anchors:
            self.anchors.setdefault(anchor.seq, []).append(anchor)
        self.anchors_seen = 0
        self.own_entry: tuple[int, dict] | None = None  # pruned.jsonl's line of this segment

    def anchor(self, seq: int, hash_: str, where: str, request_id: str | None
               ) -> Finding | None:
        for anchor in self.anchors.get(seq, ()):
            if anchor.hash != hash_:
                return Finding(where, f"the chain was rewritten: {anchor.seen_by} saw seq {seq} "
                               f"with hash {anchor.hash[:16]}…, now it is {hash_[:16]}…", seq,
                               request_id)
            self.anchors_seen += anchor.at != STATE
        return None

    def skip_pruned(self, number: int, entry: dict) -> Finding | None:
        where = f"{PRUNED} line {number}"
        if entry["first_seq"] != self.expected:
            return Finding(where, f"segment {entry['segment']} was pruned holding seq "
                           f"{entry['first_seq']}..{entry['last_seq']}, but the chain is at seq "
                           f"{self.expected} there: "
                           + _gap(self.expected, entry["first_seq"]))
        self.pruned += entry["last_seq"] - entry["first_seq"] + 1
        held = entry.get("credential_requests")
        self.pruned_ranges.append(PrunedRange(
            entry["first_seq"], entry["last_seq"], str(entry["segment"]),
            str(entry.get("reason")), str(entry.get("at")),
            held if isinstance(held, int) and not isinstance(held, bool) else None))
        self.expected, self.previous = entry["last_seq"] + 1, entry["last_hash"]
        return self.anchor(entry["last_seq"], entry["last_hash"], where, None)

    def segment_end(self, segment: str) -> Finding | None:
        """A segment pruned.jsonl lists but the collector had not removed yet must end where
        its entry says."""
        if self.own_entry is None:
            return None
        (number, entry), self.own_entry = self.own_entry, None
        if (entry["last_seq"], entry["last_hash"]) != (self.expected - 1, self.previous):
            return Finding(f"{PRUNED} line {number}", f"says {segment} ends at seq "
                           f"{entry['last_seq']}, but the file ends at seq {self.expected - 1} "
                           "(or with another hash)")
        return None

    def past_head(self) -> Finding | None:
        """An earlier verify saw a longer chain: its end was cut off, or it was rewritten."""
        beyond = [anchor for seq, anchors in sorted(self.anchors.items()) if seq >= self.expected
                  for anchor in anchors]
        if not beyond:
            return None
        anchor = beyond[0]
        return Finding("the end of the ledger", f"the chain ends at seq {self.expected - 1}, "
                       f"but {anchor.seen_by} saw seq {anchor.seq}: records were removed from its "
                       "end, or it was rewritten", anchor.seq)

    def check(self, line: Line, lines: Iterator[Line]) -> Finding | None:
        record = record_of(line)
        if record is None:
            return Finding(line.where, "not a ledger record (JSON object with a seq)")
        seq, request_id = record["seq"], _text(record.get("request_id"))
        if seq > self.expected:
            return Finding(line.where, _missing(self.expected, seq, line, lines), seq, request_id)
        if seq < self.expected:
            return Finding(line.where, f"out of order: seq {seq} comes after seq "
                           f"{self.expected - 1} (a record reordered or repeated)", seq,
                           request_id)
        stored = record.get("hash")
        if stored != record_hash(self.previous, record):
            return Finding(line.where, "altered: its hash does not match its content and the "
                           "record before it (this record was edited, or the one before it "
                           "rewritten with a new hash)", seq, request_id)
        self.records += 1
        self.expected, self.previous = seq + 1, stored
        return self.anchor(seq, stored, line.where, request_id)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _gap(expected: int, found: int) -> str:
    if found < expected:
        return "its seqs overlap records already in the chain"
    span = f"seq {expected}" if found - expected == 1 else f"seq {expected}..{found - 1}"
    return f"{span} missing"


def _missing(expected: int, found: int, line: Line, lines: Iterator[Line]) -> str:
    """What a seq gap is: the missing record later on (a reordering), or gone (a deletion)."""
    for _, later in zip(range(LOOK_AHEAD), lines, strict=False):
        record = record_of(later)
        if record is not None and record["seq"] == expected:
            return (f"out of order: seq {found} stands where seq {expected} belongs (seq "
                    f"{expected} is at {later.where})")
    span = f"seq {expected}" if found - expected == 1 else f"seqs {expected}..{found - 1}"
    if line.number == 1:
        return (f"{span} missing before this segment: a segment or records deleted without "
                f"an entry in {PRUNED}")
    return f"{span} missing before this record: deleted"


def verify(ledger: LedgerReader, anchors: list[ChainHead], now: datetime) -> Verdict:
    """Walk the whole ledger; the first finding, or the head it ends at."""
    pruned = _Pruned(ledger.pruned())
    walk = _Walk(anchors)

    def verdict(finding: Finding | None) -> Verdict:
        head = None if walk.expected == 1 else ChainHead(walk.expected - 1, walk.previous,
                                                    now.isoformat())
        return Verdict(walk.records, walk.pruned, walk.segments, head, walk.anchors_seen,
                       finding, tuple(walk.pruned_ranges))

    if pruned.bad is not None:
        return verdict(pruned.bad)
    lines = iter(ledger.lines(None))
    segment = ""
    for line in lines:
        if line.segment != segment:
            ended = walk.segment_end(segment)
            if ended is not None:
                return verdict(ended)
            segment, day = line.segment, str(segment_day(line.segment))
            walk.segments += 1
            for number, entry in pruned.before(day):
                finding = walk.skip_pruned(number, entry)
                if finding is not None:
                    return verdict(finding)
            walk.own_entry = pruned.of(day)
        if not line.text.strip():
            continue
        finding = walk.check(line, lines)
        if finding is not None:
            return verdict(finding)
    finding = walk.segment_end(segment)
    for number, entry in pruned.before("~"):
        finding = finding or walk.skip_pruned(number, entry)
    return verdict(finding or walk.past_head())


def verify_site(site: Site, engine: Engine, now: datetime) -> tuple[Verdict, bool]:
    """`kit audit verify`'s core call: the site's ledger walked against the anchors of its
    .kit/; a passing verify keeps its head as a new anchor. (verdict, whether it was kept)"""
    anchors = read_anchors(site.layout.usage_anchors)
    ledger = open_ledger(site, engine)
    collector = collector_head(ledger.saved_health())  # before the walk: the chain reaches it
    verdict = verify(ledger, [*anchors, *([collector] if collector else [])], now)
    kept = verdict.ok and verdict.head is not None and keep_anchor(
        site.layout.usage_anchors, verdict.head)
    return verdict, kept


def export_site(site: Site, engine: Engine, period: Period, form: str) -> Iterator[bytes]:
    """`kit audit export`'s core call (the ledger is found before the first byte)."""
    return export(open_ledger(site, engine), period, form)


# ----------------------------------------------------------------- anchors


ANCHORS_FIX = ("if the ledger was deliberately started over (its volume removed), move the "
               "file away; otherwise restore it from a backup")


def read_anchors(path: Path) -> list[ChainHead]:
    """The heads earlier verifies saw, oldest first (none yet: [])."""
    found = read_state(path, _anchors, fix=ANCHORS_FIX)
    return found or []


def _anchors(text: str) -> list[ChainHead]:
    return [ChainHead(int(item["seq"]), str(item["hash"]), str(item["at"]))
            for item in json_object(text)["anchors"]]


def keep_anchor(path: Path, head: ChainHead) -> bool:
    """Add `head` to the anchors; False when one of them already is that record. The file is
    read again and written back (atomic) under its lock, so an anchor another verify kept since
    this one started is kept too, never overwritten."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise write_failure(error, path) from None
    with state_file_lock(path, "audit verify"):
        anchors = read_anchors(path)
        if any((anchor.seq, anchor.hash) == (head.seq, head.hash) for anchor in anchors):
            return False
        document = {"anchors": [asdict(anchor) for anchor in [*anchors, head]]}
        try:
            atomic_write(path, (json.dumps(document, indent=1) + "\n").encode(), 0o600)
        except OSError as error:
            raise write_failure(error, path) from None
    return True


# ----------------------------------------------------------------- export

EXPORT_FORMATS = ("jsonl", "csv")
EXPORT_COLUMNS = (*RECORD_FIELDS, "hash")


def export(ledger: LedgerReader, period: Period, form: str) -> Iterator[bytes]:
    """The period's records as stored (jsonl: each line as the ledger holds it, its hash
    checkable) or as CSV (one column per field, cells neutralised), made as they are read."""
    chosen = ((line, record) for line, record, moment in records(ledger, period.first_day)
              if period.holds(moment))
    if form == "jsonl":
        return (line.text + b"\n" for line, _ in chosen)
    rows = ([record.get(column) for column in EXPORT_COLUMNS] for _, record in chosen)
    return (text.encode() for text in csv_lines(EXPORT_COLUMNS, rows))
