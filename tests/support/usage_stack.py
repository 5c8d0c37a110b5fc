"""The usage ledger of a live stack read back for the end-to-end tests (tests/e2e/test_usage*.py):
its records through `kit audit export`, kit status's view once it caught up with the door, the
request ids nginx logged, and the check that each is in the ledger once."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from tests.support.live_stack import LiveSite, checked, wait_for

# nginx's stdout access log (log_format kit): address, who, [time], "request", status, …, id
LOG_LINE = re.compile(r'^\S+ (\S+) \[[^]]*\] ".*" (\d{3}) .* id=([0-9a-f]{32})$', re.MULTILINE)
# The door's refusals (docs/usage.md): recorded per address and minute with those nobody
# authenticated, not alone. (A service's own 4xx is recorded alone; these tests make none.)
REFUSALS = {"000", "400", "401", "403", "404", "405", "413", "414", "429", "431"}
LOG_FLUSHED_S = 1.5  # nginx writes its buffered access logs (flush=1s) within this


def ledger(site: LiveSite, since: float) -> list[dict]:
    """Every record the collector wrote since then (kit audit export, read through the engine)."""
    exported = checked(site.kit("audit export", "--since", "1d", "--format", "jsonl"))
    records = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    return [r for r in records if _epoch(r["time"]) >= since - 1]


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def caught_up(site: LiveSite) -> dict:
    """kit status's view of the ledger once the collector has read everything the door wrote
    (nginx flushes its buffer within a second): the report that showed it."""
    seen: list[dict] = []

    def settled() -> bool:
        report = json.loads(checked(site.kit("status", "--json")).stdout)["usage_ledger"]
        seen.append(report)
        return bool(report.get("ok")) and report.get("spool_pending_bytes") == 0

    time.sleep(LOG_FLUSHED_S)
    wait_for("the ledger to catch up with the door", settled, 30)
    return seen[-1]


def quiet_start() -> float:
    """A start time later than every request made so far, for `door_ids` and `ledger`: nginx
    writes its buffered access log within a second (flush=1s) and docker's log is read from the
    start time's whole second (`LiveSite.nginx_log`), so it is taken past the next whole second
    after that flush. A request just before (kit's own probes after `kit keys add`, the knocks
    of `kit status`) is then in neither, where its line, written out after the start, used to
    put its id in `door_ids` while its record, older than a second, was not in `ledger`."""
    time.sleep(LOG_FLUSHED_S)
    time.sleep(1 - time.time() % 1)
    return time.time()


def door_ids(site: LiveSite, since: float, *, alone: bool = True) -> list[str]:
    """The request ids of nginx's own access log (stdout) since then; with `alone`, those the
    ledger records alone: a credential's requests the door did not refuse (the others are
    counted per address and minute, docs/usage.md)."""
    return [request_id for who, status, request_id in LOG_LINE.findall(site.nginx_log(since))
            if not alone or (who != "-" and status not in REFUSALS)]


def requests_of(records: list[dict], ended: str) -> int:
    """How many requests the records hold that ended so (an aggregate holds `requests`)."""
    return sum(r.get("requests", 1) for r in records if r["ended"] == ended)


def ledger_until(site: LiveSite, since: float, condition: Callable[[list[dict]], bool],
                 what: str, timeout: float = 100) -> list[dict]:
    """The ledger once `condition` holds of it (a minute's aggregate is written once the
    minute is over, 5 s after)."""
    found: list[list[dict]] = []

    def holds() -> bool:
        found.append(ledger(site, since))
        return condition(found[-1])

    wait_for(what, holds, timeout)
    return found[-1]


def ledger_with(site: LiveSite, since: float, ids: list[str], timeout: float = 30) -> list[dict]:
    """The ledger once it holds every one of `ids` (nginx flushes its buffers within a second,
    the collector polls its spool: a line logged just now takes a moment), or as it is at the
    timeout — then assert_once names what is missing."""
    deadline = time.monotonic() + timeout
    while True:
        records = ledger(site, since)
        if set(ids) <= {r["request_id"] for r in records} or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def assert_once(records: list[dict], ids: list[str], log: str) -> None:
    """Every request id nginx logged is in the ledger, and no record is there twice (an
    aggregate's request_id is null: there may be several)."""
    counts = Counter(r["request_id"] for r in records if r["request_id"] is not None)
    wrong = [i for i in ids if counts[i] != 1]
    assert not wrong, ([counts[i] for i in wrong],
                       [line for line in log.splitlines() if any(i in line for i in wrong)])
    assert max(counts.values()) == 1
