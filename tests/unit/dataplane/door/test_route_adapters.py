"""LoRA adapters at the real front door (issue 27), nginx + njs as rendered, the vLLM stand-in
behind it (it serves adapters as vLLM 0.33 does: tests/standin/vllm_standin/lora.py), no Docker.

A request naming a declared adapter reaches the adapter's base service like a served name; the
door's /v1/models lists the declared adapters with their parent and not an adapter the engine
holds undeclared; the runtime admin routes (/v1/load_lora_adapter, /v1/unload_lora_adapter)
are a JSON 404 for a Bearer key, a Basic password and no credential, and never reach the
engine, although this engine accepts them (VLLM_ALLOW_RUNTIME_LORA_UPDATING is on).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kit.dataplane.collector import usage_ledger
from kit.layout import USAGE_MODELS_MOUNT
from kit.plan.usage import USAGE_SERVICE
from tests.support import nginx_ns
from tests.support.adapters import adapters_yaml, write_adapter
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.raw_http import request as raw_request
from tests.support.sites import base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
ADMIN_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, dict[str, str]]]:
    root = tmp_path_factory.mktemp("adapters")
    site = base_site(root)
    models = root / "models"
    for name in ("support-v3", "legal", "stray"):
        write_adapter(models / name, base="/data/models/llama-8b", rank=16)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text() + adapters_yaml([{"name": "support-v3", "path": "support-v3"},
                                                      {"name": "legal", "path": "legal"}]))
    rendered = run_kit("render", spec)
    assert rendered.exit_code == 0, rendered.output
    password = re.search(r"password for ops: (\S+)", rendered.output).group(1)
    added = run_kit("keys", "add", spec, "client", "--offline")
    assert added.exit_code == 0, added.output
    key = added.output.split("key client: ")[1].split()[0]
    basic = base64.b64encode(f"ops:{password}".encode()).decode()
    credentials = {"Bearer": f"Bearer {key}", "Basic": f"Basic {basic}", "none": ""}
    # the stand-in as the rendered command starts it, with host paths for /models, and one
    # adapter more than the spec declares
    lora = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "3", "--lora-modules",
            *(f"{name}={models / name}" for name in ("support-v3", "legal", "stray"))]
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], models / "llama-8b", SERVED,
                      HOST, verifier=True, standin_args=tuple(lora),
                      VLLM_ALLOW_RUNTIME_LORA_UPDATING="true", STANDIN_LOAD_SECONDS="0.1",
                      STANDIN_TOKEN_INTERVAL_MS="5") as running:
        yield running, credentials


def send(door: Door, method: str, path: str, credential: str, body: dict | None = None,
         direct: bool = False):
    headers = [("Content-Type", "application/json")]
    if credential:
        headers.append(("Authorization", credential))
    data = json.dumps(body).encode() if body is not None else b""
    return door.exchange(raw_request(method, path, HOST, headers, data), direct=direct)


def test_an_adapter_is_routed_to_its_base_service(door) -> None:
    running, credentials = door
    for model in ("support-v3", "legal", SERVED):
        reply = send(running, "POST", "/v1/chat/completions", credentials["Bearer"],
                     {"model": model, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status == 200, reply.body[:300]
        assert json.loads(reply.body)["model"] == model
    # the engine holds `stray`, but the spec does not declare it: the door does not route it
    reply = send(running, "POST", "/v1/chat/completions", credentials["Bearer"],
                 {"model": "stray", "max_tokens": 2,
                  "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status == 404
    assert json.loads(reply.body)["error"]["message"] == "The model `stray` does not exist."


def test_models_lists_declared_adapters_with_their_parent(door) -> None:
    running, credentials = door
    reply = send(running, "GET", "/v1/models", credentials["Basic"])
    assert reply.status == 200, reply.body[:300]
    listed = {card["id"]: card["parent"] for card in json.loads(reply.body)["data"]}
    assert listed == {SERVED: None, "support-v3": SERVED, "legal": SERVED}
    reply = send(running, "GET", "/v1/models/legal", credentials["Bearer"])
    assert reply.status == 200 and json.loads(reply.body)["parent"] == SERVED


def test_runtime_adapter_routes_are_refused_for_every_credential(door, tmp_path: Path) -> None:
    running, credentials = door
    write_adapter(tmp_path / "evil", base="/data/models/llama-8b", rank=16)
    bodies = {"/v1/load_lora_adapter": {"lora_name": "evil", "lora_path": str(tmp_path / "evil")},
              "/v1/unload_lora_adapter": {"lora_name": "support-v3"}}
    for route in ADMIN_ROUTES:
        for kind, credential in credentials.items():
            reply = send(running, "POST", route, credential, bodies[route])
            assert reply.status == 404, (route, kind, reply.status, reply.body[:300])
            assert reply.headers["content-type"] == "application/json"
            error = json.loads(reply.body)["error"]
            assert list(error) == ["message", "type", "param", "code"]
            assert (error["type"], error["code"]) == ("NotFoundError", 404), (route, kind)
    # the engine behind accepts these routes, and nothing reached it: its adapters are as before
    reply = send(running, "GET", "/v1/models", "", direct=True)
    assert {card["id"] for card in json.loads(reply.body)["data"]} == {
        SERVED, "support-v3", "legal", "stray"}


def test_a_request_for_an_adapter_is_recorded_with_its_name(door) -> None:
    """Issue 43 item 3: the collector was given the served names only, so a request for an
    adapter was recorded with `model: null`. Every name the door routes is a model the ledger
    records: the door's spool line, read by the collector with its rendered --models."""
    running, credentials = door
    headers = [("Content-Type", "application/json"), ("Authorization", credentials["Bearer"]),
               ("User-Agent", "adapter-recorded")]
    body = {"model": "legal", "prompt": "Hello", "max_tokens": 3}
    reply = running.exchange(raw_request("POST", "/v1/completions", HOST, headers,
                                         json.dumps(body).encode()))
    assert reply.status == 200, reply.body
    compose = running.work.parent / "site" / "compose"
    command = yaml.safe_load((compose / "docker-compose.yml").read_text())["services"][
        USAGE_SERVICE]["command"]
    arguments = dict(zip(command[1::2], command[2::2], strict=False))
    models = compose / "usage-models" / Path(arguments["--models-file"]).relative_to(
        USAGE_MODELS_MOUNT)
    checker = usage_ledger.Checker(json.loads(models.read_text()),
                                   json.loads(arguments["--routes"]))
    record, replaced = checker.record(running.record_of("adapter-recorded"))
    assert (record["model"], record["who"], replaced) == ("legal", "key:client", [])
