"""Per-credential policy on a live site (docs/policy.md): under 64 streams of another key, a
revocation and an expiry each refuse their key within 1 s (of the command returning, of the
expiry instant), and none of the other key's streams is dropped."""

import datetime as dt
import time
from collections.abc import Iterator

import pytest

from tests.support.live_stack import LiveSite, finished, running

pytestmark = pytest.mark.e2e

STREAMS = 64
TOKENS = 1400
TOKEN_INTERVAL_MS = 50  # each stream lasts about 70 s: both changes happen inside
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
