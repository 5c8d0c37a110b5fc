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


def lora_gauge(port: int) -> list[tuple[dict[str, str], float]]:
    """The vllm:lora_requests_info series: (labels, value), as exported."""
    text = call(port, "GET", "/metrics")[1].decode()
    series = []
    for line in text.splitlines():
        if line.startswith("vllm:lora_requests_info{"):
            labels, _, value = line.removeprefix("vllm:lora_requests_info{").rpartition("} ")
            series.append((dict(part.split("=", 1) for part in labels.split('",')), float(value)))
    return [({k: v.strip('"') for k, v in labels.items()}, value) for labels, value in series]


def test_config_file_and_the_lora_gauge_as_vllm_defines_them(tmp_path: Path) -> None:
    """`--config FILE` as vLLM reads it (YAML; a list is `--key item…`; the command line after
    the file, so it wins) loads the adapters; vllm:lora_requests_info names the adapters
    requests run on (labels max_lora, running_lora_adapters, waiting_lora_adapters; the value
    the time it was set, every label set it had kept)."""
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    write_adapter(tmp_path / "support", rank=16)
    config = tmp_path / "adapters.yaml"
    config.write_text(f"max-loras: 3\nmax-model-len: 1024\nlora-modules:\n"
                      f"  - support={tmp_path / 'support'}\n")
    with serving(str(model), "--served-model-name", "base", "--max-model-len", "4096",
                 "--enable-lora", "--max-lora-rank", "16", "--config", str(config),
                 STANDIN_TOKEN_INTERVAL_MS="50") as (port, _):
        assert models(port)["support"]["parent"] == "base"
        assert models(port)["base"]["max_model_len"] == 4096  # the command line wins
        assert lora_gauge(port) == []  # no request yet: no label set
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v1/completions", body=json.dumps(
            {"model": "support", "prompt": "hi", "max_tokens": 40, "stream": True}),
            headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        reply.readline()  # streaming: the request runs
        during = max(lora_gauge(port), key=lambda series: series[1])[0]
        assert during == {"max_lora": "3", "running_lora_adapters": "support",
                          "waiting_lora_adapters": ""}
        reply.read()
        connection.close()
        latest = max(lora_gauge(port), key=lambda series: series[1])
        assert latest[0]["running_lora_adapters"] == "" and latest[1] > time.time() - 60
        assert len(lora_gauge(port)) >= 2  # the earlier label set is still exported


def test_a_config_file_vllm_would_refuse(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    (tmp_path / "options.json").write_text("{}")
    process = run_standin("serve", str(model), "--config", str(tmp_path / "options.json"))
    assert process.returncode == 1
    assert "ValueError: Config file must be of a yaml/yml type. json supplied" in process.stderr
