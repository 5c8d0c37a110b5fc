"""LoRA adapters on the real engine (issue 27, static half): a 2-replica service declaring two
adapters, rendered and started by `kit up`; each adapter answers through the real door, the
door's /v1/models lists them with their parent, `kit status` shows both replicas serving both
(no drift), and the runtime load route is refused at the door.

The replicas are the vLLM stand-in, which serves adapters as vLLM 0.33 does
(tests/standin/vllm_standin/lora.py): loaded at start from the rendered --lora-modules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.adapters import write_adapter
from tests.support.live_stack import SERVED_NAME, SERVICE, LiveSite, checked, running

pytestmark = pytest.mark.e2e

ADAPTERS = ("support-v3", "legal")


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    root = tmp_path_factory.mktemp("adapters") / "site"
    for name in ADAPTERS:
        write_adapter(root / "models" / "adapters" / name, base=SERVICE, rank=8)
    with running(root, docker_client, prefix="lra", overrides={SERVICE: {
            "gpus": [0, 1], "tensor_parallel": 1,
            "adapters": [{"name": name, "path": f"adapters/{name}"} for name in ADAPTERS]}},
    ) as site:
        yield site


def test_adapters_answer_through_the_door_on_every_replica(site: LiveSite) -> None:
    credential = site.basic("ops")
    client = site.openai(site.add_key("adapters"))
    for name in ADAPTERS:
        for _ in range(4):  # least connections spreads them over both replicas
            answer = client.chat.completions.create(
                model=name, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            assert answer.model == name
    listed = {model.id: model.model_extra.get("parent") for model in client.models.list()}
    assert listed == {SERVED_NAME: None, "support-v3": SERVED_NAME, "legal": SERVED_NAME}
    status = json.loads(checked(site.kit("status", "--json")).stdout)
    assert status["adapters"] == [
        {"container": f"{SERVICE}-r{index}", "served": sorted(ADAPTERS), "missing": [],
         "undeclared": []} for index in range(2)]
    refused = site.gate().fetch("POST", "/v1/load_lora_adapter",
                                body={"lora_name": "x", "lora_path": "/models/adapters/legal"},
                                credentials=credential)
    assert refused.status == 404
    assert json.loads(refused.body)["error"]["type"] == "NotFoundError"
