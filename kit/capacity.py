"""How much KV cache a vLLM service gets per GPU, computed before a 5-minute start-up fails.

Pure: a ModelInfo and the service's numbers in, a CapacityReport out. The arithmetic follows
vLLM's V1 engine (see docs/capacity.md for the derivation and the accuracy table):

    budget     = gpu_memory_gib x gpu_memory_utilization
    kv_cache   = budget - weights_per_gpu - activation_peak - runtime - cuda_graphs
    bytes/tok  = layers x 2 x max(1, kv_heads // tp) x head_dim x kv_dtype_bytes
                 (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes, not / tp)

Weights, KV layout and the sliding-window accounting are exact; the three overhead terms are
estimates fitted to vLLM's own start-up logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kit.errors import BadInput
from kit.modelinfo import DTYPE_BYTES, ModelInfo

GIB = 1 << 30
BLOCK_SIZE = 16  # vLLM's default KV block size on CUDA
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM 0.33 default (0.9 before)
DEFAULT_TYPICAL_REQUEST_TOKENS = 2048  # prompt + completion of an ordinary chat turn

# Overhead model: vLLM profiles one forward pass over max_num_batched_tokens tokens plus one
# sampler pass over max_num_seqs sequences and keeps the peak. Fitted (least squares) to the
# activation peaks vLLM 0.19 logged for 18 models on H100 (llm-d-planner accuracy logs,
# see docs/capacity.md); worst residual 0.28 GiB.
SAMPLER_LOGIT_COPIES = 3.6  # fp32 [max_num_seqs, vocab] tensors alive at the sampler's peak
FORWARD_HIDDEN_COPIES = 2.5  # 16-bit [max_num_batched_tokens, hidden] tensors at the peak
MOE_DISPATCH_COPIES = 2.0  # 16-bit [tokens x experts_per_token, hidden] in fused MoE
# Memory outside PyTorch's allocator during the forward pass (cuBLAS workspaces; with tensor
# parallelism NCCL and custom all-reduce buffers), as logged by vLLM 0.19 on H100.
RUNTIME_GIB_SINGLE_GPU = 0.25
RUNTIME_GIB_TENSOR_PARALLEL = 2.1
# vLLM >= 0.21 reserves its CUDA-graph estimate inside the budget; logged estimates were
# 0.5-1.9 GiB, growing with the number of layers (one piecewise graph per layer).
CUDA_GRAPH_BASE_GIB = 0.5
CUDA_GRAPH_PER_LAYER_GIB = 0.01

# vLLM's scheduler defaults by GPU (vllm.md): >=160 GiB, H100/H200 class, A100 and smaller.
LARGE_GPU_GIB = 160
HOPPER_CLASS_GIB = 70

KV_CACHE_DTYPE_BYTES = {
    "auto": None,  # the model's dtype
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}
# Methods vLLM 0.33 accepts for --quantization (its own error message lists them) with the
# weight bits each stores when the checkpoint does not say.
QUANTIZATION_BITS = {
    "awq": 4,
    "awq_marlin": 4,
    "gptq": 4,
    "gptq_marlin": 4,
    "cpu_awq": 4,
    "moe_wna16": 4,
    "bitsandbytes": 4,
    "mxfp4": 4,
    "gpt_oss_mxfp4": 4,
    "modelopt_fp4": 4,
    "gguf": 4,
    "fp8": 8,
    "fbgemm_fp8": 8,
    "fp8_per_tensor": 8,
    "fp8_per_block": 8,
    "deepseek_v4_fp8": 8,
    "int8_per_channel_weight_only": 8,
    "experts_int8": 8,
    "mxfp8": 8,
    "modelopt": 8,
    "modelopt_mxfp8": 8,
    "compressed-tensors": 8,
}
VLLM_QUANTIZATION_METHODS = frozenset(QUANTIZATION_BITS) | {
    "fp_quant",
    "modelopt_mixed",
    "humming",
    "quark",
    "torchao",
    "inc",
    "online",
}


@dataclass(frozen=True)
class CapacityReport:
    """The capacity of one service on each of its GPUs, and what stops it from starting."""

    kv_bytes_per_token: int
    weights_gib: float
    weights_source: str
    gpu_memory_gib: float
    gpu_memory_utilization: float
    tensor_parallel: int
    kv_budget_gib: float
    activation_gib: float
    runtime_gib: float
    cuda_graphs_gib: float
    kv_cache_gib: float
    kv_cache_tokens: int
    max_model_len: int
    max_model_len_limit: int | None
    max_model_len_fit: int
    max_concurrency: float
    typical_request_tokens: int
    max_concurrency_typical: float
    max_num_seqs: int
    max_num_batched_tokens: int
    recommended_max_num_seqs: int
    recommended_max_num_seqs_reason: str
    kv_cache_dtype: str
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def overhead_gib(self) -> float:
        """Everything in the budget that is neither weights nor KV cache."""
        return self.activation_gib + self.runtime_gib + self.cuda_graphs_gib

    def to_json(self) -> dict[str, Any]:
        """The stable keys other tools read (`kit plan --json`)."""
        return {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "weights_gib": round(self.weights_gib, 3),
            "weights_source": self.weights_source,
            "gpu_memory_gib": self.gpu_memory_gib,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel": self.tensor_parallel,
            "kv_budget_gib": round(self.kv_budget_gib, 3),
            "overhead_gib": round(self.overhead_gib, 3),
            "overhead": {
                "activation_gib": round(self.activation_gib, 3),
                "runtime_gib": round(self.runtime_gib, 3),
                "cuda_graphs_gib": round(self.cuda_graphs_gib, 3),
            },
            "kv_cache_gib": round(self.kv_cache_gib, 3),
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.max_model_len,
            "max_model_len_limit": self.max_model_len_limit,
            "max_model_len_fit": self.max_model_len_fit,
            "max_concurrency": round(self.max_concurrency, 2),
            "typical_request_tokens": self.typical_request_tokens,
            "max_concurrency_typical": round(self.max_concurrency_typical, 2),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "recommended_max_num_seqs": self.recommended_max_num_seqs,
            "recommended_max_num_seqs_reason": self.recommended_max_num_seqs_reason,
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class KVLayout:
    """How vLLM lays out one GPU's KV cache: bytes per token per layer and the layer groups.

    Layers of different kinds (full attention, sliding window) go into groups of equal size
    so they can share one block pool; a kind whose layer count is not a multiple of the group
    size gets padding layers that take real memory (vLLM warns "Add N padding layers").
    """

    layer_bytes: int
    full_layers: int
    sliding_layers: int
    sliding_window: int | None
    group_size: int

    @property
    def bytes_per_token(self) -> int:
        return self.layer_bytes * (self.full_layers + self.sliding_layers)

    @property
    def full_groups(self) -> int:
        return math.ceil(self.full_layers / self.group_size) if self.full_layers else 0

    @property
    def sliding_groups(self) -> int:
        return math.ceil(self.sliding_layers / self.group_size) if self.sliding_layers else 0

    @property
    def padding_layers(self) -> int:
        padded = (self.full_groups + self.sliding_groups) * self.group_size
        return padded - self.full_layers - self.sliding_layers

    def num_blocks(self, kv_bytes: float) -> int:
        """Blocks per group slot: each block holds BLOCK_SIZE tokens for group_size layers."""
        return int(kv_bytes // (self.group_size * BLOCK_SIZE * self.layer_bytes))

    def tokens(self, kv_bytes: float) -> int:
        """vLLM's "GPU KV cache size: N tokens"."""
        groups = self.full_groups + self.sliding_groups
        return self.num_blocks(kv_bytes) // groups * BLOCK_SIZE

    def blocks_per_request(self, tokens: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of `tokens` tokens holds, summed over the groups."""
        blocks = self.full_groups * math.ceil(tokens / BLOCK_SIZE)
        if self.sliding_groups and self.sliding_window:
            window_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, tokens)
            blocks += self.sliding_groups * (math.ceil(window_tokens / BLOCK_SIZE) + 1)
        return blocks

    def concurrency(self, kv_bytes: float, tokens: int, max_num_batched_tokens: int) -> float:
        return self.num_blocks(kv_bytes) / self.blocks_per_request(tokens, max_num_batched_tokens)

    def longest_request(self, kv_bytes: float, max_num_batched_tokens: int, upper: int) -> int:
        """The largest max_model_len (<= upper) of which one request still fits."""
        available = self.num_blocks(kv_bytes)
        low, high = 0, upper
        while low < high:
            middle = (low + high + 1) // 2
            if self.blocks_per_request(middle, max_num_batched_tokens) <= available:
                low = middle
            else:
                high = middle - 1
        return low


def vllm_scheduler_defaults(gpu_memory_gib: float, gpu_name: str | None = None) -> tuple[int, int]:
    """vLLM's (max_num_seqs, max_num_batched_tokens) defaults for the OpenAI server.

    A100s keep the small defaults even with 80 GB: vLLM checks the device name.
    """
    if gpu_memory_gib >= LARGE_GPU_GIB:
        return 1024, 16384
    if gpu_memory_gib >= HOPPER_CLASS_GIB and "a100" not in (gpu_name or "").lower():
        return 1024, 8192
    return 256, 2048


def model_dtype_bytes(model: ModelInfo, dtype: str) -> int:
    """Bytes per weight/activation element vLLM runs with for --dtype `dtype`.

    "auto" keeps 16-bit checkpoints as they are and runs float32 checkpoints in 16 bits.
    """
    if dtype in ("float32", "float"):
        return 4
    if dtype != "auto":
        return 2
    return min(DTYPE_BYTES.get(model.torch_dtype, 2), 2)


def kv_layout(model: ModelInfo, tensor_parallel: int, kv_dtype_bytes: int) -> KVLayout:
    """Bytes per token per layer on one GPU and vLLM's grouping of full/sliding layers."""
    if model.is_mla:
        layer_bytes = ((model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0)) * kv_dtype_bytes
    else:
        heads_per_gpu = max(1, model.num_key_value_heads // tensor_parallel)
        layer_bytes = 2 * heads_per_gpu * model.head_dim * kv_dtype_bytes
    full, sliding = model.full_attention_layers, model.sliding_window_layers
    kinds = [count for count in (full, sliding) if count]
    group_size = min(kinds)
    if max(kinds) < group_size * 1.5:  # vLLM pads the smaller kind rather than splitting
        group_size = max(kinds)
    return KVLayout(layer_bytes, full, sliding, model.sliding_window, group_size)


def plan_capacity(
    model: ModelInfo,
    *,
    gpu_memory_gib: float,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    dtype: str = "auto",
    max_num_batched_tokens: int | None = None,
    weights_gib: float | None = None,
    typical_request_tokens: int | None = None,
    max_num_seqs: int | None = None,
    gpu_name: str | None = None,
    cuda_graphs_in_budget: bool = True,
) -> CapacityReport:
    """Plan one service's memory on each of its GPUs the way vLLM will split it.

    `weights_gib` is the model's total weight size (split over the tensor-parallel GPUs) and
    overrides what the model directory says. `max_num_seqs` None means vLLM's default for the
    GPU (the overhead is then an upper bound for any smaller recommended value).
    `cuda_graphs_in_budget` False matches vLLM < 0.21, --enforce-eager or
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.
    """
    _check_inputs(gpu_memory_gib, tensor_parallel, gpu_memory_utilization, max_model_len,
                  kv_cache_dtype)
    warnings = list(model.warnings)
    errors = list(model.errors)
    errors.extend(_parallelism_errors(model, tensor_parallel, warnings))
    if quantization and quantization not in VLLM_QUANTIZATION_METHODS:
        errors.append(
            f"quantization {quantization!r} is not a vLLM method; set services[].quantization "
            f"to one of {', '.join(sorted(VLLM_QUANTIZATION_METHODS))} or leave it out"
        )
    if model.derived_max_model_len is not None and max_model_len > model.derived_max_model_len:
        errors.append(
            f"max_model_len {max_model_len} is above the model's limit "
            f"{model.derived_max_model_len} ({model.max_len_source} in config.json); vLLM refuses "
            "to start (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); lower services[].max_model_len"
        )

    default_seqs, default_batched = vllm_scheduler_defaults(gpu_memory_gib, gpu_name)
    seqs = max_num_seqs or default_seqs
    batched = max_num_batched_tokens or default_batched
    element_bytes = model_dtype_bytes(model, dtype)
    kv_dtype_bytes = KV_CACHE_DTYPE_BYTES[kv_cache_dtype] or element_bytes
    layout = kv_layout(model, tensor_parallel, kv_dtype_bytes)
    if layout.padding_layers:
        warnings.append(
            f"vLLM adds {layout.padding_layers} padding layers to group the "
            f"{layout.full_layers} full and {layout.sliding_layers} sliding-window layers; they "
            "take KV memory but hold nothing"
        )
    if layout.sliding_layers:
        warnings.append(
            f"{layout.sliding_layers} of {model.num_hidden_layers} layers use a "
            f"{model.sliding_window}-token sliding window: each request keeps at most "
            f"window - 1 + max_num_batched_tokens ({model.sliding_window - 1 + batched}) tokens "
            "of KV in those layers"
        )

    total_weight_bytes, weights_source = _weight_bytes(model, weights_gib, quantization,
                                                       element_bytes, warnings)
    weights_per_gpu = total_weight_bytes / tensor_parallel / GIB
    activation = _activation_gib(model, seqs, batched, element_bytes)
    runtime = RUNTIME_GIB_TENSOR_PARALLEL if tensor_parallel > 1 else RUNTIME_GIB_SINGLE_GPU
    cuda_graphs = (CUDA_GRAPH_BASE_GIB + CUDA_GRAPH_PER_LAYER_GIB * model.num_hidden_layers
                   if cuda_graphs_in_budget else 0.0)
    budget = gpu_memory_gib * gpu_memory_utilization
    kv_cache_gib = budget - weights_per_gpu - activation - runtime - cuda_graphs
    kv_bytes = max(kv_cache_gib, 0.0) * GIB

    if weights_per_gpu >= budget:
        errors.append(
            f"weights need {weights_per_gpu:.1f} GiB per GPU but gpu_memory_utilization "
            f"{gpu_memory_utilization} x {gpu_memory_gib:g} GiB allows {budget:.1f} GiB; raise "
            "services[].tensor_parallel, use a quantized model or raise gpu_memory_utilization"
        )
    elif kv_cache_gib <= 0:
        errors.append(
            f"no memory left for the KV cache: weights {weights_per_gpu:.1f} GiB + overhead "
            f"{activation + runtime + cuda_graphs:.1f} GiB exceed the {budget:.1f} GiB budget "
            "(vLLM: 'No available memory for the cache blocks'); raise gpu_memory_utilization "
            "or services[].tensor_parallel"
        )

    concurrency = layout.concurrency(kv_bytes, max_model_len, batched)
    longest = layout.longest_request(kv_bytes, batched, max_model_len)
    if kv_cache_gib > 0 and concurrency < 1:
        needed = layout.blocks_per_request(max_model_len, batched) * layout.group_size * \
            BLOCK_SIZE * layout.layer_bytes / GIB
        errors.append(
            f"max_model_len {max_model_len} needs {needed:.2f} GiB of KV cache per GPU but only "
            f"{kv_cache_gib:.2f} GiB is left (at most {longest:,} tokens fit); lower "
            "services[].max_model_len or raise gpu_memory_utilization"
        )
    typical = min(typical_request_tokens or DEFAULT_TYPICAL_REQUEST_TOKENS, max_model_len)
    typical_concurrency = layout.concurrency(kv_bytes, typical, batched)
    recommended, reason = _recommend_max_num_seqs(typical_concurrency, typical, default_seqs,
                                                  gpu_memory_gib)
    return CapacityReport(
        kv_bytes_per_token=layout.bytes_per_token,
        weights_gib=weights_per_gpu,
        weights_source=weights_source,
        gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel=tensor_parallel,
        kv_budget_gib=budget,
        activation_gib=activation,
        runtime_gib=runtime,
        cuda_graphs_gib=cuda_graphs,
        kv_cache_gib=kv_cache_gib,
        kv_cache_tokens=layout.tokens(kv_bytes),
        max_model_len=max_model_len,
        max_model_len_limit=model.derived_max_model_len,
        max_model_len_fit=longest,
        max_concurrency=concurrency,
        typical_request_tokens=typical,
        max_concurrency_typical=typical_concurrency,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        recommended_max_num_seqs=recommended,
        recommended_max_num_seqs_reason=reason,
        kv_cache_dtype=kv_cache_dtype,
        warnings=warnings,
        errors=errors,
    )


def _check_inputs(gpu_memory_gib: float, tensor_parallel: int, utilization: float,
                  max_model_len: int, kv_cache_dtype: str) -> None:
    if gpu_memory_gib <= 0:
        raise BadInput(f"gpu_memory_gib must be positive, not {gpu_memory_gib}",
                       fix="give the GPU's memory in GiB, e.g. 80")
    if tensor_parallel < 1:
        raise BadInput(f"tensor_parallel must be at least 1, not {tensor_parallel}",
                       fix="set tensor_parallel to the number of GPUs the service spans")
    if not 0 < utilization <= 1:
        raise BadInput(f"gpu_memory_utilization must be in (0, 1], not {utilization}",
                       fix=f"use a fraction such as {DEFAULT_GPU_MEMORY_UTILIZATION}")
    if max_model_len < 1:
        raise BadInput(f"max_model_len must be positive, not {max_model_len}",
                       fix="set max_model_len to the longest prompt + completion to serve")
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise BadInput(f"kv_cache_dtype {kv_cache_dtype!r} is not one vLLM accepts",
                       fix=f"use one of {', '.join(KV_CACHE_DTYPE_BYTES)}")


def _parallelism_errors(model: ModelInfo, tensor_parallel: int, warnings: list[str]) -> list[str]:
    """vLLM's start-up checks on splitting attention heads over GPUs."""
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if heads % tensor_parallel:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        return [
            f"total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tensor_parallel}); set services[].tensor_parallel to one of "
            f"{', '.join(map(str, divisors))}"
        ]
    if model.is_mla:  # one latent KV per token, kept whole on every GPU
        return []
    if kv_heads >= tensor_parallel and kv_heads % tensor_parallel:
        return [
            f"{kv_heads} KV heads cannot be split over tensor_parallel {tensor_parallel}; set "
            "services[].tensor_parallel to a divisor of the KV head count"
        ]
    if kv_heads < tensor_parallel and tensor_parallel % kv_heads:
        return [
            f"tensor_parallel {tensor_parallel} is not a multiple of the {kv_heads} KV heads; "
            "vLLM cannot replicate them evenly; change services[].tensor_parallel"
        ]
    if kv_heads < tensor_parallel:
        warnings.append(
            f"only {kv_heads} KV heads for tensor_parallel {tensor_parallel}: every GPU "
            "keeps a whole KV head, so KV bytes per token per GPU stop shrinking with more GPUs"
        )
    return []


def _weight_bytes(model: ModelInfo, weights_gib: float | None, quantization: str | None,
                  element_bytes: int, warnings: list[str]) -> tuple[float, str]:
    """Total weight bytes in GPU memory and where the number comes from."""
    if weights_gib is not None:
        return weights_gib * GIB, "given (--weights-gib)"
    runtime_quantization = quantization and not model.quantization
    if model.weights_bytes and not runtime_quantization:
        stored = 0.0
        for dtype, size in model.weights_bytes_by_dtype.items():
            is_float = dtype in ("float32", "float16", "bfloat16")
            scale = element_bytes / DTYPE_BYTES[dtype] if is_float and not model.quantization else 1
            stored += size * scale
        return (stored or model.weights_bytes), "safetensors headers"
    bits = model.quantization_bits
    method = model.quantization or quantization
    if method and not bits:
        bits = QUANTIZATION_BITS.get(method)
        if bits is None:
            warnings.append(f"unknown bits per weight for {method}; weights counted at 16 bits")
    if model.weights_bytes:
        warnings.append(f"runtime quantization {quantization}: weights estimated from the "
                        "config's parameter count, not from the checkpoint")
    embeddings = model.embedding_parameter_count
    if not bits or bits >= element_bytes * 8:
        return model.parameter_count * element_bytes, "estimated from config parameters"
    group = model.quantization_group_size
    per_weight = bits / 8 + (2 / group if group and group > 0 else 0)  # 16-bit scale per group
    quantized = (model.parameter_count - embeddings) * per_weight
    return quantized + embeddings * element_bytes, "estimated from config parameters"


def _activation_gib(model: ModelInfo, max_num_seqs: int, max_num_batched_tokens: int,
                    element_bytes: int) -> float:
    sampler = SAMPLER_LOGIT_COPIES * max_num_seqs * (model.vocab_size or 0) * 4
    forward = FORWARD_HIDDEN_COPIES * max_num_batched_tokens * model.hidden_size * element_bytes
    moe = 0.0
    if model.num_experts and model.num_experts_per_tok:
        moe = (MOE_DISPATCH_COPIES * max_num_batched_tokens * model.num_experts_per_tok
               * model.hidden_size * element_bytes)
    return (sampler + forward + moe) / GIB


def _recommend_max_num_seqs(typical_concurrency: float, typical_tokens: int, default_seqs: int,
                            gpu_memory_gib: float) -> tuple[int, str]:
    """As many sequences as typical requests fit in the KV cache, capped at vLLM's default."""
    fitting = math.floor(typical_concurrency)
    if fitting == 0:
        return 1, "no typical request fits in the KV cache (see the errors)"
    if fitting >= default_seqs:
        return default_seqs, (
            f"vLLM's default for a {gpu_memory_gib:g} GiB GPU; the KV cache holds {fitting} "
            f"requests of {typical_tokens} tokens, so the default never waits for KV blocks"
        )
    return max(1, fitting), (
        f"the KV cache holds {fitting} requests of {typical_tokens} tokens at once; more "
        f"sequences (vLLM's default is {default_seqs}) would only wait for KV blocks or be "
        "preempted and recomputed"
    )
