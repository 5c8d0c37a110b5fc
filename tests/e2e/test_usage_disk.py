"""The usage ledger on a full disk, on a real stack (docs/usage.md, issue 24's durability): the
ledger's and the spool's volumes are created before `kit up` as kit would create them, but on
small tmpfs filesystems, and filled to the last byte from inside the collector's container.

- The ledger's disk full: the door serves every stream; `kit status` says the disk is full,
  since when, that the records wait in the spool and what to do; once there is room again the
  collector catches up by itself and every request nginx logged is in the ledger once, none
  lost.
- The spool's disk full: nginx cannot write its records (they are gone), the door still serves
  every stream; `kit status` says the spool's disk is full while it is, and once later records
  arrive the loss is counted exactly (the door's sequence numbers never seen) and shown.

First, while the disks have room, one streamed `/v1/responses` through the whole stack is
recorded with the usage of its `response.completed` event.

The engine is the vLLM stand-in (tests/standin).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from kit.plan.usage import (
    COLLECTOR_SPOOL_MOUNT,
    DOOR_SPOOL_MOUNT,
    LEDGER_MOUNT,
    LEDGER_VOLUME,
    SPOOL_FILE,
    SPOOL_VOLUME,
)
from tests.support.live_stack import (
    SERVED_NAME,
    LiveSite,
    checked,
    fill_disk,
    finished,
    free_disk,
    running,
    wait_for,
)
from tests.support.usage_stack import (
    assert_once,
    caught_up,
    door_ids,
    ledger,
    ledger_with,
    quiet_start,
)

pytestmark = pytest.mark.e2e

STREAMS, REQUESTS, TOKENS = 8, 4, 20
# usage.lost_after_seconds: a missing door record counts as lost this long after later ones
# arrived with the collector caught up (the collector's default is 30 s, which the spool's
# test waited out; nginx writes its buffers each second, so 10 s still separates a lost
# record from a late one)
LOST_AFTER_S = 10


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path_factory.mktemp("usage-disk") / "site", docker_client, prefix="dsk",
                 env={"STANDIN_TOKEN_INTERVAL_MS": "5"},
                 small_volumes={LEDGER_VOLUME: "4m", SPOOL_VOLUME: "4m"},
                 usage={"lost_after_seconds": LOST_AFTER_S}) as live:
        yield live


def ledger_report(site: LiveSite) -> dict:
    return json.loads(checked(site.kit("status", "--json")).stdout)["usage_ledger"]


def status_until(site: LiveSite, what: str, condition, timeout: float) -> dict:
    """kit status's view of the ledger once `condition` holds for it (that report)."""
    seen: list[dict] = []

    def holds() -> bool:
        seen.append(ledger_report(site))
        return bool(condition(seen[-1]))

    wait_for(what, holds, timeout)
    return seen[-1]


def served(site: LiveSite, key: str, requests: int = REQUESTS) -> int:
    """Streams through the door: every one must complete. How many."""
    batch = finished(site.loadgen(f"Bearer {key}", streams=STREAMS, tokens=TOKENS,
                                  requests=requests))
    assert batch["failed"] == 0 and batch["ok"] == STREAMS * requests, batch
    return batch["ok"]


def test_a_responses_stream_is_recorded_with_the_engines_counts(site: LiveSite) -> None:
    """Before the disks fill (the stack is up anyway): a streamed /v1/responses through the
    whole stack, read by the OpenAI SDK, is in the ledger with the usage of its
    `response.completed` event."""
    key = site.add_key("responses")
    started = time.time()
    events = list(site.openai(key).responses.create(
        model=SERVED_NAME, input="Say something.", max_output_tokens=7, stream=True))
    usage = events[-1].response.usage
    assert events[-1].type == "response.completed" and usage.output_tokens == 7
    caught_up(site)
    mine = [r for r in ledger(site, started)
            if r["who"] == "key:responses" and r["route"] == "/v1/responses"]
    assert [(r["prompt_tokens"], r["completion_tokens"], r["ended"]) for r in mine] == [
        (usage.input_tokens, usage.output_tokens, "completed")], mine


def test_a_full_ledger_disk_keeps_the_door_serving_and_loses_nothing(site: LiveSite) -> None:
    key = site.add_key("ledgerfull")
    caught_up(site)
    collector = site.container("usage-ledger")
    started = quiet_start()  # then the disk filled right before the requests, not seconds before
    assert fill_disk(collector, LEDGER_MOUNT) == 0
    try:
        streams = served(site, key)
        full = status_until(site, "kit status to show the ledger's full disk",
                            lambda r: r["disk_full_since"] and r["spool_pending_bytes"], 30)
        assert not full["ok"] and full["records"] is not None
        text = checked(site.kit("status")).stdout
        assert "usage ledger: PROBLEM" in text and "DISK FULL since" in text, text
        assert "none lost" in text and "catches up by itself" in text, text
        assert "records LOST" not in text, text
        print("while full:", *[line for line in text.splitlines() if "usage" in line
                               or "DISK" in line or "disk" in line], sep="\n  ")
    finally:
        free_disk(collector, LEDGER_MOUNT)
    # the collector retries with a growing pause (--retry-max 30 s): within a minute of room
    status_until(site, "the collector to find room again", lambda r: not r["disk_full_since"],
                 60)
    time.sleep(1.5)
    ids = door_ids(site, started)
    report = caught_up(site)
    assert report["lost"] == 0 and report["unreadable_lines"] == 0, report
    assert any("nothing was lost" in problem for problem in report["problems"]), report
    records = ledger_with(site, started, ids)
    assert_once(records, ids, site.nginx_log(started))
    mine = [r for r in records if r["who"] == "key:ledgerfull"]
    assert len(mine) == streams and all(r["completion_tokens"] == TOKENS for r in mine)
    verify = site.kit("audit verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print(f"{streams} streams served with the ledger's disk full, {len(ids)} requests logged, "
          f"each in the ledger once after the disk had room; lost {report['lost']}")


def test_a_full_spool_disk_keeps_the_door_serving_and_counts_the_loss(site: LiveSite) -> None:
    key = site.add_key("spoolfull")
    caught_up(site)
    time.sleep(1.5)  # nginx's buffer of spool lines is written out (flush=1s)
    before = caught_up(site)
    collector = site.container("usage-ledger")
    started = quiet_start()  # then the disk filled right before the requests, not seconds before
    assert fill_disk(collector, COLLECTOR_SPOOL_MOUNT) == 0
    try:
        streams = served(site, key)
        time.sleep(1.5)  # nginx tries to write its buffer
        full = status_until(site, "kit status to show the spool's full disk",
                            lambda r: any("spool's disk is full" in p for p in r["problems"]),
                            30)
        assert not full["ok"], full
        text = checked(site.kit("status")).stdout
        assert "usage ledger: PROBLEM" in text and "the spool's disk is full" in text, text
        print("while full:", *[line for line in text.splitlines() if "usage" in line
                               or "spool" in line], sep="\n  ")
    finally:
        free_disk(collector, COLLECTOR_SPOOL_MOUNT)
    # nginx's report of the full disk: its write fails (ENOSPC), or is cut short when the spool
    # file's last page (tmpfs: 4 KiB) still had room past its end, as it has unless the
    # collector had just given the file back
    log = site.nginx_log(started)
    cut_short = f'write() to "{DOOR_SPOOL_MOUNT}/{SPOOL_FILE}" was incomplete'
    assert "No space left on device" in log or cut_short in log, log
    served(site, key, requests=1)  # later records: the gaps before them are seen
    time.sleep(1.5)
    ids = door_ids(site, started)
    aggregated = len(door_ids(site, started, alone=False)) - len(ids)  # kit status's knocks
    caught_up(site)
    recorded = {r["request_id"] for r in ledger(site, started)}
    missing = [i for i in ids if i not in recorded]
    assert missing, "the full spool lost nothing: the test did not fill it"
    # a gap is declared lost after LOST_AFTER_S (--grace) with the collector caught up; exact
    # for the requests recorded alone, and the knocks counted per minute may be lost too
    after = status_until(site, "the loss to be counted",
                         lambda r: r["lost"] - before["lost"] >= len(missing), 90)
    assert len(missing) <= after["lost"] - before["lost"] <= len(missing) + aggregated, (
        after, len(missing), aggregated)
    assert after["ok"], after
    text = checked(site.kit("status")).stdout
    assert f"  {after['lost']:,} records LOST: " in text, text
    print(f"{streams} streams served with the spool's disk full: {len(missing)} of {len(ids)} "
          f"logged requests never reached the spool, {after['lost'] - before['lost']} counted "
          f"lost ({after['unreadable_lines'] - before['unreadable_lines']} line(s) cut short "
          "by the full disk counted unreadable)")
    print(*[line for line in text.splitlines() if "usage" in line or "LOST" in line],
          sep="\n  ")
