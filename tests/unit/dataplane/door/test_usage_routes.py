"""The usage ledger's records of `/v1/responses` and `/v1/embeddings` (docs/usage.md), through
the real nginx + njs door and the vLLM stand-in, without Docker: the client gets the engine's
bytes unchanged, and the record carries the engine's own token counts (the Responses API's
`input_tokens` / `output_tokens`, in the body or in the stream's `response.completed` event;
an embedding's prompt tokens).

Two doors: one before a generative stand-in (it has /v1/responses, and its first token comes
300 ms after the request, so the record's TTFT is told from the events before it), one before a
pooling stand-in (`--runner pooling`: it has /v1/embeddings, as vLLM registers that route only
for a pooling model). The stand-in speaks these routes as vLLM 0.33 defines them; it is not
vLLM (tests/standin/vllm_standin/responses.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx2
import openai
import pytest

from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.raw_http import RawReply
from tests.support.raw_http import request as raw_request
from tests.support.sites import base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
FIRST_TOKEN_MS = 300
BUDGETED: dict[Path, str] = {}  # each door's budgeted key, by its work folder
# what differs between two answers to the same request: ids, times, the random text
VARYING = re.compile(rb'("id":"|"item_id":"|"created_at":|"created":|"text":"|"delta":")'
                     rb'[^",}]*')


def a_door(stack: ExitStack, root: Path, *args: str, **env: str) -> tuple[Door, str]:
    """The base site's rendered door before a stand-in started with `args`, and a key (one
    with a token budget too, BUDGETED)."""
    site = base_site(root)
    spec = site / "site.yaml"
    render_site(Site.load(spec))
    charged = run_kit("keys", "add", spec, "charged", "--offline", "--tokens-per-day", "1000000")
    assert charged.exit_code == 0, charged.output
    added = run_kit("keys", "add", spec, "client", "--offline")
    assert added.exit_code == 0, added.output
    (root / "work").mkdir()
    door = stack.enter_context(serving_door(
        site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b", SERVED, HOST,
        standin_args=args, STANDIN_TOKEN_INTERVAL_MS="5", STANDIN_LOAD_SECONDS="0.1", **env))
    BUDGETED[door.work] = charged.output.split("key charged: ")[1].split()[0]
    return door, added.output.split("key client: ")[1].split()[0]


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Door, str]]]:
    with ExitStack() as stack:
        yield {
            "generate": a_door(stack, tmp_path_factory.mktemp("responses"),
                               STANDIN_TTFT_MS=str(FIRST_TOKEN_MS)),
            "pooling": a_door(stack, tmp_path_factory.mktemp("embeddings"),
                              "--runner", "pooling"),
        }


def post(path: str, body: dict, key: str | None, agent: str) -> bytes:
    headers = [("Content-Type", "application/json"), ("User-Agent", agent)]
    if key:
        headers.append(("Authorization", f"Bearer {key}"))
    return raw_request("POST", path, HOST, headers, json.dumps(body).encode())


def same_shape(reply: RawReply) -> bytes:
    return VARYING.sub(rb"\1*", reply.body)


def through_and_direct(door: Door, key: str, path: str, body: dict,
                       agent: str) -> tuple[RawReply, tuple[int, int], dict]:
    """The request through the door (its reply, the engine's prompt and generation counts it
    added, its spool record), then straight to the stand-in: the same bytes, ids and times
    and the random text aside."""
    before = door.settled_counters()
    through = door.exchange(post(path, body, key, agent))
    after = door.settled_counters()
    direct = door.exchange(post(path, body, None, agent), direct=True)
    assert through.status == direct.status == 200, (through.body[:300], direct.body[:300])
    assert same_shape(through) == same_shape(direct)
    record = door.record_of(agent)
    assert (record["who"], record["route"], record["model"], record["end"]) == (
        "key:client", path, SERVED, "completed"), record
    return through, (after[0] - before[0], after[1] - before[1]), record


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_responses_record_holds_the_engines_counts(
        doors: dict[str, tuple[Door, str]], stream: bool) -> None:
    door, key = doors["generate"]
    body = {"model": SERVED, "instructions": "Be brief.", "input": "Say something.",
            "max_output_tokens": 9, "stream": stream}
    reply, counted, record = through_and_direct(door, key, "/v1/responses", body,
                                                f"responses-{stream}")
    assert (int(record["prompt"]), int(record["completion"])) == counted
    assert counted[1] == 9
    if stream:
        events = reply.body.split(b"\n\n")[:-1]
        assert events[-1].startswith(b"event: response.completed\ndata: ")
        usage = json.loads(events[-1].split(b"data: ", 1)[1])["response"]["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == counted
        # the first token, not the response.created event sent at once
        assert FIRST_TOKEN_MS / 1000 <= float(record["ttft"]) <= float(record["duration"])
    else:
        assert json.loads(reply.body)["usage"]["output_tokens"] == 9
        assert record["ttft"] == ""


def test_an_aborted_responses_stream_is_counted_to_within_one_event(
        doors: dict[str, tuple[Door, str]]) -> None:
    """Issue 42: a client that leaves a streamed response after the deltas it wanted. vLLM
    tells a response's usage only in its last event, so the record's completion is the
    `response.output_text.delta` events the door passed on — what the engine generated, within
    one — and its prompt unknown ('')."""
    door, key = doors["generate"]
    before = door.settled_counters()
    body = {"model": SERVED, "input": "Write a long story.", "max_output_tokens": 2000,
            "stream": True}
    seen = door.abort_after(post("/v1/responses", body, key, "responses-abort"), events=20)
    assert seen.count(b"event: response.output_text.delta") >= 10
    after = door.settled_counters()
    record = door.record_of("responses-abort")
    generated = after[1] - before[1]
    assert (record["end"], record["status"], record["prompt"]) == ("client_abort", "200", "")
    assert 15 <= int(record["completion"]) <= generated <= int(record["completion"]) + 1, (
        record, generated)


def test_a_budgeted_credential_streams_no_response(doors: dict[str, tuple[Door, str]]) -> None:
    """A stream left early could not be charged its prompt (vLLM counts it only in the last
    event), so a credential with a budget is refused a streamed /v1/responses, naming why and
    the fix, before anything reaches vLLM; its whole responses are served and counted."""
    door, _ = doors["generate"]
    budgeted = BUDGETED[door.work]
    body = {"model": SERVED, "input": "Hello", "max_output_tokens": 3}
    refused = door.exchange(post("/v1/responses", {**body, "stream": "yes"}, budgeted,
                                 "responses-budget-stream"))
    assert refused.status == 400, refused.body
    error = json.loads(refused.body)["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", "stream")
    assert "token budget" in error["message"] and 'without "stream"' in error["message"]
    whole = door.exchange(post("/v1/responses", body, budgeted, "responses-budget-whole"))
    assert whole.status == 200
    record = door.record_of("responses-budget-whole")
    assert record["completion"] == "3" and int(record["prompt"]) > 0


def test_the_openai_sdk_reads_responses_through_the_door(
        doors: dict[str, tuple[Door, str]]) -> None:
    door, key = doors["generate"]
    with door.inside():
        client = openai.OpenAI(base_url="https://127.0.0.1/v1", api_key=key, max_retries=0,
                               http_client=httpx2.Client(verify=door.tls_context()))
        whole = client.responses.create(model=SERVED, input="Hello", max_output_tokens=5)
        events = list(client.responses.create(model=SERVED, input="Hello",
                                              max_output_tokens=4, stream=True))
    assert whole.usage is not None and whole.usage.output_tokens == 5 and whole.output_text
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens == 4
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_an_embeddings_record_holds_the_prompt_tokens(
        doors: dict[str, tuple[Door, str]]) -> None:
    """The vectors come back byte for byte; the record holds the prompt tokens the engine
    counted and the 0 completion tokens vLLM reports for an embedding."""
    door, key = doors["pooling"]
    body = {"model": SERVED, "input": ["The first text.", "A second, longer text to embed."],
            "encoding_format": "float"}
    reply, counted, record = through_and_direct(door, key, "/v1/embeddings", body, "embed")
    answer = json.loads(reply.body)
    assert len(answer["data"]) == 2 and len(answer["data"][0]["embedding"]) == 4096
    assert len(reply.body) > 4096 * 2  # the usage is read from the end of a long answer
    assert counted[0] > 0 and counted[1] == 0
    assert (int(record["prompt"]), int(record["completion"])) == counted
    assert answer["usage"]["prompt_tokens"] == counted[0]
    with door.inside():
        client = openai.OpenAI(base_url="https://127.0.0.1/v1", api_key=key, max_retries=0,
                               http_client=httpx2.Client(verify=door.tls_context()))
        vectors = client.embeddings.create(model=SERVED, input="The first text.")
    assert vectors.data[0].embedding == pytest.approx(answer["data"][0]["embedding"], abs=1e-6)


def test_a_generative_model_has_no_embeddings_route(
        doors: dict[str, tuple[Door, str]]) -> None:
    """The door passes /v1/embeddings to the model's service; a generative model answers it
    as vLLM does (the route is not registered: FastAPI's 404), and that is recorded."""
    door, key = doors["generate"]
    reply = door.exchange(post("/v1/embeddings", {"model": SERVED, "input": "x"}, key,
                               "embed-generative"))
    assert (reply.status, json.loads(reply.body)) == (404, {"detail": "Not Found"})
    record = door.record_of("embed-generative")
    assert (record["status"], record["prompt"], record["completion"]) == ("404", "", "")
