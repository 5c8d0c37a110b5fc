"""What vLLM derives from the model directory, the GPUs it is given and its flags.

Real inputs are read wherever they exist: `<model>/config.json` (or the Hugging Face cache for a
hub id), `tokenizer_config.json`, the weight files' sizes, NVIDIA_VISIBLE_DEVICES /
CUDA_VISIBLE_DEVICES, /dev/shm. Only the GPU itself is simulated: its memory comes from
STANDIN_GPU_MEMORY_GIB. The arithmetic follows vLLM's (V1 engine) as described in
shared/reference/vllm.md; the texts of the errors are vLLM's.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30

# ModelConfig's keys for the model's context length (vllm/config/model.py), smallest wins. A copy
# of kit/plan/modelinfo.py's (this image carries no kit): tests/unit/standin/test_model.py keeps
# the two equal.
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
DEFAULT_MAX_LEN = 2048  # vLLM's assumption when config.json names no context length
BLOCK_SIZE = 16
CUDA_GRAPH_GIB = 0.5  # "Estimated CUDA graph memory: 0.50 GiB total"
NON_TORCH_GIB = 1.5  # CUDA context, NCCL, cuBLAS workspaces (fitted to the H200 log)
CUDA_CONTEXT_GIB = 0.5
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# vLLM 0.33.0's "Unknown quantization method" list (startup-errors.txt).
QUANTIZATION_METHODS = [
    "awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "gguf",
    "gptq_marlin",
    "awq_marlin",
    "gptq",
    "humming",
    "compressed-tensors",
    "bitsandbytes",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "cpu_awq",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "int8_per_channel_weight_only",
    "mxfp8",
]
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]+\b$")


class ConfigError(Exception):
    """A pydantic validation error vLLM raises while building its config: (config class, text)."""

    def __init__(self, config_class: str, message: str, input_value: str):
        super().__init__(message)
        self.config_class = config_class
        self.message = message
        self.input_value = input_value


class RepoIdError(Exception):
    """huggingface_hub refusing a local path that does not exist as a repo id."""


def args_kwargs_repr(kwargs: dict) -> str:
    """pydantic's input_value for a dataclass: the ArgsKwargs repr cut to 25 + ... + 24 chars."""
    text = f"ArgsKwargs((), {kwargs!r})"
    return text if len(text) <= 50 else text[:25] + "..." + text[-24:]


def model_config_input(model: str) -> str:
    # ModelConfig's kwargs start with `model` and end with `renderer_num_workers`.
    return args_kwargs_repr({"model": model, "renderer_num_workers": 1})


@dataclass(frozen=True)
class ModelSource:
    name: str
    config_dir: Path | None  # where config.json was found (None: no config at all)
    config: dict  # the text model's config (text_config merged in for multimodal configs)
    tokenizer_config: dict
    weight_bytes_on_disk: int


def _hub_snapshot(repo_id: str) -> Path | None:
    home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
    cache = Path(os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub")))
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if (snapshot / "config.json").is_file():
            return snapshot
    snapshots = sorted((repo / "snapshots").glob("*/config.json"))
    return snapshots[-1].parent if snapshots else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def resolve_model(model: str) -> ModelSource:
    path = Path(model)
    if path.is_dir():
        config_dir: Path | None = path
    elif path.exists():
        config_dir = None  # a single file (e.g. GGUF): no config.json beside it to read
    elif REPO_ID.match(model) and "--" not in model and ".." not in model:
        config_dir = _hub_snapshot(model)
    else:
        raise RepoIdError(
            "Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
            f"'{model}'. Use `repo_type` argument if needed."
        )
    config: dict = {}
    tokenizer_config: dict = {}
    weights = 0
    if config_dir is not None:
        config = _read_json(config_dir / "config.json")
        tokenizer_config = _read_json(config_dir / "tokenizer_config.json")
        weights = sum(
            f.stat().st_size
            for f in config_dir.iterdir()
            if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)
        )
    elif path.is_file():
        weights = path.stat().st_size
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}
    return ModelSource(model, config_dir, config, tokenizer_config, weights)


def check_remote_code(source: ModelSource, trust_remote_code: bool) -> None:
    if source.config.get("auto_map") and not trust_remote_code:
        raise ConfigError(
            "ModelConfig",
            f"The repository {source.name} contains custom code which must be executed to "
            "correctly load the model. You can inspect the repository content at "
            f"https://hf.co/{source.name}.\n"
            "Please pass the argument `trust_remote_code=True` to allow custom code to be run.",
            model_config_input(source.name),
        )


def check_quantization(model: str, quantization: str | None) -> None:
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise ConfigError(
            "ModelConfig",
            f"Unknown quantization method: {quantization}. Must be one of {QUANTIZATION_METHODS}.",
            model_config_input(model),
        )


def derived_max_len(source: ModelSource) -> tuple[str | None, float]:
    """(the config key that limits the context, the limit) as vLLM derives them."""
    cfg = source.config
    key, derived = None, math.inf
    for name in MAX_LEN_KEYS:
        value = cfg.get(name)
        if isinstance(value, (int, float)) and value > 0 and value < derived:
            key, derived = name, float(value)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict) and key is not None:
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type not in ("su", "longrope", "llama3", "yarn"):
            derived *= float(rope.get("factor", 1.0))
    tokenizer_limit = source.tokenizer_config.get("model_max_length")
    if isinstance(tokenizer_limit, (int, float)) and tokenizer_limit < derived:
        derived = float(tokenizer_limit)
    return key, derived


def resolve_max_model_len(source: ModelSource, requested: int | None) -> int:
    key, derived = derived_max_len(source)
    if derived == math.inf:
        return requested if requested not in (None, -1) else DEFAULT_MAX_LEN
    if requested in (None, -1):
        return int(derived)
    if requested > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise ConfigError(
            "ModelConfig",
            f"User-specified max_model_len ({requested}) is greater than the derived "
            f"max_model_len ({key}={derived} or "
            f"model_max_length={source.config.get('model_max_length')} in model's "
            "config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution. If the model uses relative position encoding (RoPE), positions "
            "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
            "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
            "out-of-bounds error.",
            model_config_input(source.name),
        )
    return requested


# --- GPUs ------------------------------------------------------------------------------------


def runtime_gpu_ids() -> list[str]:
    """GPUs the NVIDIA container runtime gave the container (NVIDIA_VISIBLE_DEVICES)."""
    value = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in ("", "void", "none"):
        return []
    if value == "all":
        return [str(i) for i in range(int(os.environ.get("STANDIN_GPU_COUNT", "1")))]
    return [v.strip() for v in value.split(",") if v.strip()]


def cuda_device_count(runtime_ids: list[str]) -> int:
    """Devices CUDA enumerates: CUDA_VISIBLE_DEVICES filters up to its first invalid entry."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return len(runtime_ids)
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < len(runtime_ids) or entry in runtime_ids:
            count += 1
        else:
            break
    return count


def check_world_size(
    world_size: int, gpu_count: int, backend: str | None, pp: int, tp: int
) -> None:
    if world_size > 1 and backend != "ray" and gpu_count < world_size:
        raise ConfigError(
            "ParallelConfig",
            f"World size ({world_size}) is larger than the number of available GPUs "
            f"({gpu_count}) in this node. If this is intentional and you are using:\n"
            "- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately.",
            args_kwargs_repr(
                {
                    "pipeline_parallel_size": pp,
                    "tensor_parallel_size": tp,
                    "distributed_executor_backend": backend,
                }
            ),
        )


def check_heads(source: ModelSource, tp: int) -> None:
    heads = source.config.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        raise ConfigError(
            "VllmConfig",
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp}).",
            args_kwargs_repr({"model_config": source.name, "parallel_config": tp}),
        )


def shm_bytes(path: str = "/dev/shm") -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


# --- memory ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int
    mla_dim: int  # kv_lora_rank + qk_rope_head_dim for MLA models, else 0

    @classmethod
    def from_config(cls, cfg: dict) -> Dims | None:
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            layers = int(cfg["num_hidden_layers"])
        except (KeyError, TypeError, ValueError):
            return None
        experts = int(
            cfg.get("num_local_experts")
            or cfg.get("num_experts")
            or cfg.get("n_routed_experts")
            or 0
        )
        intermediate = int(cfg.get("intermediate_size") or 4 * hidden)
        if experts:
            intermediate = int(cfg.get("moe_intermediate_size") or intermediate)
        mla = int(cfg.get("kv_lora_rank") or 0)
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=intermediate,
            vocab=int(cfg.get("vocab_size") or 32000),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            experts=experts,
            mla_dim=mla + int(cfg.get("qk_rope_head_dim") or 0) if mla else 0,
        )

    def tensors(self, tp: int, pp: int) -> list[int]:
        """Parameter counts of the tensors one GPU loads, in load order."""
        attn_qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim // tp
        attn_o = self.heads * self.head_dim * self.hidden // tp
        experts = max(1, self.experts)
        gate_up = experts * 2 * self.hidden * self.intermediate // tp
        down = experts * self.intermediate * self.hidden // tp
        embed = self.vocab * self.hidden // tp
        out = [embed]
        for _ in range(math.ceil(self.layers / pp)):
            out += [attn_qkv, attn_o, gate_up, down]
        if not self.tied:
            out.append(embed)
        return out

    def kv_bytes_per_token(self, tp: int, pp: int, kv_bytes: int) -> int:
        layers = math.ceil(self.layers / pp)
        if self.mla_dim:
            return layers * self.mla_dim * kv_bytes
        return layers * 2 * max(1, self.kv_heads // tp) * self.head_dim * kv_bytes


def model_dtype(cfg: dict, dtype_flag: str) -> str:
    if dtype_flag != "auto":
        return {"half": "float16", "float": "float32"}.get(dtype_flag, dtype_flag)
    config_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return "bfloat16" if config_dtype == "bfloat16" else "float16"


def kv_dtype_bytes(kv_cache_dtype: str, dtype: str) -> int:
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype == "auto":
        return DTYPE_BYTES[dtype]
    return DTYPE_BYTES.get(kv_cache_dtype, 2)


def format_size(size: float) -> str:
    """PyTorch's CUDA allocator size format."""
    if size <= 1024:
        return f"{int(size)} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


def format_gib(size: float) -> float:
    return round(size / GiB, 2)


class EngineError(Exception):
    """A failure inside vLLM's engine core process: (exception type, message)."""

    def __init__(self, exc_type: str, message: str):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message


def gpu_memory() -> int:
    """Bytes of one simulated GPU (STANDIN_GPU_MEMORY_GIB)."""
    return int(float(os.environ.get("STANDIN_GPU_MEMORY_GIB", "80")) * GiB)


def weight_bytes(source: ModelSource, dims: Dims | None, dtype: str, tp: int, pp: int) -> int:
    """Bytes of weights one GPU holds: STANDIN_WEIGHTS_GIB, the weight files, or an estimate
    from config.json."""
    env = os.environ.get("STANDIN_WEIGHTS_GIB")
    if env:
        total = float(env) * GiB
    elif source.weight_bytes_on_disk:
        total = source.weight_bytes_on_disk
    elif dims is not None:
        bits = (source.config.get("quantization_config") or {}).get("bits")
        per_param = bits / 8 if isinstance(bits, int) else DTYPE_BYTES[dtype]
        return int(sum(dims.tensors(tp, pp)) * per_param)
    else:
        return 0
    return int(total / (tp * pp))


def load_weights(source: ModelSource, *, dtype_flag: str, tp: int, pp: int) -> int:
    """Allocate one GPU's weights tensor by tensor; past its capacity, PyTorch's OOM."""
    gpu_total = gpu_memory()
    dims = Dims.from_config(source.config)
    weights = weight_bytes(source, dims, model_dtype(source.config, dtype_flag), tp, pp)
    if dims is not None:
        counts = dims.tensors(tp, pp)
        scale = weights / max(1, sum(counts))
        sizes = [int(c * scale) for c in counts]
    else:
        sizes = [GiB] * (weights // GiB) + [weights % GiB]
    context = int(CUDA_CONTEXT_GIB * GiB)
    allocated = 0
    for size in sizes:
        if context + allocated + size > gpu_total:
            free = gpu_total - context - allocated
            raise EngineError(
                "torch.OutOfMemoryError",
                f"CUDA out of memory. Tried to allocate {format_size(size)}. GPU 0 has a total "
                f"capacity of {format_size(gpu_total)} of which {format_size(free)} is free. "
                "Including non-PyTorch memory, this process has "
                f"{format_size(context + allocated)} memory in use. Of the allocated memory "
                f"{format_size(allocated)} is allocated by PyTorch, and 0 bytes is reserved by "
                "PyTorch but unallocated. If reserved but unallocated memory is large try "
                "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                "fragmentation.  See documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            )
        allocated += size
    return weights


@dataclass(frozen=True)
class KvCache:
    available: int  # bytes per GPU
    tokens: int


def size_kv_cache(
    source: ModelSource,
    weights: int,
    *,
    dtype_flag: str,
    kv_cache_dtype: str,
    tp: int,
    pp: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_batched_tokens: int,
    enforce_eager: bool,
) -> KvCache | None:
    """What is left for the KV cache after the weights, failing like vLLM; None when the
    model's dimensions are unknown."""
    dims = Dims.from_config(source.config)
    if dims is None:
        return None
    dtype = model_dtype(source.config, dtype_flag)
    activation = max_num_batched_tokens * (4 * dims.hidden + 2 * dims.intermediate // tp)
    overhead = (NON_TORCH_GIB + (0 if enforce_eager else CUDA_GRAPH_GIB)) * GiB
    available = (
        gpu_memory() * gpu_memory_utilization - weights - overhead - activation * DTYPE_BYTES[dtype]
    )
    if available <= 0:
        raise EngineError(
            "ValueError",
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        )
    per_token = dims.kv_bytes_per_token(tp, pp, kv_dtype_bytes(kv_cache_dtype, dtype))
    tokens = int(available // (per_token * BLOCK_SIZE)) * BLOCK_SIZE
    needed = per_token * max_model_len
    if needed > available:
        raise EngineError(
            "ValueError",
            "To serve at least one request with the models's max seq len "
            f"({max_model_len}), ({format_gib(needed)} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory ({format_gib(available)} GiB). Based on the "
            f"available memory, the estimated maximum model length is {tokens}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
            "more details.",
        )
    return KvCache(int(available), tokens)


def scheduler_defaults(gpu_total: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM picks for the GPU's class."""
    if gpu_total >= 160 * GiB:
        return 1024, 16384
    if gpu_total >= 80 * GiB:
        return 1024, 8192
    return 256, 2048
