"""kit usage's sums: by who, model and day in any order, the period's bounds (a record appended
after midnight still counts on its own day), how requests ended, text/CSV/JSON, a fleet's
sections, and the chargeback rule (GPUs x hours x price, shared by tokens; idle GPUs shown)."""

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from kit.errors import BadInput
from kit.usage.ledger import LedgerReader
from kit.usage.period import period
from kit.usage.totals import (
    Chargeback,
    PeriodUsage,
    csv_text,
    gather,
    json_text,
    parse_by,
    rows,
    text,
)
from tests.support.fake_engine import FakeEngine
from tests.support.synthetic_ledger import chained, ledger_container, ledger_files, record

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
SEGMENTS = {
    "2026-11-29": [record("2026-11-29T10:00:00.000Z", who="key:a", prompt=100, completion=50),
                   record("2026-11-29T11:00:00.000Z", who="user:ops", prompt=5, completion=5)],
    "2026-11-30": [
        # ended 23:59:59.9 on the 29th, appended after midnight: the 29th's
        record("2026-11-29T23:59:59.900Z", who="key:a", prompt=100, completion=50),
        record("2026-11-30T09:00:00.000Z", who="key:b", prompt=60, completion=None,
               ended="client_abort"),
        record("2026-11-30T09:30:00.000Z", who="key:b", model="beta", prompt=None,
               completion=None, ended="upstream_error", status=502),
        record("2026-11-30T10:00:00.000Z", who="-", model=None, prompt=None, completion=None,
               ended="refused_auth", status=401),
        record("2026-11-30T11:00:00.000Z", who="key:b", prompt=30, completion=10)],
    "2026-12-01": [record("2026-12-01T08:00:00.000Z", who="key:a", prompt=1, completion=1)],
}


def usage_of(since: str, until: str | None, chargeback: Chargeback | None = None) -> PeriodUsage:
    engine = FakeEngine()
    files = ledger_files(chained(SEGMENTS))
    ledger = LedgerReader(engine, ledger_container(engine, "unit01", files))
    return gather(ledger, period(since, until, NOW, default_since=None), chargeback, NOW)


def figures(found: PeriodUsage, *by: str) -> dict[tuple[str, ...], tuple[int, ...]]:
    return {row.key: (row.figures.requests, row.figures.completed, row.figures.aborted,
                      row.figures.failed, row.figures.refused, row.figures.prompt_tokens,
                      row.figures.completion_tokens) for row in rows(found, by)}


def test_by_credential_with_how_requests_ended() -> None:
    assert figures(usage_of("2026-11-29", "2026-11-30"), "who") == {
        ("-",): (1, 0, 0, 0, 1, 0, 0),
        ("key:a",): (2, 2, 0, 0, 0, 200, 100),
        ("key:b",): (3, 1, 1, 1, 0, 90, 10),
        ("user:ops",): (1, 1, 0, 0, 0, 5, 5),
    }


def test_any_keys_in_the_order_given() -> None:
    found = usage_of("2026-11-29", None)
    assert list(figures(found, "day", "who")) == [
        ("2026-11-29", "key:a"), ("2026-11-29", "user:ops"), ("2026-11-30", "-"),
        ("2026-11-30", "key:b"), ("2026-12-01", "key:a")]
    assert figures(found, "model", "who")[("beta", "key:b")] == (1, 0, 0, 1, 0, 0, 0)
    assert figures(found, "model")[("-",)] == (1, 0, 0, 0, 1, 0, 0)  # routed nowhere


def test_the_period_bounds() -> None:
    assert figures(usage_of("2026-11-30", "2026-11-30"), "day") == {
        ("2026-11-30",): (4, 1, 1, 1, 1, 90, 10)}
    assert figures(usage_of("2026-11-29T10:30", "2026-11-29T23:00"), "who") == {
        ("user:ops",): (1, 1, 0, 0, 0, 5, 5)}
    assert figures(usage_of("2026-11-28", "2026-11-28"), "who") == {}


def test_csv_json_and_text() -> None:
    found = usage_of("2026-11-29", "2026-11-30")
    table = list(csv.reader(io.StringIO(csv_text([(None, found)], ("who", "model")))))
    assert table[0] == ["who", "model", "requests", "completed", "aborted", "failed", "refused",
                        "prompt_tokens", "completion_tokens", "tokens"]
    assert table[1] == ["'-", "'-", "1", "0", "0", "0", "1", "0", "0", "0"]  # neutralised
    assert ["key:a", "alpha", "2", "2", "0", "0", "0", "200", "100", "300"] in table
    document = json.loads(json_text([(None, found)], ("who",)))
    assert document["period"] == {"since": "2026-11-29T00:00:00+00:00",
                                  "until": "2026-12-01T00:00:00+00:00"}
    assert document["total"]["requests"] == 7 and document["total"]["tokens"] == 410
    assert document["rows"][1] == {"who": "key:a", "requests": 2, "completed": 2, "aborted": 0,
                                   "failed": 0, "refused": 0, "prompt_tokens": 200,
                                   "completion_tokens": 100, "tokens": 300}
    shown = text([(None, found)], ("who",)).splitlines()
    assert shown[0] == "usage 2026-11-29 00:00 to 2026-12-01 00:00 (UTC)"
    assert shown[1].split() == ["WHO", "REQUESTS", "COMPLETED", "ABORTED", "FAILED", "REFUSED",
                                "PROMPT", "COMPLETION", "TOKENS"]
    assert shown[-1].split() == ["TOTAL", "7", "4", "1", "1", "1", "295", "115", "410"]
    assert text([(None, usage_of("2026-11-28", "2026-11-28"))], ("who",)).endswith(
        "no records in this period")


def test_a_fleet_has_a_server_column_and_one_total() -> None:
    found = usage_of("2026-11-29", "2026-11-30")
    sections = [("gpu01", found), ("gpu02", found)]
    document = json.loads(json_text(sections, ("who",)))
    assert document["rows"][0] == {**document["rows"][0], "server": "gpu01", "who": "-"}
    assert len(document["rows"]) == 8 and document["total"]["requests"] == 14
    shown = text(sections, ("who",)).splitlines()
    assert shown[1].split()[:2] == ["SERVER", "WHO"] and shown[-1].split()[:2] == ["TOTAL", "14"]


def test_chargeback_shares_each_services_gpu_hours_by_tokens() -> None:
    """alpha: 1 GPU x 24 h x 2.0 = 48, shared by its 250 tokens: key:a 150, key:b 100;
    beta: 2 GPUs x 24 h x 2.0 = 96 with no token served: idle."""
    charge = Chargeback(2.0, {"alpha": 1, "beta": 2})
    found = usage_of("2026-11-29T12:00", "2026-11-30T12:00", charge)
    assert found.model_costs() == {"alpha": 48.0, "beta": 96.0}
    assert found.idle() == {"beta": 96.0}
    costs = {row.key: row.cost for row in rows(found, ("who",))}
    assert costs == {("-",): 0.0, ("key:a",): pytest.approx(48 * 150 / 250),
                     ("key:b",): pytest.approx(48 * 100 / 250)}
    document = json.loads(json_text([(None, found)], ("who",)))
    key_a = next(r for r in document["rows"] if r["who"] == "key:a")
    assert key_a["cost"] == pytest.approx(28.8) and key_a["cost_per_million_tokens"] == \
        pytest.approx(192000.0)
    assert document["chargeback"] == {"gpu_hour_cost": 2.0, "hours": 24.0,
                                      "gpus": {"alpha": 1, "beta": 2},
                                      "idle_cost": {"beta": 96.0}}
    shown = text([(None, found)], ("who",))
    assert "cost: 2 per GPU-hour x 24.0 h held" in shown
    assert "idle (no tokens to charge): beta 96.00" in shown


def test_the_hours_stop_now() -> None:
    found = usage_of("2026-12-01", None, Chargeback(1.0, {"alpha": 1}))
    assert found.model_costs() == {"alpha": 12.0}  # 00:00 to 12:00


@pytest.mark.parametrize(("text_", "named"), [
    ("who,credential", "'credential' is not one of them"),
    ("who,who", "each key once"),
    ("", "each key once"),
])
def test_a_bad_by_names_the_keys(text_: str, named: str) -> None:
    with pytest.raises(BadInput) as raised:
        parse_by(text_)
    assert named in raised.value.message and "who, model, day" in str(raised.value.fix)
    assert parse_by("day,who") == ("day", "who")


def test_an_aggregate_counts_its_requests_and_a_services_refusal_is_refused() -> None:
    """Issue 42 items 6 and 8: a record of requests nobody authenticated counted per address
    and minute is as many requests as it holds; the service's own 4xx (`rejected`) is REFUSED,
    never COMPLETED."""
    flood = {**record("2026-11-30T10:00:00.000Z", who="-", model=None, prompt=None,
                      completion=None, ended="refused_auth", status=401),
             "requests": 6990, "door_seqs": [[1, 6990]]}
    rejected = record("2026-11-30T10:01:00.000Z", who="key:b", prompt=None, completion=None,
                      ended="rejected", status=400)
    gate = {**record("2026-11-30T10:02:00.000Z", who="-", model=None, prompt=None,
                     completion=None, ended="refused_auth", status=401),
            "claimed": "kit:gate", "requests": 6, "door_seqs": [[7000, 7005]]}
    engine = FakeEngine()
    ledger = LedgerReader(engine, ledger_container(engine, "unit01", ledger_files(chained(
        {"2026-11-30": [flood, rejected, gate]}))))
    found = gather(ledger, period("2026-11-30", "2026-11-30", NOW, default_since=None), None,
                   NOW)
    assert figures(found, "who") == {("-",): (6990, 0, 0, 0, 6990, 0, 0),
                                     ("key:b",): (1, 0, 0, 0, 1, 0, 0)}
    # kit's gate refusing itself on purpose is not usage: said below the table, not in it
    assert found.gate_checks == 6
    assert text([(None, found)], ("who",)).splitlines()[-1] == (
        "not counted above: 6 requests kit's gate made to be refused (its checks of the door "
        "at kit up)")
    assert json.loads(json_text([(None, found)], ("who",)))["gate_checks"] == 6
