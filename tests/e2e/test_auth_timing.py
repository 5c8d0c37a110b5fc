"""An unknown Basic name costs what a known one does, through the real front door (issue 22/3).

Before: 4.5–9 ms to refuse an unknown name, 187–260 ms a known one with a wrong password (bcrypt
ran only for known names), so timing listed the users. Now the verifier checks an unknown name
against a dummy hash of the same cost. Measured here as an attacker would: 20 interleaved pairs
(unknown name, known name + wrong password), each credential new, so no cached verdict makes an
attempt cheap; the order inside a pair alternates and a few warm-up pairs are dropped, so drift
on a busy machine falls on both sides alike. The medians must be within 10 %.
"""

import secrets
import statistics
from collections.abc import Iterator

import pytest

from kit.front_door.client import basic_header
from tests.support.live_stack import LiveSite, running

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # medians within 10 %: alone (docs/testing.md)

PAIRS = 20
WARM_UP = 3


@pytest.fixture
def site(tmp_path, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path / "site", docker_client, prefix="tim",
                 proxy={"failed_logins_per_ip": 10000}) as site:
        yield site


def refusal_ms(site: LiveSite, user: str) -> float:
    """One login with a password never sent before (a new verdict: the verifier runs)."""
    reply = site.gate().fetch("GET", "/v1/models",
                              credentials=basic_header(user, secrets.token_urlsafe(16)))
    assert reply.status == 401, reply.body
    return reply.latency_ms


def test_an_unknown_name_takes_as_long_as_a_known_one(site: LiveSite) -> None:
    known: list[float] = []
    unknown: list[float] = []
    for pair in range(WARM_UP + PAIRS):
        stranger = f"nobody{secrets.token_hex(4)}"
        order = [("ops", known), (stranger, unknown)]
        for user, times in order if pair % 2 else reversed(order):
            elapsed = refusal_ms(site, user)
            if pair >= WARM_UP:
                times.append(elapsed)
    known_ms, unknown_ms = statistics.median(known), statistics.median(unknown)
    print(f"median refusal: known name {known_ms:.0f} ms, unknown name {unknown_ms:.0f} ms "
          f"({PAIRS} pairs; ratio {unknown_ms / known_ms:.3f})")
    assert known_ms > 20, "a known name with a wrong password runs bcrypt"
    assert abs(unknown_ms - known_ms) <= 0.10 * known_ms
