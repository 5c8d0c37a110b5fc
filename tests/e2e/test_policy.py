"""Per-credential policy on a live site (docs/policy.md): under 64 streams of another key, a
revocation and an expiry each refuse their key within 1 s (of the command returning, of the
expiry instant), and none of the other key's streams is dropped; a daily token budget under 8
streams stops at the request that crosses it, the ledger agreeing; `kit bench --mix` on a
small service with the priority scheduler."""

import datetime as dt
import json
import re
import time
from collections.abc import Iterator

import pytest

from tests.support.budget_load import crossing, spend_until_refused
from tests.support.docker_engine import pick_free_port, remove_project
from tests.support.live_stack import SERVED_NAME, LiveSite, checked, finished, kit, running

pytestmark = pytest.mark.e2e

STREAMS = 64
# each stream lasts about 50 s: both changes happen inside (the revocation's few seconds, then
# the expiry 30 s after `kit keys set` started: about 35 s in, refused within 1 s; 70 s streams
# before 6 Dec only waited longer for the same events)
TOKENS = 1000
TOKEN_INTERVAL_MS = 50
WITHIN_S = 1.0
EXPIRES_IN_S = 30  # after `kit keys set` starts: it reloads and proves (12-15 s under this load)


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path_factory.mktemp("policy") / "site", docker_client, prefix="policy",
                 env={"STANDIN_TOKEN_INTERVAL_MS": str(TOKEN_INTERVAL_MS)}) as site:
        yield site


def first_refusal_after(site: LiveSite, credentials: str, since: float) -> float:
    """Seconds from `since` (monotonic) until the door answers 401, asked back to back."""
    while site.status(credentials=credentials) != 401:
        assert time.monotonic() - since < 10, "still let in 10 s on"
    return time.monotonic() - since


def test_revocation_and_expiry_take_effect_within_1s_under_64_streams(site: LiveSite) -> None:
    steady, leaving, contractor = (f"Bearer {site.add_key(name)}"
                                   for name in ("steady", "leaving", "contractor"))
    load = site.loadgen(steady, streams=STREAMS, tokens=TOKENS, announce=True, timeout=170)
    assert load.stderr.readline() == "streaming\n", "the streams did not start"

    revoked = site.kit("keys revoke", "leaving")
    assert revoked.returncode == 0, revoked.stdout + revoked.stderr
    revoked_after = first_refusal_after(site, leaving, time.monotonic())

    expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=EXPIRES_IN_S)
    expiry_at = time.monotonic() + (expires - dt.datetime.now(dt.UTC)).total_seconds()
    set_expiry = site.kit("keys set", "contractor", "--expires", expires.isoformat())
    assert set_expiry.returncode == 0, set_expiry.stdout + set_expiry.stderr
    assert "proven through the front door: the front door with the new policy: 200" in (
        set_expiry.stdout)
    before_expiry = site.status(credentials=contractor)
    assert time.monotonic() < expiry_at, "the change took longer than the expiry was away"

    while time.monotonic() < expiry_at:
        time.sleep(0.02)
    expired_after = first_refusal_after(site, contractor, expiry_at)
    streams_still_running = load.poll() is None
    figures = finished(load, timeout=180)

    print(f"revoked key refused {revoked_after:.3f} s after the command returned; expired key "
          f"refused {expired_after:.3f} s after its expiry; streams: {figures}")
    assert before_expiry == 200
    assert revoked_after < WITHIN_S and expired_after < WITHIN_S
    assert site.status(credentials=steady) == 200
    assert streams_still_running, "the streams ended before the changes did: make them longer"
    assert figures["ok"] == STREAMS, figures
    assert figures["tokens"] == STREAMS * TOKENS


BUDGET = 1000


def ledger_tokens(site: LiveSite, who: str) -> int:
    totals = json.loads(checked(site.kit("usage", "--since", "1d", "--json")).stdout)
    return sum(row["tokens"] for row in totals["rows"] if row.get("who") == who)


def test_a_daily_budget_under_8_streams_stops_at_the_request_that_crosses_it(
        site: LiveSite) -> None:
    """Set live (proven through the door): 8 streams spend the key's 1,000 tokens a day. No
    request that started before the crossing one ended was refused for good (some waited for
    the reservations in flight: 429 RateLimitError, sent again), none that started after was
    admitted; each stream's last refusal is 429 insufficient_quota with Retry-After to 00:00
    UTC; the ledger's total passes the budget by less than one request's reservation (its
    body's bytes + max_tokens)."""
    key = site.add_key("intern")
    budget = site.kit("keys set", "intern", "--tokens-per-day", str(BUDGET))
    assert budget.returncode == 0, budget.stdout + budget.stderr
    assert "proven through the front door" in budget.stdout
    attempts = spend_until_refused(site, key, streams=8, max_tokens=40)
    crossed = crossing(attempts, BUDGET, slack_s=0.1)
    admitted = [a for a in attempts if a.status == 200]
    refused = [a for a in attempts if a.final]
    waited = [a for a in attempts if a.status != 200 and not a.final]
    now = dt.datetime.now(dt.UTC)
    to_midnight = (dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
                   - now).total_seconds()
    spent = sum(a.tokens for a in admitted)
    deadline = time.monotonic() + 20  # the spool is flushed each second, then collected
    while (ledger := ledger_tokens(site, "key:intern")) < spent and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"budget {BUDGET}: {len(admitted)} admitted ({spent} tokens), {len(refused)} refused, "
          f"{len(waited)} sent again after waiting for requests in flight; in flight at the "
          f"crossing {crossed.in_flight_tokens} tokens; ledger {ledger}")
    assert not crossed.admitted_after and not crossed.refused_before, crossed
    assert len(refused) == 8
    assert {(a.status, a.error_type) for a in refused} == {(429, "insufficient_quota")}
    assert all(abs(int(a.retry_after) - to_midnight) <= 5 for a in refused), refused
    assert {(a.status, a.retry_after) for a in waited} <= {(429, "1")}, waited
    assert ledger == spent
    # the SDK's body is at most this long (its JSON without the spaces of json.dumps')
    body = len(json.dumps({"messages": [{"role": "user", "content": "Count to ten."}],
                           "model": SERVED_NAME, "max_tokens": 40, "stream": True,
                           "stream_options": {"include_usage": True}}))
    assert BUDGET <= ledger < BUDGET + body + 40


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, docker_client, test_images) -> Iterator[tuple[LiveSite, dict]]:
    """A service of 8 slots paced like a GPU (300 ms prefill, 40 ms a token), with a batch key:
    `kit up` renders the priority scheduler."""
    site = LiveSite.create(tmp_path_factory.mktemp("mix") / "site", docker_client,
                           pick_free_port(), pick_free_port(), prefix="mix", max_num_seqs=8,
                           env={"STANDIN_TTFT_MS": "300", "STANDIN_TOKEN_INTERVAL_MS": "40"})
    try:
        keys = {}
        for name, options in (("chat", ()), ("nightly", ("--class", "batch"))):
            added = checked(site.kit("keys add", name, "--offline", *options)).stdout
            keys[name] = re.search(r"sk-kit-[A-Za-z0-9_-]+", added).group(0)
        site.up()
        yield site, keys
    finally:
        remove_project(docker_client, site.name)


@pytest.mark.serial  # a TTFT ratio: another module's load would move it (docs/testing.md)
def test_bench_mix_interactive_keeps_its_ttft_and_batch_gets_what_is_left(mixed) -> None:
    """Batch at twice the 8 slots: the door lets 4 in flight (the rest 429, sent again after
    Retry-After), so interactive finds free slots and the engine puts it first. The goal is
    interactive p95 TTFT <= x1.25 idle (x1.02 measured alone on a quiet machine; x1.29-1.54 at
    load average 37-58, hence the serial pass: without the cap and priority it would wait for a
    batch request to finish). Batch keeps >= 80 % of what interactive leaves it."""
    site, keys = mixed
    assert "--scheduling-policy" in site.layout.compose_file.read_text()
    env = {"KIT_BENCH_API_KEY": keys["chat"], "KIT_BENCH_BATCH_KEY": keys["nightly"]}
    result = kit("bench", str(site.spec_path), "--mix", "--mix-seconds", "6", "--mix-rounds", "2",
                 "--interactive-streams", "3", "--input-tokens", "32", "--output-tokens", "16",
                 env=env)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads((site.root / "bench" / "mix.json").read_text())
    assert figures["batch_streams"] == 16 and figures["batch_cap"] == 4
    assert figures["ttft_ratio"] <= 1.25, result.stdout
    assert figures["batch_share"] >= 0.80, result.stdout
    assert figures["batch_mixed"]["refused_429"] > 0
