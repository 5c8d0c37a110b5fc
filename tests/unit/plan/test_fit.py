"""`kit plan`: the stand-alone form other tools call, and the per-service spec form."""

import json
import re
import shutil
from pathlib import Path

import pytest

from kit.errors import ExitCode
from tests.support.cli import run_kit
from tests.support.sites import REPO

MODELS = REPO / "tests" / "data" / "models"
LLAMA = MODELS / "llama-3.1-8b-instruct"


def run(*args: str):
    return run_kit("plan", *args)


@pytest.fixture
def no_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi that answers the query the way a two-GPU H100 host does."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho '0, 81559, NVIDIA H100 80GB HBM3'\n"
                    "echo '1, 81559, NVIDIA H100 80GB HBM3'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")


def test_standalone_json_has_the_stable_keys():
    result = run("--model-dir", str(LLAMA), "--gpu-memory-gib", "80", "--tensor-parallel", "1",
                 "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["kv_bytes_per_token"] == 131072
    assert report["weights_gib"] == pytest.approx(14.96, abs=0.01)
    assert report["kv_cache_tokens"] > 0 and report["max_concurrency"] > 1
    assert report["recommended_max_num_seqs"] >= 1
    assert report["errors"] == []
    assert isinstance(report["warnings"], list)


def test_standalone_flags_reach_the_plan():
    result = run("--model-dir", str(LLAMA), "--gpu-memory-gib", "80", "--tensor-parallel", "2",
                 "--kv-cache-dtype", "fp8", "--weights-gib", "20", "--max-model-len", "4096",
                 "--max-num-seqs", "32", "--max-num-batched-tokens", "4096", "--json")
    report = json.loads(result.output)
    assert report["kv_bytes_per_token"] == 32 * 2 * 4 * 128 * 1
    assert report["weights_gib"] == 10.0
    assert report["weights_source"] == "given (--weights-gib)"
    assert (report["max_num_seqs"], report["max_num_batched_tokens"]) == (32, 4096)
    assert report["gpu_memory_utilization"] == 0.92  # vLLM 0.33's default


def test_a_plan_that_cannot_start_prints_it_and_exits_2():
    result = run("--model-dir", str(MODELS / "llama-3.1-70b-instruct"), "--gpu-memory-gib", "80",
                 "--max-model-len", "8192", "--json")
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "weights need" in json.loads(result.output)["errors"][0]


def test_text_table():
    result = run("--model-dir", str(MODELS / "mistral-7b-v0.1"), "--gpu-memory-gib", "24",
                 "--max-model-len", "32768")
    assert result.exit_code == 0
    for label in ("budget", "weights", "overhead", "KV cache", "max_model_len", "concurrency",
                  "max_num_seqs"):
        assert f"  {label} " in result.output
    assert "sliding window" in result.output
    for term in ("budget", "weights", "activation peak", "non-torch memory", "CUDA graphs",
                 "KV cache"):
        assert re.search(rf"^    {term} +[0-9.]+ GiB  .*; changed by ", result.output, re.M), term


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--tensor-parallel", "0"], "--tensor-parallel"),
        (["--gpu-memory-gib", "-1"], "--gpu-memory-gib"),
        (["--kv-cache-dtype", "int8"], "--kv-cache-dtype"),
        (["--max-model-len", "lots"], "--max-model-len"),
    ],
)
def test_bad_numbers_are_usage_errors(args, needle):
    result = run_kit("plan", "--model-dir", str(LLAMA), "--gpu-memory-gib", "80", *args)
    assert result.exit_code == 2
    assert needle in result.output


def test_missing_model_dir_is_a_usage_error(tmp_path):
    result = run_kit("plan", "--model-dir", str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_dir_without_config_is_bad_input(tmp_path):
    result = run("--model-dir", str(tmp_path), "--gpu-memory-gib", "80")
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "no config.json" in result.output


def test_gpu_size_is_required_without_nvidia_smi(no_nvidia_smi):
    result = run("--model-dir", str(LLAMA), "--max-model-len", "8192")
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "nvidia-smi is not on PATH" in result.output
    assert "fix: pass --gpu-memory-gib" in result.output


def test_gpu_size_comes_from_nvidia_smi(fake_nvidia_smi):
    report = json.loads(run("--model-dir", str(LLAMA), "--max-model-len", "8192", "--json").output)
    assert report["gpu_memory_gib"] == pytest.approx(81559 / 1024)
    assert report["max_num_seqs"] == 1024  # H100 default, chosen from the reported name


def test_spec_and_model_dir_together_is_a_usage_error(tmp_path):
    result = run_kit("plan", str(tmp_path / "site.yaml"), "--model-dir", str(LLAMA))
    assert result.exit_code == 2
    assert "either SPEC or --model-dir" in result.output


SPEC = """\
site: lab
domain: llm.example.com
models_root: {models}
gpu_memory_gib: {{0: 80, 1: 80, 2: 24}}
services:
  - name: chat
    model: llama
    gpus: [0, 1]
    max_model_len: 32768
  - name: small
    model: qwen
    gpus: [2]
    max_model_len: 32768
    max_num_seqs: 64
  - name: hub
    model: Qwen/Qwen2.5-7B-Instruct
    gpus: [3]
  - name: spare
    model: qwen
    gpus: [4]
"""


def write_spec(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    shutil.copytree(LLAMA, models / "llama")
    shutil.copytree(MODELS / "qwen2.5-7b-instruct", models / "qwen")
    spec = tmp_path / "site.yaml"
    spec.write_text(SPEC.format(models=models))
    return spec


def test_spec_form_plans_every_local_service(tmp_path, no_nvidia_smi):
    result = run(str(write_spec(tmp_path)))
    assert result.exit_code == 0, result.output
    chat, small, hub, spare = result.output.split("\nservice ")
    assert "tensor_parallel 2" in chat and "64 KiB per token per GPU" in chat
    assert "max_num_seqs   auto -> " in chat
    assert "64 (set); recommended" in small
    assert "not planned" in hub and "Hugging Face id" in hub
    assert "not planned: GPU memory unknown" in spare  # no size for GPU 4, no nvidia-smi


def test_spec_form_json_and_failure_exit(tmp_path, no_nvidia_smi):
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("max_model_len: 32768\n    max_num_seqs",
                                             "max_model_len: 32768\n    "
                                             "gpu_memory_utilization: 0.7\n    max_num_seqs"))
    result = run(str(spec), "--json")
    assert result.exit_code == ExitCode.BAD_INPUT
    services = json.loads(result.output)["services"]
    assert services["chat"]["planned"] and services["chat"]["errors"] == []
    assert services["chat"]["kv_bytes_per_token"] == 65536
    assert any("max_model_len 32768 needs" in e for e in services["small"]["errors"])
    assert services["small"]["max_num_seqs"] == 64
    assert services["hub"] == {"planned": False, "reason": services["hub"]["reason"],
                               "api_servers": {"count": 1, "reason": "auto: the host's cores "
                                               "are not declared (cpus: in the spec)"}}


def test_standalone_flags_are_refused_in_the_spec_form(tmp_path):
    result = run_kit("plan", str(write_spec(tmp_path)), "--gpu-memory-gib", "40")
    assert result.exit_code == 2
    assert "--gpu-memory-gib apply to --model-dir only" in result.output


def test_hub_models_report_the_free_hf_cache(tmp_path, no_nvidia_smi):
    spec = write_spec(tmp_path)
    (tmp_path / "hf").mkdir()
    spec.write_text(spec.read_text().replace("gpu_memory_gib:", f"hf_cache: {tmp_path / 'hf'}\n"
                                             "gpu_memory_gib:"))
    hub = json.loads(run(str(spec), "--json").output)["services"]["hub"]
    assert f"GiB free in hf_cache {tmp_path / 'hf'}" in hub["reason"]


def test_hf_cache_without_room_for_the_weights_warns(tmp_path, monkeypatch):
    model_dir = tmp_path / "llama"
    shutil.copytree(LLAMA, model_dir)
    (model_dir / "tokenizer.json").write_text("{}")
    header = b'{"w": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}}'
    (model_dir / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header
                                                  + bytes(16))
    monkeypatch.setattr("kit.plan.modelinfo.free_disk_gib", lambda path: 0.0)
    report = json.loads(run("--model-dir", str(model_dir), "--gpu-memory-gib", "80",
                            "--max-model-len", "8192", "--hf-cache", str(tmp_path / "hf"),
                            "--json").output)
    assert any("would fill the disk" in w for w in report["warnings"])
    assert report["weights_source"] == "safetensors headers"


@pytest.mark.parametrize(
    ("extra_args", "expert_parallel", "batched", "expert_gpus"),
    [
        (["-ep", "--max-num-batched-tokens", "4096"], True, 4096, 2),
        (["--enable-expert-parallel", "--disable-expert-parallel"], False, None, None),
        (["--max-num-batched-tokens=8192"], False, 8192, None),
        (["--enable-expert-parallel", "--data-parallel-size", "2"], True, None, 4),
    ],
)
def test_extra_args_that_change_the_memory_account_reach_it(extra_args, expert_parallel, batched,
                                                            expert_gpus):
    from kit.plan.fit import service_capacity
    from kit.plan.modelinfo import inspect_model_dir
    from kit.spec.model import Service

    service = Service(name="moe", model="qwen3-30b-a3b", gpus=[0, 1], max_model_len=8192,
                      extra_args=extra_args)
    report = service_capacity(inspect_model_dir(MODELS / "qwen3-30b-a3b"), service, 80)
    assert report.expert_parallel is expert_parallel
    if batched is not None:
        assert report.max_num_batched_tokens == batched
    if expert_gpus is not None:
        assert f"over {expert_gpus} expert-parallel GPU(s)" in report.terms[1].rule


def test_standalone_expert_parallel_data_parallel_and_gpu_name_reach_the_plan():
    args = ("--model-dir", str(MODELS / "qwen3-30b-a3b"), "--gpu-memory-gib", "44.42",
            "--tensor-parallel", "2", "--max-model-len", "8192", "--json")
    plain = json.loads(run(*args).output)
    report = json.loads(run(*args, "--expert-parallel", "--data-parallel-size", "2",
                            "--gpu-name", "NVIDIA L40S").output)
    assert report["expert_parallel"] is True and plain["expert_parallel"] is False
    assert report["weights_gib"] < plain["weights_gib"]  # 32 of 128 experts per GPU, not 64
    assert set(report) == set(plain)  # the terms explain; the keys stay
    terms = {term["name"]: term for term in report["terms"]}
    assert terms["non-torch memory"]["gib"] == 0.25
    assert "NVIDIA L40S: no NVSwitch" in terms["non-torch memory"]["rule"]
    assert "TP x data_parallel 2" in terms["weights"]["rule"]


def test_a_named_gpu_wins_over_nvidia_smis_name(fake_nvidia_smi):
    report = json.loads(run("--model-dir", str(LLAMA), "--tensor-parallel", "2",
                            "--gpu-name", "NVIDIA H100 PCIe", "--max-model-len", "8192",
                            "--json").output)
    assert report["gpu_memory_gib"] == pytest.approx(81559 / 1024)
    assert next(t["gib"] for t in report["terms"] if t["name"] == "non-torch memory") == 0.25
