"""Keep-alive connections to vLLM that went stale never become a client's error.

vLLM (uvicorn) closes an idle keep-alive connection after 5 s; nginx closes its own idle ones
after 4 s and notices a close by the server at once, unless its worker is busy (on a GPU host a
worker blocked in a bcrypt check took 30-68 requests to 502). The tests freeze nginx's workers
(SIGSTOP) while the stand-in closes its idle connections (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, shorter
than nginx's timeout) and the clients' next requests wait in the sockets: when the workers
resume, they take the dead connections from their pool. A request not yet sent is retried on a
new connection; a stream whose answer had begun is never sent twice.
"""

import os
import re
import secrets
import signal
import time
from collections.abc import Iterator

import pytest

from tests.support.live_stack import SERVICE, LiveSite, finished, nginx_workers, running

pytestmark = pytest.mark.e2e

STREAMS = 48
IDLE_CLOSE_S = 1.0  # the stand-in's keep-alive timeout (nginx keeps idle ones 4 s)
PAUSE_S = 0.3  # each client's second request comes this long after its first ended
FROZEN_S = 2.0  # the workers stay stopped past the stand-in's close of the idle connections
RETRIED = re.compile(r"urt=[\d.]+, [\d.]+")  # two upstream attempts in one access-log line


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    """A site, up, whose stand-in closes an idle keep-alive connection after IDLE_CLOSE_S;
    shared by the module's tests in file order: the frozen-nginx runs (the one without retries
    puts nginx.conf back), then, last, the one that kills vLLM."""
    with running(tmp_path_factory.mktemp("ka") / "site", docker_client, prefix="ka",
                 env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(IDLE_CLOSE_S)}) as site:
        yield site


def frozen_nginx_run(site: LiveSite) -> tuple[dict, str]:
    """Every client sends a request, then a second one while nginx's workers are stopped and
    the stand-in closes the upstream connections they would reuse; (figures, nginx's log)."""
    since = time.time()
    # Bearer: the check costs nothing, only the upstream matters
    key = site.add_key(f"ka-{secrets.token_hex(2)}")
    load = site.loadgen(f"Bearer {key}", streams=STREAMS, tokens=4, requests=2, pause=PAUSE_S,
                        announce=True)
    workers = [int(pid) for pid in nginx_workers(site.nginx)]
    while (line := load.stderr.readline()) not in ("between\n", ""):
        assert line == "streaming\n", line
    assert line, f"the first requests did not end: {load.communicate()}"
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_S)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    figures = finished(load)
    time.sleep(1.1)  # the access log is buffered for up to 1 s
    return figures, site.nginx_log(since - 1)


def test_requests_on_connections_vllm_closed_are_retried_not_502(site: LiveSite) -> None:
    figures, log = frozen_nginx_run(site)
    assert figures["failures"] == {} and figures["ok"] == 2 * STREAMS, figures
    # the situation did arise: requests met a dead connection and nginx sent them again
    assert RETRIED.search(log), "no request reused a closed connection: the test proves nothing"


def test_the_same_run_without_retries_gives_502(site: LiveSite) -> None:
    """The harness can fail: with nginx's retry switched off, the same run meets 502s."""
    rendered = site.layout.nginx_conf.read_text()
    try:
        site.load_nginx_conf(site.nginx_conf_with(
            ("proxy_next_upstream error non_idempotent;", "proxy_next_upstream off;"),
            # nginx's own 502, not the JSON 503 kit answers when no replica can take a request
            ("error_page 502 504 = @kit_unavailable;", "")))
        figures, _ = frozen_nginx_run(site)
    finally:
        site.load_nginx_conf(rendered)
    assert figures["failures"].get("status 502", 0) > 0, figures


def test_a_stream_cut_after_it_began_is_not_sent_again(site: LiveSite) -> None:
    """Last of the module: it leaves the site without its vLLM."""
    time.sleep(1.1)  # leave the earlier requests out of the logs read below
    since = time.time()
    load = site.loadgen(site.basic("ops"), streams=1, tokens=400, announce=True)
    assert load.stderr.readline() == "streaming\n"
    site.container(SERVICE).kill()  # vLLM dies under a running stream
    figures = finished(load)
    time.sleep(1.1)
    assert figures["ok"] == 0 and figures["failed"] == 1, figures
    streams = [line for line in site.nginx_log(since).splitlines()
               if '"POST /v1/chat/completions' in line and " user:ops " in line]
    assert len(streams) == 1 and not RETRIED.search(streams[0]), streams
    served = site.container(SERVICE).logs(since=int(since)).decode(errors="replace")
    assert served.count('"POST /v1/chat/completions') == 1  # vLLM saw it once
