"""The front door's abuse limits, from the spec's proxy section, against the running nginx.

The limits count per client address, and every request from this host reaches nginx from the
same address, so a test that exhausts one brings up its own site (it would starve the next);
the tests that exhaust none share one, and the wrong-password flood runs last on it.
"""

import contextlib
import json
import time
from collections.abc import Callable, Iterator

import pytest

from kit.front_door.client import basic_header
from tests.support.live_stack import SERVED_NAME, SERVICE, LiveSite, finished, running

pytestmark = pytest.mark.e2e

RATE_PER_MINUTE = 20  # proxy.rate_limit_per_ip (the burst is as large)
FLOOD = 3 * RATE_PER_MINUTE
FAILED_LOGINS_PER_MINUTE = 5  # proxy.failed_logins_per_ip (the burst is as large)
WRONG_PASSWORDS = 20


@pytest.fixture
def make_site(tmp_path, docker_client, test_images) -> Iterator[Callable[..., LiveSite]]:
    """`make_site(**proxy)`: a one-service site with these proxy settings, up."""
    with contextlib.ExitStack() as sites:
        yield lambda **proxy: sites.enter_context(
            running(tmp_path / "site", docker_client, prefix="lim", proxy=proxy))


@pytest.fixture(scope="module")
def shared_site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    """For the tests that exhaust no limit: max_body 2k, a failed-login budget of
    FAILED_LOGINS_PER_MINUTE (none of them sends a wrong password), and, last, for the flood
    of wrong passwords."""
    with running(tmp_path_factory.mktemp("limits") / "site", docker_client, prefix="lim",
                 proxy={"max_body": "2k",
                        "failed_logins_per_ip": FAILED_LOGINS_PER_MINUTE}) as site:
        yield site


def chat_body(size: int) -> dict:
    """A chat request whose JSON (as kit's probe client sends it) is `size` bytes long."""
    body = {"model": SERVED_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": ""}]}
    body["messages"][0]["content"] = "x" * (size - len(json.dumps(body)))
    return body


def test_a_body_above_max_body_gets_413(shared_site: LiveSite) -> None:
    site = shared_site
    ops = site.basic("ops")
    assert site.status("/v1/chat/completions", ops, "POST", chat_body(1900)) == 200
    assert site.status("/v1/chat/completions", ops, "POST", chat_body(2100)) == 413
    assert site.status("/v1/chat/completions", None, "POST", chat_body(4096)) == 413


@pytest.mark.serial  # must outpace the rate limit: a neighbour's load slows the client
def test_a_client_above_its_request_rate_gets_429(make_site) -> None:
    site = make_site(rate_limit_per_ip=RATE_PER_MINUTE)
    started = time.monotonic()
    figures = finished(site.loadgen(site.basic("ops"), streams=FLOOD, tokens=1))
    refilled = int((time.monotonic() - started) * RATE_PER_MINUTE / 60) + 1
    # kit up's gate spent a few of the burst already; what is left of it passes, the rest is 429
    assert 1 <= figures["ok"] <= RATE_PER_MINUTE + refilled, figures
    assert figures["failures"] == {"status 429": FLOOD - figures["ok"]}, figures
    assert site.completion(site.basic("ops")) == 429  # the client is limited, not a credential


def test_valid_logins_do_not_use_the_failed_login_budget(shared_site: LiveSite) -> None:
    """Only failures count: more distinct valid users than the budget all get in at once."""
    site = shared_site
    users = [f"user{n:02d}" for n in range(3 * FAILED_LOGINS_PER_MINUTE)]
    for user in users:  # the files only, then the last one live: one reload and proof for all
        offline = ("--offline",) if user != users[-1] else ()
        added = site.kit("users add", user, "--password-stdin", *offline,
                         stdin=f"pw-of-{user}-long\n")
        assert added.returncode == 0, added.stdout + added.stderr
    time.sleep(1.1)  # `users add` proved the last login: leave that check out of the count
    since = time.time()
    statuses = [site.completion(basic_header(user, f"pw-of-{user}-long")) for user in users]
    time.sleep(1.1)
    assert statuses == [200] * len(users)
    checks = [site.password_checks(since, user) for user in users]
    # one bcrypt check per credential; the last user added may still have the verdict of the
    # login `users add` proved (the others were never proven)
    assert checks[:-1] == [1] * (len(users) - 1) and checks[-1] <= 1, checks


def test_metrics_only_per_service_and_only_with_credentials(shared_site: LiveSite) -> None:
    site = shared_site
    ops = site.basic("ops")
    assert site.status("/metrics") == 404
    assert site.status("/metrics", ops) == 404  # vLLM's own /metrics is not reachable at all
    assert site.status(f"/metrics/{SERVICE}") == 401
    reply = site.gate().fetch("GET", f"/metrics/{SERVICE}", credentials=ops)
    assert reply.status == 200 and b"vllm:num_requests_running" in reply.body


def test_a_wrong_password_flood_is_cut_off_before_bcrypt(shared_site: LiveSite) -> None:
    """Last on the shared site: it leaves this host's address marked, refused before bcrypt
    (the budget refilled since kit up's gate used some: one every 12 s)."""
    site = shared_site
    ops = site.basic("ops")
    assert site.status(credentials=ops) == 200  # verified once: the verdict is cached
    since = time.time()
    statuses = [site.status(credentials=basic_header("ops", f"guess-number-{n:04d}"))
                for n in range(WRONG_PASSWORDS)]
    time.sleep(1.1)  # docker's `since` has 1 s granularity
    checks = site.password_checks(since - 1, "ops")

    # the budget (a burst as large as the rate, less what kit up's gate used) fails with 401;
    # the guess that exceeds it marks the address, and every later guess is refused with 429
    # before bcrypt
    refused = statuses.count(401)
    assert statuses == [401] * refused + [429] * (WRONG_PASSWORDS - refused), statuses
    assert FAILED_LOGINS_PER_MINUTE - 1 <= refused <= FAILED_LOGINS_PER_MINUTE + 1, statuses
    # + the check of the valid password, the guess that exceeded, a refill during the loop
    assert checks <= refused + 3, checks
    assert site.status(credentials=ops) == 200  # a verified credential keeps working
    # the same password in a header never verified before (the verdict cache is keyed by the
    # whole header; nginx reads the scheme case-insensitively) must go to bcrypt: refused too
    assert site.status(credentials=ops.replace("Basic ", "basic ", 1)) == 429


def test_open_files_above_the_engines_limit_fail_up_and_a_smaller_site_reloads_in_place(
    tmp_path, docker_client, test_images, free_port, cleanup_project
) -> None:
    """nginx's workers take worker_rlimit_nofile (2 per connection) themselves; above the
    engine's hard limit for containers the real nginx logs an alert and serves with less:
    kit up fails naming it. Fewer streams then apply by a reload, in the same container."""
    hard = int(docker_client.containers.run(
        test_images["nginx"], ["sh", "-c", "ulimit -Hn"], remove=True).decode())
    # worker_connections = the next power of two of 4 x streams; worker_rlimit_nofile twice that
    seqs = next((n for n in (1024, 2048, 4096, 8192, 16384) if 8 * n > hard), None)
    if seqs is None:
        pytest.skip(f"this engine's containers may open {hard} files: above any site's need")
    site = LiveSite.create(tmp_path / "site", docker_client, free_port(), free_port(),
                           prefix="nof", max_num_seqs=seqs)
    cleanup_project(site.name)
    failed = site.kit("up")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "cannot open the connections the site's streams need" in failed.stderr, failed.stderr
    assert "setrlimit(RLIMIT_NOFILE" in failed.stderr and "default-ulimits" in failed.stderr
    front_door = site.container("nginx").id
    spec = site.spec_path.read_text()
    site.spec_path.write_text(spec.replace(f"max_num_seqs: {seqs}", "max_num_seqs: 64"))
    site.up()
    assert site.container("nginx").id == front_door  # reloaded in place, not recreated
