"""The usage spool survives an nginx killed -9 (docs/usage.md, "Nothing on the hot path"): every
request that ended before the kill has its line, because the door writes each line when its
request ends instead of buffering a second of them. Real nginx + njs and the vLLM stand-in,
without Docker (tests/support/door_ns.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.raw_http import request as raw_request
from tests.support.sites import base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
REQUESTS = 12
# Far below a buffered log's flush=1s, far above what a worker needs to log a finished request.
SETTLE_S = 0.25


@pytest.fixture
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, str]]:
    root = tmp_path_factory.mktemp("spool-kill")
    site = base_site(root)
    spec = site / "site.yaml"
    render_site(Site.load(spec))
    added = run_kit("keys", "add", spec, "killer", "--offline")
    assert added.exit_code == 0, added.output
    key = added.output.split("key killer: ")[1].split()[0]
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b",
                      SERVED, HOST, STANDIN_TOKEN_INTERVAL_MS="2",
                      STANDIN_LOAD_SECONDS="0.1") as running:
        yield running, key


def test_nginx_killed_9_right_after_its_requests_ended_loses_no_line(
        door: tuple[Door, str]) -> None:
    running, key = door
    headers = [("Content-Type", "application/json"), ("Authorization", f"Bearer {key}")]
    for n in range(REQUESTS):
        body = {"model": SERVED, "prompt": f"request {n}", "max_tokens": 4, "stream": n % 2 == 0}
        reply = running.exchange(raw_request("POST", "/v1/completions", HOST, headers,
                                             json.dumps(body).encode()))
        assert reply.status == 200, reply.body
    time.sleep(SETTLE_S)
    pids = [running.master(), *running.workers()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    running.nginx.wait(timeout=10)
    lines = [json.loads(line) for line in running.spool.read_text().splitlines()]
    assert sorted(int(line["seq"]) for line in lines) == list(range(1, REQUESTS + 1)), lines
    assert {line["end"] for line in lines} == {"completed"}
