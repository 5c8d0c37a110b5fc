"""The stand-in serves LoRA adapters as vLLM 0.33 does (vllm_standin/lora.py says which parts
are vLLM's and which the stand-in's own): loaded at start from --lora-modules, served by name,
listed with their parent, loaded and unloaded at runtime only when VLLM_ALLOW_RUNTIME_LORA_UPDATING
is true, in the programmed load time, a bad one refused."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

from tests.support.adapters import write_adapter
from tests.support.standin_process import LLAMA_8B, model_dir, run_standin, serving


def call(port: int, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, body=json.dumps(body) if body is not None else None,
                       headers={"Content-Type": "application/json"})
    reply = connection.getresponse()
    status, data = reply.status, reply.read()
    connection.close()
    return status, data


def chat(port: int, model: str) -> tuple[int, dict]:
    status, data = call(port, "POST", "/v1/chat/completions", {
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    return status, json.loads(data)


def models(port: int) -> dict[str, dict]:
    return {card["id"]: card for card in json.loads(call(port, "GET", "/v1/models")[1])["data"]}


def test_adapters_loaded_at_start_are_models_with_their_parent(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    write_adapter(tmp_path / "support", rank=16)
    with serving(str(model), "--served-model-name", "base", "--max-model-len", "4096",
                 "--enable-lora", "--max-lora-rank", "16", "--lora-modules",
                 f"support={tmp_path / 'support'}") as (port, _):
        listed = models(port)
        assert listed["base"]["parent"] is None and listed["base"]["max_model_len"] == 4096
        assert listed["support"]["parent"] == "base"
        assert listed["support"]["root"] == str(tmp_path / "support")
        assert listed["support"]["max_model_len"] is None  # vLLM's LoRA model card sets none
        status, answer = chat(port, "support")
        assert status == 200 and answer["model"] == "support"
        assert chat(port, "other")[0] == 404
        # without VLLM_ALLOW_RUNTIME_LORA_UPDATING vLLM registers no runtime routes
        assert call(port, "POST", "/v1/load_lora_adapter",
                    {"lora_name": "x", "lora_path": "/x"}) == (404, b'{"detail":"Not Found"}')


def test_runtime_load_and_unload_with_a_programmed_load_time(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    write_adapter(tmp_path / "legal", rank=8)
    write_adapter(tmp_path / "wide", rank=64)
    write_adapter(tmp_path / "cut", rank=8, truncate=True)
    write_adapter(tmp_path / "told", rank=8)
    refuse = tmp_path / "refuse"  # the stand-in's own: this replica told to fail `told`
    refuse.mkdir()
    (refuse / "told").touch()
    with serving(str(model), "--served-model-name", "base", "--max-model-len", "4096",
                 "--enable-lora", "--max-lora-rank", "32",
                 VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", STANDIN_LORA_REFUSE_DIR=str(refuse),
                 STANDIN_LORA_LOAD_SECONDS="0.5") as (port, _):
        start = time.monotonic()
        status, body = call(port, "POST", "/v1/load_lora_adapter",
                            {"lora_name": "legal", "lora_path": str(tmp_path / "legal")})
        took = time.monotonic() - start
        assert (status, body) == (200, b"Success: LoRA adapter 'legal' added successfully.")
        assert took >= 0.5, took
        assert models(port)["legal"]["parent"] == "base"
        assert chat(port, "legal")[0] == 200
        refusals = {
            "wide": (400, "LoRA rank 64 is greater than max_lora_rank 32."),
            "cut": (400, "Loading lora cut failed: Error while deserializing header"),
            "gone": (404, f"Loading lora gone failed: No adapter found for {tmp_path / 'gone'}"),
            "legal": (400, "The lora adapter 'legal' has already been loaded."),
            "told": (400, "Loading lora told failed: CUDA out of memory."),
        }
        for name, (code, message) in refusals.items():
            status, body = call(port, "POST", "/v1/load_lora_adapter",
                                {"lora_name": name, "lora_path": str(tmp_path / name)})
            error = json.loads(body)["error"]
            assert status == code and error["message"].startswith(message), (name, body)
        assert set(models(port)) == {"base", "legal"}
        assert call(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "legal"}) == (
            200, b"Success: LoRA adapter 'legal' removed successfully.")
        assert chat(port, "legal")[0] == 404
        status, body = call(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "legal"})
        assert status == 404 and b"cannot be found" in body


def test_a_bad_adapter_at_start_ends_the_server(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    write_adapter(tmp_path / "wide", rank=64)
    result = run_standin("serve", str(model), "--max-model-len", "4096", "--enable-lora",
                         "--lora-modules", f"wide={tmp_path / 'wide'}")
    assert result.returncode == 1
    assert "ValueError: LoRA rank 64 is greater than max_lora_rank 16." in result.stderr
    result = run_standin("serve", str(model), "--max-model-len", "4096",
                         "--lora-modules", f"wide={tmp_path / 'wide'}")
    assert result.returncode == 1
    assert "LoRA is not enabled. Use --enable-lora to enable LoRA." in result.stderr
