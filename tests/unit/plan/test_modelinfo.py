"""Model inspection on the published config.json files of real models (tests/data/models)."""

import json
import shutil
import struct
from pathlib import Path

import pytest

from kit.errors import BadInput, ExitCode
from kit.plan.fit import service_capacity
from kit.plan.modelinfo import (
    NO_CHAT_TEMPLATE,
    cache_space_warnings,
    derive_max_model_len,
    find_config,
    inspect_model_dir,
    pooling_architecture,
)
from kit.spec.model import Service
from tests.support.sites import REPO

MODELS = REPO / "tests" / "data" / "models"


def model_copy(tmp_path: Path, name: str) -> Path:
    """A writable copy of a real model's config directory."""
    target = tmp_path / name
    shutil.copytree(MODELS / name, target)
    return target


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: 8-byte header length, JSON header, then the tensor bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))


def add_deployable_files(model_dir: Path) -> None:
    """Tokenizer files and a chat template, as an instruct model ships them."""
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim", "max_len"),
    [
        ("llama-3.1-8b-instruct", 32, 8, 128, 131072),  # llama3 RoPE: already scaled
        ("llama-3.1-70b-instruct", 80, 8, 128, 131072),
        ("qwen2.5-7b-instruct", 28, 4, 128, 32768),
        ("qwen2.5-1.5b-instruct", 28, 2, 128, 32768),
        ("mistral-7b-v0.1", 32, 8, 128, 32768),
        ("gemma-2-9b-it", 42, 8, 256, 8192),
        ("gemma-3-27b-it", 62, 16, 128, 131072),  # nested text_config, class default length
        ("codellama-7b-hf", 32, 32, 128, 16384),
    ],
)
def test_attention_shapes_of_real_configs(name, layers, kv_heads, head_dim, max_len):
    info = inspect_model_dir(MODELS / name)
    assert (info.num_hidden_layers, info.num_key_value_heads, info.head_dim) == (
        layers, kv_heads, head_dim)
    assert info.derived_max_model_len == max_len
    assert not info.is_mla


def test_deepseek_v2_lite_is_mla_with_yarn_length_and_custom_code():
    info = inspect_model_dir(MODELS / "deepseek-v2-lite-chat")
    assert info.is_mla
    assert (info.kv_lora_rank, info.qk_rope_head_dim) == (512, 64)
    # yarn: original_max_position_embeddings 4096 x factor 40, as vLLM derives it
    assert info.derived_max_model_len == 163840
    assert info.requires_trust_remote_code
    assert (info.num_experts, info.num_experts_per_tok) == (64, 6)


@pytest.mark.parametrize(
    ("name", "window", "sliding_layers"),
    [
        ("mistral-7b-v0.1", 4096, 32),  # every layer slides
        ("gemma-2-9b-it", 4096, 21),  # even layers slide
        ("gemma-3-27b-it", 1024, 52),  # 5 of every 6 layers slide
        ("qwen2.5-7b-instruct", None, 0),  # sliding_window set but use_sliding_window false
        ("llama-3.1-8b-instruct", None, 0),
    ],
)
def test_sliding_window_layers(name, window, sliding_layers):
    info = inspect_model_dir(MODELS / name)
    assert (info.sliding_window, info.sliding_window_layers) == (window, sliding_layers)


def test_awq_quantization_is_read():
    info = inspect_model_dir(MODELS / "qwen2.5-7b-instruct-awq")
    assert (info.quantization, info.quantization_bits, info.quantization_group_size) == (
        "awq", 4, 128)
    assert info.torch_dtype == "float16"


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("llama-3.1-8b-instruct", 8.03),
        ("llama-3.1-70b-instruct", 70.55),
        ("qwen2.5-7b-instruct", 7.62),
        ("mistral-7b-v0.1", 7.24),
        ("deepseek-v2-lite-chat", 15.7),
        ("mixtral-8x7b-instruct-v0.1", 46.7),
        ("qwen3-30b-a3b", 30.5),
        ("gemma-2-9b-it", 9.24),
        ("gemma-2-2b-it", 2.61),
        ("gemma-7b", 8.54),
        ("granite-3.1-8b-instruct", 8.17),
        ("phi-2", 2.78),  # two-matrix MLP (fc1, fc2), not gated
        ("phi-4", 14.7),
        ("qwen1.5-moe-a2.7b", 14.3),  # 60 experts + a shared expert of 5632
        ("llama-4-scout-17b-16e-instruct", 109.0),  # 16 experts + one shared, vision tower
        ("kimi-vl-a3b-instruct", 16.4),  # MLA + 64 experts, 2 shared, MoonViT
        ("gpt-oss-20b", 20.9),
        ("mistral-small-3.1-24b-instruct-2503", 24.0),
        ("qwen3-235b-a22b-instruct-2507-fp8", 235.1),  # 128 experts of 1536, 94 layers
        ("qwen2.5-0.5b-instruct", 0.49),  # tied embeddings
    ],
)
def test_parameter_count_matches_published_size(name, published_billions):
    count = inspect_model_dir(MODELS / name).parameter_count
    assert count / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_max_len_rules_follow_vllm():
    base = {"max_position_embeddings": 32768}
    yarn = {"rope_scaling": {"type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 32768}}
    assert derive_max_model_len({**base, **yarn}) == (131072, (
        "rope_scaling.original_max_position_embeddings x rope_scaling.factor 4"))
    linear = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert derive_max_model_len({**base, **linear})[0] == 65536
    longrope = {"rope_scaling": {"type": "longrope", "factor": 32.0}}
    assert derive_max_model_len({**base, **longrope})[0] == 32768
    assert derive_max_model_len({"n_positions": 2048, "max_seq_len": 4096}) == (
        2048, "n_positions")
    assert derive_max_model_len(base, {"model_max_length": 16384})[0] == 16384
    assert derive_max_model_len(base, {"model_max_length": 10**30})[0] == 32768
    assert derive_max_model_len({**base, "model_max_length": 131072})[0] == 131072
    assert derive_max_model_len({"hidden_size": 8}) == (None, None)


def test_safetensors_headers_give_exact_weight_bytes_by_dtype(tmp_path):
    model_dir = model_copy(tmp_path, "llama-3.1-8b-instruct")
    add_deployable_files(model_dir)
    write_safetensors(model_dir / "model-00001-of-00002.safetensors",
                      {"a": ("BF16", [4, 8], 64), "b": ("F32", [4], 16)})
    write_safetensors(model_dir / "model-00002-of-00002.safetensors", {"c": ("BF16", [8], 16)})
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}))
    info = inspect_model_dir(model_dir)
    assert info.weights_bytes == 96
    assert dict(info.weights_bytes_by_dtype) == {"bfloat16": 80, "float32": 16}
    assert info.errors == []
    assert info.has_tokenizer and info.has_chat_template


def test_missing_shard_and_missing_tensor_are_errors(tmp_path):
    model_dir = model_copy(tmp_path, "llama-3.1-8b-instruct")
    add_deployable_files(model_dir)
    write_safetensors(model_dir / "model-00001-of-00002.safetensors", {"a": ("BF16", [4], 8)})
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": first, "lm_head.weight": first, "c": second}}))
    errors = inspect_model_dir(model_dir).errors
    assert any("model-00002-of-00002.safetensors" in e and "missing" in e for e in errors)
    assert any("lacks 1 tensor" in e and "lm_head.weight" in e for e in errors)


def test_truncated_shard_and_lfs_pointer_are_errors(tmp_path):
    model_dir = model_copy(tmp_path, "llama-3.1-8b-instruct")
    add_deployable_files(model_dir)
    write_safetensors(model_dir / "model-00001-of-00002.safetensors", {"a": ("BF16", [64], 128)})
    shard = model_dir / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    (model_dir / "model-00002-of-00002.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 5\n")
    errors = inspect_model_dir(model_dir).errors
    assert any("shorter than its header" in e for e in errors)
    assert any("Git LFS pointer" in e for e in errors)


def test_weights_without_tokenizer_is_an_error_and_no_template_a_loud_warning(tmp_path):
    model_dir = model_copy(tmp_path, "llama-3.1-8b-instruct")
    write_safetensors(model_dir / "model.safetensors", {"a": ("BF16", [4], 8)})
    info = inspect_model_dir(model_dir)
    assert any("no tokenizer files" in e for e in info.errors)
    assert any(w.startswith("NO CHAT TEMPLATE") for w in info.warnings)
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "chat_template.jinja").write_text("{{ messages }}")
    info = inspect_model_dir(model_dir)
    assert info.errors == [] and info.has_chat_template


def test_an_embedding_service_is_not_warned_about_a_chat_template(tmp_path):
    model_dir = model_copy(tmp_path, "llama-3.1-8b-instruct")
    write_safetensors(model_dir / "model.safetensors", {"a": ("BF16", [4], 8)})
    (model_dir / "tokenizer.json").write_text("{}")
    info = inspect_model_dir(model_dir)
    assert NO_CHAT_TEMPLATE in info.warnings

    def warnings(extra_args: list[str]) -> list[str]:
        service = Service(name="m", model="m", gpus=[0], max_model_len=4096,
                          extra_args=extra_args)
        return service_capacity(info, service, 80).warnings

    assert NO_CHAT_TEMPLATE in warnings([])
    assert NO_CHAT_TEMPLATE not in warnings(["--runner", "pooling"])


@pytest.mark.parametrize(("architectures", "pooling"), [
    (["LlamaForCausalLM"], None), (["Qwen2VLForConditionalGeneration"], None),
    (["GPT2LMHeadModel"], None), (["InternVLChatModel"], None), (["ChatGLMModel"], None),
    (["DeepSeekMTPModel"], None), (["BertModel"], "BertModel"),
    (["XLMRobertaModel"], "XLMRobertaModel"), (["MistralModel"], "MistralModel"),
    (["BertForSequenceClassification"], "BertForSequenceClassification"),
])
def test_pooling_architectures_are_told_by_their_class_name(architectures, pooling):
    assert pooling_architecture(tuple(architectures)) == pooling


def test_auto_map_needs_its_python_files(tmp_path):
    model_dir = model_copy(tmp_path, "deepseek-v2-lite-chat")
    add_deployable_files(model_dir)
    write_safetensors(model_dir / "model.safetensors", {"a": ("BF16", [4], 8)})
    errors = inspect_model_dir(model_dir).errors
    assert len(errors) == 2
    assert "auto_map needs configuration_deepseek.py" in errors[0]
    assert "auto_map needs modeling_deepseek.py" in errors[1]
    (model_dir / "configuration_deepseek.py").write_text("")
    (model_dir / "modeling_deepseek.py").write_text("")
    assert inspect_model_dir(model_dir).errors == []


def test_unreadable_file_is_an_error(tmp_path, monkeypatch):
    model_dir = model_copy(tmp_path, "qwen2.5-7b-instruct")
    secret = model_dir / "tokenizer.json"
    secret.write_text("{}")
    real_access = __import__("os").access
    monkeypatch.setattr("kit.plan.modelinfo.os.access",
                        lambda path, mode: Path(path) != secret and real_access(path, mode))
    errors = inspect_model_dir(model_dir).errors
    assert [e for e in errors if "tokenizer.json is not readable" in e]


def test_config_problems_raise_bad_input_naming_the_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist") as missing:
        inspect_model_dir(tmp_path / "nope")
    assert missing.value.exit_code == ExitCode.BAD_INPUT
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput, match="no config.json"):
        inspect_model_dir(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"num_hidden_layers": 2,')
    with pytest.raises(BadInput, match=r"broken/config.json is not valid JSON") as bad:
        inspect_model_dir(broken)
    assert "re-download" in bad.value.fix
    (broken / "config.json").write_text('{"model_type": "bert-ish"}')
    with pytest.raises(BadInput, match="lacks num_hidden_layers, num_attention_heads"):
        inspect_model_dir(broken)


def test_unreadable_config_raises_bad_input(tmp_path, monkeypatch):
    model_dir = model_copy(tmp_path, "qwen2.5-7b-instruct")
    real_read = Path.read_bytes

    def denied(path: Path) -> bytes:
        if path.name == "config.json":
            raise PermissionError(13, "Permission denied")
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(BadInput, match="not readable") as error:
        inspect_model_dir(model_dir)
    assert "chmod a+r" in error.value.fix


def test_find_config_follows_the_hf_cache_layout(tmp_path):
    entry = tmp_path / "models--Qwen--Qwen2.5-7B-Instruct"
    for revision in ("aaa", "bbb"):
        (entry / "snapshots" / revision).mkdir(parents=True)
        shutil.copy(MODELS / "qwen2.5-7b-instruct" / "config.json",
                    entry / "snapshots" / revision / "config.json")
    assert find_config(entry) is None  # two snapshots and no refs/main: ambiguous
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("bbb\n")
    assert find_config(entry) == entry / "snapshots" / "bbb" / "config.json"
    assert inspect_model_dir(entry).path == entry / "snapshots" / "bbb"


def test_cache_space_warning(tmp_path):
    assert cache_space_warnings(tmp_path / "hub", 1024) == []
    warnings = cache_space_warnings(tmp_path / "hub", 10**18)
    assert len(warnings) == 1 and "would fill the disk" in warnings[0]


@pytest.mark.parametrize(
    ("name", "experts_billions", "dense_mlp_width"),
    [
        ("mixtral-8x7b-instruct-v0.1", 45.1, 0),  # every layer routed, no shared expert
        ("qwen1.5-moe-a2.7b", 12.46, 5632),  # the shared expert is not a routed expert
        ("llama-4-scout-17b-16e-instruct", 96.64, 8192),
        ("kimi-vl-a3b-instruct", 14.39, 11264),  # layer 0 is dense (first_k_dense_replace)
        ("llama-3.1-8b-instruct", 0, 14336),
    ],
)
def test_routed_expert_parameters_are_counted_apart(name, experts_billions, dense_mlp_width):
    model = inspect_model_dir(MODELS / name)
    assert model.expert_parameter_count / 1e9 == pytest.approx(experts_billions, abs=0.01)
    assert model.dense_mlp_width == dense_mlp_width


def test_vocabulary_padding_and_vision_parameters():
    granite = inspect_model_dir(MODELS / "granite-3.1-8b-instruct")
    assert granite.vocab_padding_parameters == (49216 - 49155) * 4096  # tied: one matrix
    assert inspect_model_dir(MODELS / "llama-3.1-8b-instruct").vocab_padding_parameters == 0
    assert inspect_model_dir(MODELS / "gemma-3-4b-it").vision_parameter_count > 0.4e9
    assert inspect_model_dir(MODELS / "phi-2").gated_mlp is False
