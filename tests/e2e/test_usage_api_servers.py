"""Two API-server processes on a real stack (docs/capacity.md, "API-server processes"): a site
whose spec sets `api_servers: 2` (this 2-core machine has no cores to spare for `auto`, and kit
up refuses a spec declaring more cores than the engine's host has) gets `--api-server-count 2`
on its one replica, comes up through `kit up` (its gate), and the door asks every stream usage
on every chunk there: an unbudgeted key's aborted stream is recorded with the engine's prompt count
(docs/usage.md, "What the door asks vLLM").

The engine is the vLLM stand-in (tests/standin): it takes `--api-server-count` as vLLM 0.33's
parser does and reports usage as vLLM 0.33 defines `stream_options`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from kit.plan.build import VLLM_PORT
from tests.support.live_stack import SERVED_NAME, LiveSite, checked, edited, read_in
from tests.support.usage_stack import door_ids, ledger_with, quiet_start

pytestmark = pytest.mark.e2e

API_SERVERS = 2
TOKEN_INTERVAL_MS = 10  # as tests/e2e/test_usage.py: a door under load sees an abort in a step


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with edited(tmp_path_factory.mktemp("api-servers") / "site", docker_client,
                lambda spec: spec["services"][0].update(api_servers=API_SERVERS), prefix="asc",
                env={"STANDIN_TOKEN_INTERVAL_MS": str(TOKEN_INTERVAL_MS)}) as live:
        yield live


def engine_counts(site: LiveSite) -> tuple[int, int]:
    """The replica's own prompt and generation token counters (its /metrics, read inside it)."""
    read = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{VLLM_PORT}/metrics', timeout=5).read().decode())")
    text = read_in(site.container("tiny"), ["python3", "-c", read])

    def total(name: str) -> int:
        return int(sum(float(value) for value in re.findall(
            rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)))

    return total("vllm:prompt_tokens_total"), total("vllm:generation_tokens_total")


def test_the_planner_gives_the_replica_two_api_servers(site: LiveSite) -> None:
    argv = site.container("tiny").attrs["Args"]
    assert argv[argv.index("--api-server-count") + 1] == str(API_SERVERS), argv
    planned = checked(site.kit("plan")).stdout
    assert f"api_servers  {API_SERVERS} (set in the spec)" in planned, planned


def test_an_unbudgeted_keys_aborted_stream_is_recorded_with_its_prompt(site: LiveSite) -> None:
    sdk = site.openai(site.add_key("app"))
    story = [{"role": "user", "content": "Write a long story."}]
    story_prompt = sdk.chat.completions.create(model=SERVED_NAME, max_tokens=1,
                                               messages=story).usage.prompt_tokens
    started = quiet_start()
    before = engine_counts(site)
    stream = sdk.chat.completions.create(model=SERVED_NAME, stream=True, max_tokens=400,
                                         messages=story)
    chunks = [chunk for _, chunk in zip(range(3), stream, strict=False)]
    stream.close()
    assert all(chunk.usage is None for chunk in chunks), "the client did not ask for usage"
    time.sleep(1.5)  # the aborted stream's last token reaches the counters, nginx's log flushes
    after = engine_counts(site)
    ids = door_ids(site, started)
    records = ledger_with(site, started, ids)
    (aborted,) = [r for r in records if r["ended"] == "client_abort"]
    assert aborted["who"] == "key:app"
    assert aborted["prompt_tokens"] == story_prompt == after[0] - before[0], (aborted, before,
                                                                              after)
    generated = after[1] - before[1]
    assert 0 <= generated - aborted["completion_tokens"] <= 1, (aborted, generated)
    print(f"aborted unbudgeted stream on 2 API servers: prompt {aborted['prompt_tokens']} "
          f"(engine {after[0] - before[0]}), completion {aborted['completion_tokens']} "
          f"(engine {generated})")
