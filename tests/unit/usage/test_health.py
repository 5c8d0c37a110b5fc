"""The usage ledger's health has one owner (kit/usage/health.py): the running collector's
/health (what `kit status` shows) and the state.json it saves (what `kit usage` and `kit audit`
read) are one document read one way, so the two differ only by when they were taken."""

import json
from pathlib import Path

import pytest

from kit.errors import ExitCode, KitError
from kit.plan.usage import HEALTH_ARGV
from kit.site import Site
from kit.usage.audit import collector_head
from kit.usage.health import ASKED, SAVED, CollectorHealth, parse_health, running_health
from kit.usage.ledger import LEDGER_DIR, open_ledger
from kit.views.usage_health import ledger_health
from tests.support.fake_engine import FakeEngine
from tests.support.synthetic_ledger import chained, folder_files, ledger_files, ledger_site, record
from tests.support.usage_collector import ledger_records, run_with_a_lost_record


def test_asked_and_saved_are_the_same_account(tmp_path: Path) -> None:
    """A real collector's last /health answer and the state.json it left, through the fake
    engine's exec and archive: the same head and figures, so kit status's record count is the
    head kit audit verify checks."""
    answered, folder = run_with_a_lost_record(tmp_path)
    engine = FakeEngine()
    site = Site.load(ledger_site(tmp_path, engine, folder_files(folder)), check_host=False)
    engine.exec_results[tuple(HEALTH_ARGV)] = [(0, json.dumps(answered))]

    asked = running_health(engine, site.observe(engine, with_images=False).containers)
    saved = open_ledger(site, engine).saved_health()
    assert saved is not None and (asked.source, saved.source) == (ASKED, SAVED)
    assert asked.problem is None and saved.problem is None
    last = ledger_records(folder)[-1]
    assert asked.head == saved.head == (4, last["hash"])
    assert asked.document and saved.document
    assert asked.document["lost"] == saved.document["lost"]
    assert asked.document["disk"]["max_bytes"] == saved.document["disk"]["max_bytes"]

    status = ledger_health(engine, site.observe(engine, with_images=False).containers)
    head = collector_head(saved)
    assert head is not None and status.to_json()["records"] == head.seq == 4
    assert status.to_json()["lost"] == 1


@pytest.mark.parametrize(("document", "head"), [
    ({"last_seq": 7, "last_hash": "ab"}, (7, "ab")),
    ({"last_seq": 0, "last_hash": "ab"}, None),  # before the first record
    ({"last_seq": True, "last_hash": "ab"}, None),
    ({"last_seq": "7", "last_hash": "ab"}, None),
    ({"last_seq": 7}, None),
    ({}, None),
], ids=["head", "none-yet", "bool", "text", "no-hash", "empty"])
def test_the_head_is_read_plainly_or_not_at_all(document: dict, head: object) -> None:
    assert parse_health(json.dumps(document), SAVED).head == head


@pytest.mark.parametrize("text", [b"{torn", b"[1, 2]", b"null"])
def test_a_document_that_is_not_one_is_a_problem_named_by_where_it_was(text: bytes) -> None:
    for source in (ASKED, SAVED):
        found = parse_health(text, source)
        assert found == CollectorHealth(None, source, found.problem)
        assert f"the collector's {source} is unreadable" in str(found.problem)


def test_an_unreadable_state_json_stops_kit_usage_and_audit_naming_it(tmp_path: Path) -> None:
    files = ledger_files(chained({"2026-11-30": [record("2026-11-30T01:00:00.000Z")]}))
    files[f"{LEDGER_DIR}/state.json"] = b"[]"
    engine = FakeEngine()
    site = Site.load(ledger_site(tmp_path, engine, files), check_host=False)
    with pytest.raises(KitError) as raised:
        open_ledger(site, engine)
    assert raised.value.exit_code == ExitCode.FAILED
    assert "usage ledger: the collector's state.json is unreadable" in raised.value.message
    assert "kit logs" in str(raised.value.fix)
