"""The ledger read through the engine's archive stream (the fake engine cuts it in 1000-byte
chunks): segments in order, only those a period needs, a stopped collector read too, and a site
without a ledger refused with the fix."""

from datetime import date
from pathlib import Path

import pytest

from kit.errors import BadInput, ExitCode, KitError
from kit.site import Site
from kit.usage.ledger import LEDGER_DIR, LedgerReader, open_ledger, records
from tests.support.fake_engine import FakeEngine
from tests.support.synthetic_ledger import (
    chained,
    ledger_container,
    ledger_files,
    ledger_site,
    record,
    segment_lines,
    set_segment_lines,
)

DAYS = ("2026-11-01", "2026-11-20", "2026-11-29", "2026-11-30")
TODAY = date(2026, 11, 30)


def three_a_day() -> dict[str, bytes]:
    return ledger_files(chained({day: [record(f"{day}T0{h}:00:00.000Z") for h in range(3)]
                                 for day in DAYS}))


def reader(files: dict[str, bytes] | None, *,
           running: bool = True) -> tuple[FakeEngine, LedgerReader]:
    engine = FakeEngine()
    return engine, LedgerReader(engine, ledger_container(engine, "unit01", files, running=running))


def test_every_segment_in_order_through_one_stream() -> None:
    engine, ledger = reader(three_a_day())
    lines = list(ledger.lines(None, TODAY))
    assert [(line.segment, line.number) for line in lines][:4] == [
        ("segments/2026-11-01.jsonl", 1), ("segments/2026-11-01.jsonl", 2),
        ("segments/2026-11-01.jsonl", 3), ("segments/2026-11-20.jsonl", 1)]
    assert [r["seq"] for _, r, _ in records(ledger, None)] == list(range(1, 13))
    assert [about for method, about in engine.calls if method == "archive"] == [
        f"{LEDGER_DIR}/segments"] * 2


def test_a_recent_period_asks_for_its_days_only() -> None:
    """From the first day to tomorrow (a clock a little behind the server's), one by one."""
    engine, ledger = reader(three_a_day())
    found = [line.segment for line in ledger.lines(date(2026, 11, 29), TODAY)]
    assert found == ["segments/2026-11-29.jsonl"] * 3 + ["segments/2026-11-30.jsonl"] * 3
    assert [about for method, about in engine.calls if method == "archive"] == [
        f"{LEDGER_DIR}/segments/{day}.jsonl" for day in ("2026-11-29", "2026-11-30", "2026-12-01")]


def test_a_long_period_streams_the_folder_and_skips_older_segments() -> None:
    engine, ledger = reader(three_a_day())
    lines = list(ledger.lines(date(2026, 10, 1), TODAY))
    assert {line.segment for line in lines} == {f"segments/{day}.jsonl" for day in DAYS}
    lines = list(ledger.lines(date(2026, 11, 20), date(2027, 1, 1)))
    assert {line.segment for line in lines} == {f"segments/{day}.jsonl" for day in DAYS[1:]}
    assert [a for m, a in engine.calls if m == "archive"] == [f"{LEDGER_DIR}/segments"] * 2


def test_a_stopped_collector_is_read_too() -> None:
    _, ledger = reader(three_a_day(), running=False)
    assert len(list(ledger.lines(None, TODAY))) == 12 and ledger.saved_health() is not None


def test_a_line_that_is_not_a_record_is_named() -> None:
    files = three_a_day()
    lines = segment_lines(files, "2026-11-20")
    set_segment_lines(files, "2026-11-20", [lines[0], b"{not json\n", *lines[1:]])
    _, ledger = reader(files)
    with pytest.raises(KitError) as raised:
        list(records(ledger, None))
    assert "segments/2026-11-20.jsonl line 2 is not a record" in raised.value.message
    assert "kit audit verify" in str(raised.value.fix)


def test_a_site_without_a_collector_names_the_fix(tmp_path: Path) -> None:
    engine = FakeEngine()
    spec = ledger_site(tmp_path, engine, None)
    engine.remove("unit01-usage-ledger-1")
    with pytest.raises(BadInput) as raised:
        open_ledger(Site.load(spec, check_host=False), engine)
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert "has no usage ledger" in raised.value.message
    assert "kit up" in str(raised.value.fix)


def test_usage_off_in_the_spec_names_the_switch(tmp_path: Path) -> None:
    engine = FakeEngine()
    spec = ledger_site(tmp_path, engine, None)
    spec.write_text(spec.read_text() + "usage: {enabled: false}\n")
    with pytest.raises(BadInput) as raised:
        open_ledger(Site.load(spec, check_host=False), engine)
    assert "usage is off for site unit01 (usage.enabled: false" in raised.value.message
    assert "usage: {enabled: true}" in str(raised.value.fix)
    assert engine.calls == [("create_container", "unit01-usage-ledger-1"),
                            ("start", engine.calls[1][1])]  # the engine was not asked


def test_a_collector_that_wrote_nothing_yet_names_the_fix(tmp_path: Path) -> None:
    engine = FakeEngine()
    spec = ledger_site(tmp_path, engine, None)
    with pytest.raises(BadInput) as raised:
        open_ledger(Site.load(spec, check_host=False), engine)
    assert "does not exist yet" in raised.value.message
    assert "kit logs" in str(raised.value.fix)
