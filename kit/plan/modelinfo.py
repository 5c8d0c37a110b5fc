"""Inspect a local model directory without loading weights.

Everything vLLM would trip over at start-up (after minutes of loading) is found here in
milliseconds: a config.json it cannot use, shards the index names but the disk lacks, tensors
missing from shard headers, custom code it would need, files it cannot read, no tokenizer, no
chat template. The numbers the capacity planner needs (layers, KV heads, head size, MLA ranks,
sliding windows, quantization, exact weight bytes) are read from the same files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import BadInput

CONFIG_NAME = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit; larger means a broken file
LFS_POINTER_PREFIX = b"version https://git-lfs"

# vLLM's _get_and_verify_max_len: the smallest of these keys is the model's length limit (the
# vLLM stand-in keeps a copy: tests/unit/standin/test_model.py keeps it equal).
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings already includes the extension (vLLM does not scale).
ROPE_TYPES_ALREADY_SCALED = ("su", "longrope", "llama3")

# vLLM pads the vocabulary of the embedding and LM head to a multiple of this.
VOCAB_PADDING = 64
# Model types whose MLP is two matrices (up, down) rather than gated three (gate, up, down).
NON_GATED_MLP_TYPES = frozenset({"phi", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "falcon",
                                 "starcoder2", "opt", "bloom", "mpt"})
# Model types with one always-active shared expert of the routed experts' size per MoE layer.
ONE_SHARED_EXPERT_TYPES = frozenset({"llama4_text", "llama4"})

# Where multimodal / wrapper configs keep the language model's config.
NESTED_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")

# Fields some configs omit because transformers' config class supplies them. Only the ones the
# planner needs, for model types whose published configs really omit them (gemma-3 multimodal).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
    "gemma2": {"tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
}

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
SAFETENSORS_DTYPE_NAMES: dict[Any, str] = {  # looked up with a header's raw value
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0",
    "F4": "float4",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

TOKENIZER_FILE_SETS = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("tiktoken.model",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


@dataclass(frozen=True)
class ModelInfo:
    """What kit knows about a local model directory: shapes for planning plus problems found."""

    path: Path
    architectures: tuple[str, ...]
    model_type: str | None
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int | None
    torch_dtype: str
    derived_max_model_len: int | None
    max_len_source: str | None
    requires_trust_remote_code: bool
    is_mla: bool
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    sliding_window: int | None
    sliding_window_layers: int
    num_experts: int | None
    num_experts_per_tok: int | None
    quantization: str | None
    quantization_bits: int | None
    quantization_group_size: int | None
    parameter_count: int
    embedding_parameter_count: int
    expert_parameter_count: int
    vision_parameter_count: int
    moe_intermediate_size: int | None
    moe_layers: int
    dense_mlp_width: int
    gated_mlp: bool
    vocab_padding_parameters: int
    weights_bytes: int | None
    weights_bytes_by_dtype: Mapping[str, int]
    has_tokenizer: bool
    has_chat_template: bool
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV grows with the whole context."""
        return self.num_hidden_layers - self.sliding_window_layers


def find_config(path: Path) -> Path | None:
    """The config.json vLLM would read for `path`: the directory itself or an HF-cache snapshot.

    An HF cache entry (models--org--name) keeps files under snapshots/<revision>/; refs/main
    names the revision vLLM resolves, so that one wins over other snapshots.
    """
    direct = path / CONFIG_NAME
    if direct.is_file():
        return direct
    snapshots = path / "snapshots"
    if not snapshots.is_dir():
        return None
    main_ref = path / "refs" / "main"
    if main_ref.is_file():
        revision = main_ref.read_text(encoding="utf-8").strip()
        pinned = snapshots / revision / CONFIG_NAME
        if pinned.is_file():
            return pinned
    candidates = sorted(snapshots.glob(f"*/{CONFIG_NAME}"))
    return candidates[0] if len(candidates) == 1 else None


NO_CHAT_TEMPLATE = (
    "NO CHAT TEMPLATE: neither tokenizer_config.json 'chat_template' nor chat_template.jinja "
    "exists, so vLLM falls back to a generic template and /v1/chat/completions answers badly; "
    "use the instruct/chat variant or pass --chat-template"
)
# Architectures vLLM runs as pooling models under `--runner auto`: encoders and bare decoders
# named *Model (BertModel, XLMRobertaModel, MistralModel of e5-mistral), *EmbeddingModel and the
# classification / reward heads. Generative ones end otherwise (…ForCausalLM, …LMHeadModel,
# …ForConditionalGeneration, …ChatModel), but for a few vLLM registers as generative by name,
# and draft models for speculative decoding. Read from the class name, so kit only asks for the
# runner to be written down (`--runner generate` overrides a wrong guess).
GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "ChatModel",
                       "MTPModel", "MedusaModel", "PreTrainedModel")
GENERATIVE_MODEL_NAMES = ("ChatGLMModel", "NVLM_D_Model", "UltravoxModel")
POOLING_SUFFIXES = ("Model", "ForTextEncoding", "ForSequenceClassification",
                    "ForTokenClassification", "ForRewardModeling")


def pooling_architecture(architectures: tuple[str, ...]) -> str | None:
    """The first architecture vLLM would run as a pooling model by default (None: generative)."""
    for name in architectures:
        if name.endswith(POOLING_SUFFIXES) and not name.endswith(GENERATIVE_SUFFIXES) \
                and name not in GENERATIVE_MODEL_NAMES:
            return name
    return None


def inspect_model_dir(path: Path, *, hf_cache_dir: Path | None = None) -> ModelInfo:
    """Read config, weights headers, tokenizer and template files of a local model directory.

    Raises BadInput when there is nothing usable to plan with (no directory, no or broken
    config.json); everything else lands in `errors` (vLLM would fail) or `warnings`.
    """
    if not path.is_dir():
        raise BadInput(
            f"model directory {path} does not exist",
            fix="pass the directory that holds the model's config.json",
        )
    config_path = find_config(path)
    if config_path is None:
        raise BadInput(
            f"no {CONFIG_NAME} in {path}",
            fix="point at the model's directory (the one with config.json and the weights)",
        )
    config = _read_config(config_path)
    model_dir = config_path.parent
    text = _text_config(config)

    warnings: list[str] = []
    errors: list[str] = []
    errors.extend(_unreadable_files(model_dir))

    shapes = _attention_shapes(text, config_path)
    tokenizer_config = _read_optional_json(model_dir / TOKENIZER_CONFIG, errors)
    max_len, max_len_source = derive_max_model_len(text, tokenizer_config)
    if max_len is None:
        warnings.append(
            "config.json names no maximum length (max_position_embeddings or similar); vLLM "
            "assumes 2048 unless max_model_len is set"
        )

    quantization, bits, group_size = _quantization(config, text)
    weights_bytes, by_dtype, weight_errors, weight_warnings = _weights(model_dir)
    errors.extend(weight_errors)
    warnings.extend(weight_warnings)
    has_weights = weights_bytes is not None

    trust_remote_code, missing_code = _custom_code(config, model_dir)
    if has_weights:  # a config-only directory is a planning stub, not a deployable copy
        errors.extend(missing_code)
    if trust_remote_code:
        warnings.append(
            "config.json has auto_map (custom model code): vLLM needs trust_remote_code unless "
            "it implements the architecture itself; review the .py files before trusting them"
        )

    has_tokenizer = any(all((model_dir / name).is_file() for name in names)
                        for names in TOKENIZER_FILE_SETS)
    has_chat_template = _has_chat_template(model_dir, tokenizer_config)
    if not has_weights:
        warnings.append(
            "no weight files (config-only directory): weights are estimated from the config's "
            "parameter count; tokenizer and chat template are not checked"
        )
    else:
        if not has_tokenizer:
            errors.append(
                f"no tokenizer files in {model_dir} (tokenizer.json, tokenizer.model or "
                "vocab.json + merges.txt): vLLM cannot start; copy them from the model repository"
            )
        if not has_chat_template:
            warnings.append(NO_CHAT_TEMPLATE)
    if hf_cache_dir is not None and weights_bytes:
        warnings.extend(cache_space_warnings(hf_cache_dir, weights_bytes))

    return ModelInfo(
        path=model_dir,
        architectures=tuple(config.get("architectures") or ()),
        model_type=text.get("model_type") or config.get("model_type"),
        num_hidden_layers=shapes["layers"],
        num_attention_heads=shapes["heads"],
        num_key_value_heads=shapes["kv_heads"],
        head_dim=shapes["head_dim"],
        hidden_size=shapes["hidden"],
        vocab_size=_first_int(text, "vocab_size", "padded_vocab_size"),
        torch_dtype=_config_dtype(config, text),
        derived_max_model_len=max_len,
        max_len_source=max_len_source,
        requires_trust_remote_code=trust_remote_code,
        is_mla=shapes["kv_lora_rank"] is not None,
        kv_lora_rank=shapes["kv_lora_rank"],
        qk_rope_head_dim=shapes["qk_rope_head_dim"],
        sliding_window=shapes["sliding_window"],
        sliding_window_layers=shapes["sliding_window_layers"],
        num_experts=_num_experts(text),
        num_experts_per_tok=_first_int(text, "num_experts_per_tok", "moe_topk", "top_k"),
        quantization=quantization,
        quantization_bits=bits,
        quantization_group_size=group_size,
        parameter_count=estimate_parameter_count(config),
        embedding_parameter_count=embedding_parameter_count(config),
        expert_parameter_count=expert_parameter_count(config),
        vision_parameter_count=_vision_params(config),
        moe_intermediate_size=_expert_size(text),
        moe_layers=_moe_layer_count(text),
        dense_mlp_width=dense_mlp_width(text),
        gated_mlp=_matrices_per_mlp(text) == 3,
        vocab_padding_parameters=vocab_padding_parameter_count(config),
        weights_bytes=weights_bytes,
        weights_bytes_by_dtype=by_dtype,
        has_tokenizer=has_tokenizer,
        has_chat_template=has_chat_template,
        warnings=warnings,
        errors=errors,
    )


def free_disk_gib(path: Path) -> float:
    """Free space on the file system that holds `path` (or would, once created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / 2**30


def cache_space_warnings(cache_dir: Path, needed_bytes: int) -> list[str]:
    """Warn when the HF cache's disk cannot hold another copy of the weights (a download)."""
    free = free_disk_gib(cache_dir)
    if free * 2**30 >= needed_bytes:
        return []
    return [
        f"only {free:.1f} GiB free under {cache_dir} but the weights are "
        f"{needed_bytes / 2**30:.1f} GiB: a download into the HF cache would fill the disk"
    ]


def derive_max_model_len(
    text: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None = None
) -> tuple[int | None, str | None]:
    """vLLM's derived max_model_len and the key it came from (None when the config has none).

    Mirrors vLLM's _get_and_verify_max_len: smallest of MAX_LEN_KEYS; a config-level
    model_max_length overrides; the tokenizer's model_max_length can only lower it; the RoPE
    factor multiplies it except for su/longrope/llama3 (already scaled) and gemma3 (likewise),
    and yarn scales original_max_position_embeddings instead.
    """
    derived = math.inf
    source: str | None = None
    for key in MAX_LEN_KEYS:
        value = text.get(key)
        if isinstance(value, int | float) and value < derived:
            derived, source = value, key
    config_model_max = text.get("model_max_length")
    if config_model_max:
        derived, source = config_model_max, "model_max_length"
    if tokenizer_config:
        tokenizer_max = tokenizer_config.get("model_max_length")
        if isinstance(tokenizer_max, int | float) and tokenizer_max < derived:
            derived, source = tokenizer_max, "tokenizer_config.json model_max_length"
    if derived == math.inf:
        return None, None
    rope = _rope_scaling(text)
    if rope and "gemma3" not in str(text.get("model_type", "")):
        rope_type = _rope_type(rope)
        if rope_type not in ROPE_TYPES_ALREADY_SCALED:
            factor = rope.get("factor", 1.0)
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                derived = rope["original_max_position_embeddings"]
                source = "rope_scaling.original_max_position_embeddings"
            if factor != 1.0:
                derived *= factor
                source = f"{source} x rope_scaling.factor {factor:g}"
    return int(derived), source


def estimate_parameter_count(config: Mapping[str, Any]) -> int:
    """Parameters of the model from its config alone (for a directory without weights).

    Counts embeddings, attention (GQA or MLA), dense or MoE MLPs and an untied LM head; adds a
    vision tower when the config has one. Norms and biases are left out (well under 0.1 %).
    """
    text = _text_config(config)
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model") or 0
    layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers") or 0
    shapes = _attention_shapes(text, None)
    attention = _attention_params(text, shapes)
    embeddings = embedding_parameter_count(config)
    mlp_total = sum(_mlp_params(text, hidden, layer) for layer in range(layers))
    return embeddings + layers * attention + mlp_total + _vision_params(config)


def expert_parameter_count(config: Mapping[str, Any]) -> int:
    """Parameters of the routed experts alone: what expert parallelism splits and MXFP4
    checkpoints quantize (shared experts, router and attention stay with the dense part)."""
    text = _text_config(config)
    experts = _num_experts(text) or 0
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model") or 0
    return (_moe_layer_count(text) * experts * _matrices_per_mlp(text) * hidden
            * (_expert_size(text) or 0))


def _moe_layer_count(text: Mapping[str, Any]) -> int:
    if not _num_experts(text):
        return 0
    layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers") or 0
    return sum(1 for layer in range(layers) if _is_moe_layer(text, layer))


def vocab_padding_parameter_count(config: Mapping[str, Any]) -> int:
    """Rows vLLM adds to the embedding (and an untied LM head): it pads the vocabulary to a
    multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE) before splitting it over the GPUs."""
    text = _text_config(config)
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model") or 0
    vocab = _first_int(text, "vocab_size", "padded_vocab_size") or 0
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return (-vocab % VOCAB_PADDING) * hidden * (1 if tied else 2)


def embedding_parameter_count(config: Mapping[str, Any]) -> int:
    """Input embedding plus LM head (one matrix when tied); quantizers keep these 16-bit."""
    text = _text_config(config)
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model") or 0
    vocab = _first_int(text, "vocab_size", "padded_vocab_size") or 0
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return vocab * hidden * (1 if tied else 2)


# --- config reading -----------------------------------------------------------------------


def _read_config(config_path: Path) -> dict[str, Any]:
    try:
        raw = config_path.read_bytes()
    except PermissionError as exc:
        raise BadInput(
            f"{config_path} is not readable ({exc.strerror})",
            fix=f"chmod a+r {config_path} (and the other model files)",
        ) from exc
    if raw.startswith(LFS_POINTER_PREFIX):
        raise BadInput(
            f"{config_path} is a Git LFS pointer, not the file",
            fix="run `git lfs pull` in the model directory or download it with huggingface-cli",
        )
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(
            f"{config_path} is not valid JSON: {exc}",
            fix="re-download config.json from the model repository",
        ) from exc
    if not isinstance(config, dict):
        raise BadInput(
            f"{config_path} holds a {type(config).__name__}, not a JSON object",
            fix="re-download config.json from the model repository",
        )
    return config


def _read_optional_json(path: Path, errors: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except PermissionError:
        return None  # reported once by _unreadable_files
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        errors.append(f"{path} is not valid JSON ({exc}); vLLM will fail to load it")
        return None
    return data if isinstance(data, dict) else None


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config (nested in multimodal configs) with class defaults filled."""
    text = dict(config)
    for key in NESTED_TEXT_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, dict):
            text = {**nested}
            for inherited in ("torch_dtype", "dtype", "quantization_config"):
                if inherited not in text and inherited in config:
                    text[inherited] = config[inherited]
            break
    for name, value in CLASS_DEFAULTS.get(str(text.get("model_type")), {}).items():
        text.setdefault(name, value)
    return text


def _first_int(data: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _attention_shapes(text: Mapping[str, Any], config_path: Path | None) -> dict[str, Any]:
    layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first_int(text, "num_attention_heads", "n_head", "num_heads")
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model")
    if config_path is not None and not (layers and heads and hidden):
        missing = [name for name, value in (("num_hidden_layers", layers),
                                            ("num_attention_heads", heads),
                                            ("hidden_size", hidden)) if not value]
        raise BadInput(
            f"{config_path} lacks {', '.join(missing)}: not a decoder language model kit "
            "can plan for",
            fix="point at a text-generation model's directory",
        )
    layers, heads, hidden = layers or 0, heads or 1, hidden or 0
    kv_heads = _first_int(text, "num_key_value_heads", "n_head_kv", "num_kv_heads",
                          "multi_query_group_num")
    if kv_heads is None:
        kv_heads = 1 if text.get("multi_query") else heads
    head_dim = _first_int(text, "head_dim") or hidden // heads
    kv_lora_rank = _first_int(text, "kv_lora_rank")
    window, window_layers = _sliding_window(text, layers)
    return {
        "layers": layers,
        "heads": heads,
        "hidden": hidden,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "kv_lora_rank": kv_lora_rank,
        "qk_rope_head_dim": _first_int(text, "qk_rope_head_dim") if kv_lora_rank else None,
        "sliding_window": window,
        "sliding_window_layers": window_layers,
    }


def _sliding_window(text: Mapping[str, Any], layers: int) -> tuple[int | None, int]:
    """The window size and how many layers use it, the way vLLM lays the layers out."""
    window = text.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or text.get("use_sliding_window") is False:
        return None, 0
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for kind in layer_types if kind == "sliding_attention")
        return (window, count) if count else (None, 0)
    model_type = str(text.get("model_type", ""))
    if model_type == "gemma2":  # even layers slide, odd layers attend globally
        return window, (layers + 1) // 2
    pattern = _first_int(text, "sliding_window_pattern", "_sliding_window_pattern")
    if pattern:  # gemma-3 style: every pattern-th layer is global
        return window, sum(1 for layer in range(layers) if (layer + 1) % pattern)
    if model_type.startswith("qwen") and text.get("use_sliding_window"):
        first_sliding = _first_int(text, "max_window_layers") or 0
        return window, max(0, layers - first_sliding)
    return window, layers


def _rope_scaling(text: Mapping[str, Any]) -> dict[str, Any] | None:
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    return rope if isinstance(rope, dict) else None


def _rope_type(rope: Mapping[str, Any]) -> str:
    rope_type = str(rope.get("rope_type") or rope.get("type") or "default")
    return "default" if rope_type == "mrope" else rope_type


def _config_dtype(config: Mapping[str, Any], text: Mapping[str, Any]) -> str:
    for source in (text, config):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str):
                return value.removeprefix("torch.")
    return "float32"  # transformers' default when a config names none


def _quantization(
    config: Mapping[str, Any], text: Mapping[str, Any]
) -> tuple[str | None, int | None, int | None]:
    quant = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(quant, dict):
        return None, None, None
    method = quant.get("quant_method")
    bits = _first_int(quant, "bits", "w_bit", "weight_bits")
    group_size = _first_int(quant, "group_size", "q_group_size")
    if method == "compressed-tensors":
        for group in (quant.get("config_groups") or {}).values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict):
                bits = bits or _first_int(weights, "num_bits")
                group_size = group_size or _first_int(weights, "group_size")
    if method == "bitsandbytes":
        bits = 4 if quant.get("load_in_4bit") else 8
    return (str(method) if method else None), bits, group_size


def _num_experts(text: Mapping[str, Any]) -> int | None:
    return _first_int(
        text, "n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"
    )


# --- parameter counting -------------------------------------------------------------------


def _attention_params(text: Mapping[str, Any], shapes: Mapping[str, Any]) -> int:
    hidden, heads, head_dim = shapes["hidden"], shapes["heads"], shapes["head_dim"]
    if shapes["kv_lora_rank"]:
        nope = _first_int(text, "qk_nope_head_dim") or 0
        rope = shapes["qk_rope_head_dim"] or 0
        value_dim = _first_int(text, "v_head_dim") or nope
        q_rank = _first_int(text, "q_lora_rank")
        query = (hidden * q_rank + q_rank * heads * (nope + rope)) if q_rank else \
            hidden * heads * (nope + rope)
        kv_rank = shapes["kv_lora_rank"]
        return (query + hidden * (kv_rank + rope) + kv_rank * heads * (nope + value_dim)
                + heads * value_dim * hidden)
    q_and_o = 2 * hidden * heads * head_dim
    k_and_v = 2 * hidden * shapes["kv_heads"] * head_dim
    return q_and_o + k_and_v


def _mlp_params(text: Mapping[str, Any], hidden: int, layer: int) -> int:
    """One layer's MLP: dense, or routed experts plus shared experts and router."""
    dense = _first_int(text, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden
    matrices = _matrices_per_mlp(text)
    experts = _num_experts(text)
    if not experts or not _is_moe_layer(text, layer):
        return matrices * hidden * dense
    expert_size = _expert_size(text) or dense
    return matrices * hidden * (experts * expert_size + shared_expert_width(text)) \
        + hidden * experts


def _matrices_per_mlp(text: Mapping[str, Any]) -> int:
    return 2 if str(text.get("model_type")) in NON_GATED_MLP_TYPES else 3


def _expert_size(text: Mapping[str, Any]) -> int | None:
    if not _num_experts(text):
        return None
    return (_first_int(text, "moe_intermediate_size", "expert_intermediate_size")
            or _first_int(text, "intermediate_size", "ffn_hidden_size"))


def dense_mlp_width(text: Mapping[str, Any]) -> int:
    """The widest MLP every token passes through: a dense layer's, or a MoE layer's shared
    experts (the activation peak of a forward pass scales with it)."""
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model") or 0
    dense = _first_int(text, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden
    if not _num_experts(text):
        return dense
    layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers") or 0
    has_dense_layer = any(not _is_moe_layer(text, layer) for layer in range(layers))
    return max(dense if has_dense_layer else 0, shared_expert_width(text))


def shared_expert_width(text: Mapping[str, Any]) -> int:
    """Intermediate width of the always-active shared expert(s) of one MoE layer."""
    expert_size = _expert_size(text) or 0
    width = (_first_int(text, "n_shared_experts") or 0) * expert_size
    width += _first_int(text, "shared_expert_intermediate_size") or 0
    if str(text.get("model_type")) in ONE_SHARED_EXPERT_TYPES:
        width += expert_size
    return width


def _is_moe_layer(text: Mapping[str, Any], layer: int) -> bool:
    """Which layers route to experts, per family: DeepSeek counts from first_k_dense_replace,
    Qwen-MoE and Llama-4 put experts on every step-th layer."""
    if layer < (_first_int(text, "first_k_dense_replace") or 0):
        return False
    if layer in (text.get("mlp_only_layers") or ()):
        return False
    if "moe_layer_freq" in text:
        return layer % (_first_int(text, "moe_layer_freq") or 1) == 0
    step = _first_int(text, "decoder_sparse_step", "interleave_moe_layer_step")
    return not step or (layer + 1) % step == 0


def _vision_params(config: Mapping[str, Any]) -> int:
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    width = _first_int(vision, "hidden_size", "embed_dim", "width") or 0
    depth = _first_int(vision, "num_hidden_layers", "depth", "layers") or 0
    mlp = _first_int(vision, "intermediate_size") or width * (vision.get("mlp_ratio") or 4)
    return int(depth * (4 * width * width + 2 * width * mlp))


# --- files --------------------------------------------------------------------------------


def _unreadable_files(model_dir: Path) -> list[str]:
    problems = []
    for entry in sorted(model_dir.iterdir()):
        if entry.is_file() and not os.access(entry, os.R_OK):
            mode = oct(entry.stat().st_mode & 0o777)
            problems.append(
                f"{entry} is not readable by this user (mode {mode}); fix with chmod a+r"
            )
    return problems


def _custom_code(config: Mapping[str, Any], model_dir: Path) -> tuple[bool, list[str]]:
    """Whether auto_map asks for custom code, and which referenced .py files are missing."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        return False, []
    missing = []
    for module in sorted(set(_auto_map_modules(auto_map.values()))):
        if not (model_dir / f"{module}.py").is_file():
            missing.append(
                f"auto_map needs {module}.py, which is not in {model_dir}: vLLM's "
                "trust_remote_code import fails; copy it from the model repository"
            )
    return True, missing


def _auto_map_modules(values: Iterable[Any]) -> Iterable[str]:
    for value in values:
        if isinstance(value, list | tuple):
            yield from _auto_map_modules(value)
        elif isinstance(value, str) and "--" not in value:  # "repo--module.Class" lives elsewhere
            yield value.rsplit(".", 1)[0]


def _has_chat_template(model_dir: Path, tokenizer_config: Mapping[str, Any] | None) -> bool:
    if any((model_dir / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    return bool(tokenizer_config and tokenizer_config.get("chat_template"))


def _weights(model_dir: Path) -> tuple[int | None, dict[str, int], list[str], list[str]]:
    """Total weight bytes (and by dtype) from safetensors headers, plus problems found."""
    errors: list[str] = []
    warnings: list[str] = []
    index_path = model_dir / SAFETENSORS_INDEX
    expected: dict[str, set[str]] = {}
    if index_path.is_file():
        index = _read_optional_json(index_path, errors)
        weight_map = (index or {}).get("weight_map")
        if not isinstance(weight_map, dict):
            errors.append(f"{index_path} has no weight_map; vLLM cannot find the shards")
        else:
            for tensor, shard in weight_map.items():
                expected.setdefault(shard, set()).add(tensor)
        shards = sorted(expected)
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not shards:
        bin_files = sorted(model_dir.glob("pytorch_model*.bin"))
        if bin_files:
            warnings.append("weights are .bin (pickle) files; size taken from the file sizes")
            return sum(p.stat().st_size for p in bin_files), {}, errors, warnings
        return None, {}, errors, warnings

    by_dtype: dict[str, int] = {}
    for shard in shards:
        shard_path = model_dir / shard
        if not shard_path.is_file():
            errors.append(f"shard {shard} named by {SAFETENSORS_INDEX} is missing from {model_dir}")
            continue
        header, problem = read_safetensors_header(shard_path)
        if problem:
            errors.append(problem)
            continue
        for name, meta in header.items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            start, end = meta.get("data_offsets", (0, 0))
            dtype = SAFETENSORS_DTYPE_NAMES.get(meta.get("dtype"), str(meta.get("dtype")))
            by_dtype[dtype] = by_dtype.get(dtype, 0) + (end - start)
        absent = expected.get(shard, set()) - header.keys()
        if absent:
            sample = ", ".join(sorted(absent)[:3])
            errors.append(
                f"{shard} lacks {len(absent)} tensor(s) the index promises ({sample}...): the "
                "shard is truncated or from another revision; re-download it"
            )
    return (sum(by_dtype.values()) if by_dtype else None), by_dtype, errors, warnings


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], str | None]:
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if prefix.startswith(LFS_POINTER_PREFIX[:8]):
                return {}, f"{path.name} is a Git LFS pointer, not weights; run `git lfs pull`"
            if len(prefix) < 8:
                return {}, f"{path.name} is truncated (no safetensors header); re-download it"
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_SAFETENSORS_HEADER:
                return {}, f"{path.name} has an impossible header size; re-download it"
            header = json.loads(handle.read(length))
    except PermissionError:
        return {}, f"{path} is not readable by this user; fix with chmod a+r"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}, f"{path.name} has a corrupt safetensors header; re-download it"
    if not isinstance(header, dict):
        return {}, f"{path.name} has a corrupt safetensors header; re-download it"
    data_size = path.stat().st_size - 8 - length
    highest = max((m["data_offsets"][1] for k, m in header.items()
                   if k != "__metadata__" and isinstance(m, dict) and "data_offsets" in m),
                  default=0)
    if highest > data_size:
        return {}, (f"{path.name} is shorter than its header says ({data_size} of {highest} "
                    "bytes): an interrupted download; re-download it")
    return header, None
