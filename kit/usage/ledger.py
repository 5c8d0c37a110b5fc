"""The usage ledger read through the site's Docker engine (local socket or `engine: ssh://…`, one
path): the files of the collector's volume copied out as a tar stream (`docker cp`, so a
stopped collector's ledger reads too), parsed as it arrives, one line at a time.

Only the segments a question needs travel: those from its first day on, one by one for a recent
period, or the `segments/` folder in one stream for a long one (records are appended at or after
they ended, so no earlier segment holds one of the period).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kit.errors import BadInput, KitError
from kit.plan.usage import (
    LEDGER_MOUNT,
    PRUNED_FILE,
    SEGMENTS_DIR,
    STATE_FILE,
    USAGE_SERVICE,
    usage_plan,
)
from kit.usage.health import SAVED, CollectorHealth, parse_health

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

LEDGER_DIR = LEDGER_MOUNT  # the collector's volume as it mounts it (kit/plan/usage.py)
SEGMENTS, PRUNED, STATE = SEGMENTS_DIR, PRUNED_FILE, STATE_FILE
SEGMENT_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})\.jsonl")
DAY_BY_DAY = 31  # a period starting at most this many days ago asks for its segments one by one
MAX_LINE = 64 * 1024  # a record is a few hundred bytes; a longer line is not one


@dataclass(frozen=True)
class Line:
    """One line of a segment, where it stands."""

    segment: str  # segments/YYYY-MM-DD.jsonl
    number: int  # from 1
    text: bytes

    @property
    def where(self) -> str:
        return f"{self.segment} line {self.number}"


class _ChunkFile(io.RawIOBase):
    """A file over an iterator of byte chunks: tarfile reads the engine's stream through it."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._left = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def tar_files(chunks: Iterator[bytes]) -> Iterator[tuple[str, Iterator[bytes]]]:
    """(name, its lines) of each regular file of a tar stream, in the stream's order; a file's
    lines must be read before the next file is asked for (the stream goes one way)."""
    with tarfile.open(fileobj=io.BufferedReader(_ChunkFile(chunks), 1 << 16), mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            content = tar.extractfile(member)
            if content is not None:
                yield member.name, _lines(content)


def _lines(content: io.BufferedReader | Any) -> Iterator[bytes]:
    while True:
        line = content.readline(MAX_LINE + 1)
        if not line:
            return
        yield line.rstrip(b"\n")


class LedgerReader:
    """The ledger in the collector's container `container_id` on `engine`."""

    def __init__(self, engine: Engine, container_id: str, root: str = LEDGER_DIR):
        self.engine, self.container_id, self.root = engine, container_id, root

    def _file(self, name: str) -> Iterator[bytes] | None:
        """The lines of one small file of the ledger (pruned.jsonl, state.json); None: absent."""
        chunks = self.engine.archive(self.container_id, f"{self.root}/{name}")
        if chunks is None:
            return None
        return (line for _, lines in tar_files(chunks) for line in lines)

    def saved_health(self) -> CollectorHealth | None:
        """The collector's account as it last saved it (state.json, read by
        kit/usage/health.py's `parse_health`), None before its first write."""
        lines = self._file(STATE)
        return None if lines is None else parse_health(b"\n".join(lines), SAVED)

    def pruned(self) -> list[tuple[int, dict]]:
        """(line number, entry) of pruned.jsonl: the segments retention or the disk bound
        removed, each with the hash the next kept record chains from."""
        lines = self._file(PRUNED)
        entries = []
        for number, text in enumerate(lines or (), 1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
            except ValueError:
                entry = None
            entries.append((number, entry if isinstance(entry, dict) else {}))
        return entries

    def lines(self, first_day: date | None, today: date | None = None) -> Iterator[Line]:
        """Every line of the segments dated `first_day` or later (None: all), in order."""
        today = today or datetime.now(UTC).date()
        if first_day is not None and (today - first_day).days <= DAY_BY_DAY:
            yield from self._day_by_day(first_day, today + timedelta(days=1))  # clock skew
            return
        chunks = self.engine.archive(self.container_id, f"{self.root}/{SEGMENTS}")
        if chunks is None:
            return
        previous = ""
        for name, lines in tar_files(chunks):
            segment = _segment(name.rpartition("/")[2])
            if segment is None or (first_day is not None and segment[1] < first_day):
                continue
            if segment[0] <= previous:
                raise KitError(f"the engine sent {segment[0]} after {previous}",
                               fix="report this: the engine's archive is not in name order")
            previous = segment[0]
            yield from _numbered(segment[0], lines)

    def _day_by_day(self, first: date, last: date) -> Iterator[Line]:
        day = first
        while day <= last:
            name = f"{SEGMENTS}/{day.isoformat()}.jsonl"
            chunks = self.engine.archive(self.container_id, f"{self.root}/{name}")
            if chunks is not None:
                for _, lines in tar_files(chunks):
                    yield from _numbered(name, lines)
            day += timedelta(days=1)


def _segment(file_name: str) -> tuple[str, date] | None:
    match = SEGMENT_NAME.fullmatch(file_name)
    if match is None:
        return None
    try:
        return f"{SEGMENTS}/{file_name}", date.fromisoformat(match[1])
    except ValueError:
        return None


def segment_day(segment: str) -> date | None:
    """The UTC day a segment (segments/YYYY-MM-DD.jsonl, or its file name) was appended on."""
    found = _segment(segment.rpartition("/")[2])
    return None if found is None else found[1]


def _numbered(segment: str, lines: Iterator[bytes]) -> Iterator[Line]:
    for number, text in enumerate(lines, 1):
        yield Line(segment, number, text)


def open_ledger(site: Site, engine: Engine) -> LedgerReader:
    """The site's ledger on its engine; BadInput naming the fix when there is none to read (usage
    off in the spec; no collector: the stack predates it; a collector that wrote nothing)."""
    if usage_plan(site.spec) is None:
        raise BadInput(f"usage is off for site {site.project} (usage.enabled: false in "
                       f"{site.spec_path}): there is no ledger to read",
                       fix="set usage: {enabled: true} (the default) and run "
                       f"`kit up {site.spec_path}`; requests from then on are recorded")
    found = site.observe(engine, with_images=False).of(USAGE_SERVICE)
    if not found:
        raise BadInput(
            f"site {site.project} has no usage ledger on {engine.address}: there is no "
            f"{USAGE_SERVICE} container (the stack was brought up before the ledger existed)",
            fix=f"run `kit up {site.spec_path}`: it starts the collector")
    ledger = LedgerReader(engine, found[0].id)
    saved = ledger.saved_health()
    if saved is None:  # the collector's first write, before any record
        raise BadInput(
            f"site {site.project}'s usage ledger does not exist yet: the {USAGE_SERVICE} "
            f"container ({found[0].state}) has written nothing to {LEDGER_DIR}",
            fix=f"start it with `kit up {site.spec_path}` and send a request through the front "
            f"door; its log says why it writes nothing: kit logs {site.spec_path} {USAGE_SERVICE}")
    if saved.problem is not None:
        raise KitError(f"site {site.project}'s usage ledger: {saved.problem}",
                       fix=f"see the collector's log: kit logs {site.spec_path} {USAGE_SERVICE}")
    return ledger


def record_of(line: Line) -> dict | None:
    """The record on a line, None when the line is not a JSON object with a seq."""
    try:
        record = json.loads(line.text)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("seq"), int) else None


def record_time(record: dict) -> datetime | None:
    """A record's `time` (when the request ended), None when it is not an ISO time."""
    value = record.get("time")
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def records(ledger: LedgerReader, first_day: date | None) -> Iterator[tuple[Line, dict, datetime]]:
    """(line, record, its time) of every record from `first_day` on; a line that is not a
    record is exit 1 naming it (`kit audit verify` says what else is wrong)."""
    for line in ledger.lines(first_day):
        if not line.text.strip():
            continue
        record = record_of(line)
        moment = None if record is None else record_time(record)
        if record is None or moment is None:
            raise KitError(f"the usage ledger's {line.where} is not a record",
                           fix="run `kit audit verify` to see whether the ledger was altered")
        yield line, record, moment
