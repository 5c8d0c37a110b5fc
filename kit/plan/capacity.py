"""How much KV cache a vLLM service gets per GPU, computed before a 5-minute start-up fails.

Pure: a ModelInfo and the service's numbers in, a CapacityReport out. The arithmetic follows
vLLM's V1 engine (see docs/capacity.md for the derivation and the accuracy table):

    budget     = gpu_memory_gib x gpu_memory_utilization
    kv_cache   = budget - weights_per_gpu - activation_peak - non_torch - cuda_graphs
    weights    = dense parts / tp + routed experts / tp (or, with EP, whole experts over
                 tp x dp GPUs)
    activation = max(sampler over max_num_seqs, forward over max_num_batched_tokens)
                 + fused-MoE workspace
    non_torch  = cuBLAS workspaces (+ NCCL's NVLink-SHARP buffers when GPUs talk over an
                 NVSwitch: the term that depends on the GPU model)
    bytes/tok  = layers x 2 x max(1, kv_heads // tp) x head_dim x kv_dtype_bytes
                 (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes, not / tp)

KV layout and the sliding-window accounting are exact, weights are exact from safetensors
headers; the activation, non-torch and CUDA-graph terms follow vLLM's rules with constants
chosen on the "fit" points of tests/data/kv_points.json only. Every term is reported with its
rule and the flags that change it (CapacityReport.terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kit.errors import BadInput
from kit.plan.modelinfo import DTYPE_BYTES, ModelInfo
from kit.spec.vllm_flags import choices

GIB = 1 << 30
BLOCK_SIZE = 16  # vLLM's default KV block size on CUDA
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM 0.33 default (0.9 before)
DEFAULT_TYPICAL_REQUEST_TOKENS = 2048  # prompt + completion of an ordinary chat turn

# Activation peak of vLLM's profiling run (gpu_model_runner.profile_run): one forward pass over
# max_num_batched_tokens tokens, then one sampler pass over max_num_seqs sequences. The two
# happen one after the other, so the peak is the larger of them; fused-MoE workspaces are
# cached between calls and add to both. Constants fitted only to the "fit" points of
# tests/data/kv_points.json (docs/capacity.md).
SAMPLER_LOGIT_COPIES = 3.75  # fp32 [max_num_seqs, vocab]: logits, probabilities, sort values
SAMPLER_HIDDEN_COPIES = 1.0  # the [max_num_batched_tokens, hidden] states still alive
FORWARD_HIDDEN_COPIES = 4.3  # [tokens, hidden] tensors alive beside the MLP's intermediate
# Memory outside PyTorch's allocator during the forward pass (cuBLAS workspaces; with tensor
# parallelism NCCL and custom all-reduce buffers), as logged by vLLM 0.19 on H100.
RUNTIME_GIB_SINGLE_GPU = 0.25
RUNTIME_GIB_TENSOR_PARALLEL = 2.1
# The 2.1 GiB are NCCL's NVLink SHARP (NVLS) buffers, which NCCL sets up only for GPUs on an
# NVSwitch that supports them: Hopper and Blackwell SXM boards. On PCIe cards, NVLink-bridge pairs
# (H100 NVL) and A100s, GPUs that talk keep about the single-GPU figure.
NVLS_GPU_MARKERS = ("h100", "h200", "h800", "h20", "b100", "b200", "b300")
NO_NVSWITCH_MARKERS = ("pcie", "nvl")
# vLLM >= 0.21 reserves its CUDA-graph estimate inside the budget. It logs it per mode as a
# first capture plus (captures - 1) x a per-graph cost; the totals logged for 51 captured sizes
# were 0.5-1.9 GiB, growing with the number of layers (piecewise graphs).
CUDA_GRAPH_BASE_GIB = 0.5  # at 51 captures, plus CUDA_GRAPH_PER_LAYER_GIB per layer
CUDA_GRAPH_PER_LAYER_GIB = 0.01
CUDA_GRAPH_FIRST_CAPTURE_GIB = 0.38  # both modes' first captures in the fit points' logs
CUDA_GRAPH_REFERENCE_CAPTURES = 51  # capture sizes up to 512, what the logged estimates used
MAX_CUDA_GRAPH_CAPTURE = 512  # vLLM captures batch sizes up to min(2 x max_num_seqs, 512)
# MXFP4 checkpoints (gpt-oss) quantize only the routed experts: 4-bit values plus one 8-bit
# scale per 32; vLLM's Hopper kernels pad each expert's dimensions to a multiple of 256.
EXPERTS_ONLY_METHODS = frozenset({"mxfp4", "gpt_oss_mxfp4"})
MXFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 32
MXFP4_PAD = 256

# vLLM's scheduler defaults by GPU (vllm.md): >=160 GiB, H100/H200 class, A100 and smaller.
LARGE_GPU_GIB = 160
HOPPER_CLASS_GIB = 70

# One entry per choice of vLLM's flag table (kit.spec.vllm_flags.choices, the one list of valid
# values; a test keeps these in step). A valid value missing here is planned with a fallback and a
# warning. Bytes per element vLLM computes in for each --dtype (None: the checkpoint's, at most 16
# bits).
DTYPE_RUN_BYTES: dict[str, int | None] = {
    "auto": None, "bfloat16": 2, "float16": 2, "half": 2, "float": 4, "float32": 4,
}
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,  # the model's dtype
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,  # DeepSeek MLA: fp8 latent plus a few scale/rope bytes per token
}
# Weight bits each --quantization method stores when the checkpoint does not say (None: the
# method's bits vary; the checkpoint's quantization_config must tell).
QUANTIZATION_BITS: dict[str, int | None] = {
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
    "fp_quant": None,
    "modelopt_mixed": None,
    "humming": None,
    "quark": None,
    "torchao": None,
    "inc": None,
    "online": None,
}


@dataclass(frozen=True)
class LoraSlots:
    """What vLLM reserves for LoRA adapters (--enable-lora): `slots` (--max-loras) adapters of
    rank `rank` (--max-lora-rank; 0: unknown) on the modules `targets` (--lora-target-modules;
    None: every module vLLM can adapt)."""

    slots: int
    rank: int
    targets: tuple[str, ...] | None = None


# The modules vLLM wraps for LoRA in a decoder layer (Hugging Face names): (input, output,
# which side tensor parallelism splits). A column-parallel module splits its output (lora_B),
# a row-parallel one its input (lora_A); the other matrix is whole on every GPU.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def lora_bytes(model: ModelInfo, lora: LoraSlots, tensor_parallel: int,
               element_bytes: int) -> float:
    """Bytes per GPU of vLLM's LoRA buffers: for every adapted module of every layer, `slots`
    pairs lora_A [rank x input] and lora_B [output x rank] in the model's dtype, the split side
    divided by tensor_parallel (docs/adapters.md)."""
    h, tp = model.hidden_size, tensor_parallel
    q = model.num_attention_heads * model.head_dim
    kv = model.num_key_value_heads * model.head_dim
    mlp = model.dense_mlp_width
    shapes = {  # module: (lora_A columns, lora_B rows) on one GPU
        "q_proj": (h, q / tp), "k_proj": (h, kv / tp), "v_proj": (h, kv / tp),
        "o_proj": (q / tp, h), "gate_proj": (h, mlp / tp) if model.gated_mlp else (0, 0),
        "up_proj": (h, mlp / tp), "down_proj": (mlp / tp, h),
    }
    wanted = set(LORA_MODULES) if lora.targets is None else {
        module for target in lora.targets for module in LORA_PACKED.get(target, (target,))}
    per_layer = sum(a + b for module, (a, b) in shapes.items() if module in wanted)
    return lora.slots * lora.rank * per_layer * model.num_hidden_layers * element_bytes


@dataclass(frozen=True)
class Term:
    """One line of the memory account: its size per GPU, vLLM's rule and what changes it."""

    name: str
    gib: float
    rule: str
    changed_by: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "gib": round(self.gib, 3), "rule": self.rule,
                "changed_by": self.changed_by}


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
    expert_parallel: bool = False
    lora_gib: float = 0.0  # vLLM's LoRA buffers (--max-loras x --max-lora-rank)
    terms: list[Term] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def overhead_gib(self) -> float:
        """Everything in the budget that is neither weights nor KV cache."""
        return self.activation_gib + self.runtime_gib + self.cuda_graphs_gib + self.lora_gib

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
                **({"lora_gib": round(self.lora_gib, 3)} if self.lora_gib else {}),
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
            "expert_parallel": self.expert_parallel,
            "terms": [term.to_json() for term in self.terms],
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
    return DTYPE_RUN_BYTES.get(dtype) or min(DTYPE_BYTES.get(model.torch_dtype, 2), 2)


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
    expert_parallel: bool = False,
    data_parallel: int = 1,
    lora: LoraSlots | None = None,
) -> CapacityReport:
    """Plan one service's memory on each of its GPUs the way vLLM will split it.

    `weights_gib` is the model's total weight size (split over the tensor-parallel GPUs) and
    overrides what the model directory says. `max_num_seqs` None means vLLM's default for the
    GPU (the overhead is then an upper bound for any smaller recommended value).
    `cuda_graphs_in_budget` False matches vLLM < 0.21, --enforce-eager or
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0. `expert_parallel` is --enable-expert-parallel:
    whole experts per GPU instead of a slice of every expert, spread over the tensor_parallel x
    `data_parallel` (--data-parallel-size) GPUs of the expert-parallel group.
    """
    _check_inputs(gpu_memory_gib, tensor_parallel, gpu_memory_utilization, max_model_len,
                  kv_cache_dtype)
    if data_parallel < 1:
        raise BadInput(f"data_parallel must be at least 1, not {data_parallel}",
                       fix="give --data-parallel-size as a whole number of replicas, e.g. 2")
    parallel = Parallelism(tensor_parallel, data_parallel, expert_parallel)
    warnings = list(model.warnings) + _unknown_vocabulary(dtype, kv_cache_dtype, quantization)
    errors = list(model.errors)
    errors.extend(_parallelism_errors(model, tensor_parallel, warnings))
    if quantization and quantization not in choices("--quantization"):
        errors.append(
            f"quantization {quantization!r} is not a vLLM method; set services[].quantization "
            f"to one of {', '.join(sorted(choices('--quantization')))} or leave it out"
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
    kv_dtype_bytes = KV_CACHE_DTYPE_BYTES.get(kv_cache_dtype) or element_bytes
    layout = kv_layout(model, tensor_parallel, kv_dtype_bytes)
    if layout.padding_layers:
        warnings.append(
            f"vLLM adds {layout.padding_layers} padding layers to group the "
            f"{layout.full_layers} full and {layout.sliding_layers} sliding-window layers; they "
            "take KV memory but hold nothing"
        )
    if layout.sliding_layers:
        assert model.sliding_window is not None  # ModelInfo: sliding layers come with a window
        warnings.append(
            f"{layout.sliding_layers} of {model.num_hidden_layers} layers use a "
            f"{model.sliding_window}-token sliding window: each request keeps at most "
            f"window - 1 + max_num_batched_tokens ({model.sliding_window - 1 + batched}) tokens "
            "of KV in those layers"
        )

    if expert_parallel and not model.num_experts:
        warnings.append("--enable-expert-parallel has no effect: the model has no experts")
    weights = _weights_per_gpu(model, weights_gib, quantization, element_bytes, parallel,
                               warnings)
    weights_per_gpu = weights.bytes / GIB
    peaks = _activation_peaks(model, seqs, batched, element_bytes, tensor_parallel,
                              expert_parallel)
    activation = peaks.total_gib
    runtime, runtime_rule = non_torch_gib(parallel.communicating_gpus, gpu_name)
    captures = cuda_graph_capture_count(seqs)
    cuda_graphs = (cuda_graph_gib(model.num_hidden_layers, captures)
                   if cuda_graphs_in_budget else 0.0)
    budget = gpu_memory_gib * gpu_memory_utilization
    adapters = lora_bytes(model, lora, tensor_parallel, element_bytes) / GIB if lora else 0.0
    if lora and not lora.rank:
        warnings.append("LoRA memory not counted: an adapter's rank is unknown on this host "
                        "(set --max-lora-rank in extra_args)")
    if lora and model.num_experts:
        warnings.append("LoRA memory counts attention and dense MLP modules, not the experts")
    kv_cache_gib = budget - weights_per_gpu - activation - runtime - cuda_graphs - adapters
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
            f"{activation + runtime + cuda_graphs + adapters:.1f} GiB exceed the "
            f"{budget:.1f} GiB budget "
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
    terms = [
        Term("budget", budget, f"gpu_memory_gib {gpu_memory_gib:g} x gpu_memory_utilization "
             f"{gpu_memory_utilization:g}", "--gpu-memory-utilization; the GPU"),
        Term("weights", weights_per_gpu, weights.rule,
             "the checkpoint, --quantization, --dtype, --tensor-parallel-size, "
             "--enable-expert-parallel"),
        Term("activation peak", activation, peaks.rule(seqs, batched),
             "--max-num-seqs, --max-num-batched-tokens (defaults depend on the GPU: "
             f"{default_seqs} / {default_batched} here), --tensor-parallel-size, "
             "--enable-expert-parallel"),
        Term("non-torch memory", runtime, runtime_rule,
             "--tensor-parallel-size, --enable-expert-parallel with --data-parallel-size; the "
             "GPU model (NVSwitch or not)"),
        Term("CUDA graphs", cuda_graphs,
             f"{captures} captured batch sizes (up to min(2 x max_num_seqs, "
             f"{MAX_CUDA_GRAPH_CAPTURE})) x {model.num_hidden_layers} layers"
             if cuda_graphs_in_budget else "not reserved inside the budget",
             "--enforce-eager, --max-num-seqs, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"),
        *([Term("LoRA adapters", adapters,
                f"{lora.slots} slots x rank {lora.rank} x (lora_A + lora_B of "
                f"{', '.join(lora.targets or LORA_MODULES)}) x {model.num_hidden_layers} layers",
                "--max-loras, --max-lora-rank, --lora-target-modules, services[].adapters")]
          if lora else []),
        Term("KV cache", kv_cache_gib, "budget - weights - activation - non-torch - CUDA "
             f"graphs{' - LoRA' if lora else ''} = {layout.tokens(kv_bytes):,} tokens of "
             f"{layout.bytes_per_token:,} B",
             "--kv-cache-dtype, --gpu-memory-utilization"),
    ]
    typical = min(typical_request_tokens or DEFAULT_TYPICAL_REQUEST_TOKENS, max_model_len)
    typical_concurrency = layout.concurrency(kv_bytes, typical, batched)
    recommended, reason = _recommend_max_num_seqs(typical_concurrency, typical, default_seqs,
                                                  gpu_memory_gib)
    return CapacityReport(
        kv_bytes_per_token=layout.bytes_per_token,
        weights_gib=weights_per_gpu,
        weights_source=weights.source,
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
        expert_parallel=expert_parallel,
        lora_gib=adapters,
        terms=terms,
        warnings=warnings,
        errors=errors,
    )


def _unknown_vocabulary(dtype: str, kv_cache_dtype: str, quantization: str | None) -> list[str]:
    """Values the pinned vLLM accepts that these tables lack: planned with a fallback, said so."""
    lookups = (
        ("--dtype", dtype, DTYPE_RUN_BYTES, "the checkpoint's dtype"),
        ("--kv-cache-dtype", kv_cache_dtype, KV_CACHE_DTYPE_BYTES, "the model's dtype"),
        ("--quantization", quantization, QUANTIZATION_BITS,
         "the checkpoint's quantization_config or 16 bits"),
    )
    return [
        f"kit has no size for {flag} {value}; planned with {fallback}"
        for flag, value, table, fallback in lookups
        if value in choices(flag) and value not in table
    ]


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
    if kv_cache_dtype not in choices("--kv-cache-dtype"):
        raise BadInput(f"kv_cache_dtype {kv_cache_dtype!r} is not one vLLM accepts",
                       fix=f"use one of {', '.join(choices('--kv-cache-dtype'))}")


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


@dataclass(frozen=True)
class Parallelism:
    """How one instance spreads over its GPUs: tensor-parallel ranks, data-parallel replicas and
    whether routed experts are split by tensor parallelism or placed whole (expert parallel)."""

    tensor: int
    data: int = 1
    expert_parallel: bool = False

    @property
    def expert_ranks(self) -> int:
        """GPUs sharing the routed experts: vLLM's expert-parallel group is TP x DP."""
        return self.tensor * self.data if self.expert_parallel else 1

    @property
    def communicating_gpus(self) -> int:
        """GPUs exchanging activations in every layer (all-reduce over TP, all-to-all over EP)."""
        return max(self.tensor, self.expert_ranks)

    def local_experts(self, experts: int) -> int:
        """Whole experts on the busiest GPU: vLLM gives the first experts % ranks GPUs one more."""
        return math.ceil(experts / self.expert_ranks)

    def describe(self) -> str:
        text = f"tensor_parallel {self.tensor}"
        if self.expert_parallel:
            text += (f", experts whole over {self.expert_ranks} expert-parallel GPU(s)"
                     + (f" (TP x data_parallel {self.data})" if self.data > 1 else ""))
        return text


@dataclass(frozen=True)
class Weights:
    """Weight bytes on the busiest GPU and how they were counted."""

    bytes: float
    source: str
    rule: str


def _weights_per_gpu(model: ModelInfo, weights_gib: float | None, quantization: str | None,
                     element_bytes: int, parallel: Parallelism, warnings: list[str]) -> Weights:
    """Weights on one GPU: dense parts split by TP, routed experts by TP or (with expert
    parallelism) whole experts per GPU, the busiest GPU holding ceil(experts / EP ranks)."""
    tensor_parallel = parallel.tensor
    expert_share = _expert_share(model, parallel)
    if weights_gib is not None:
        return Weights(weights_gib * GIB / tensor_parallel, "given (--weights-gib)",
                       f"{weights_gib:g} GiB / tensor_parallel {tensor_parallel}")
    runtime_quantization = quantization and not model.quantization
    if model.weights_bytes and not runtime_quantization:
        stored = 0.0
        for dtype, size in model.weights_bytes_by_dtype.items():
            is_float = dtype in ("float32", "float16", "bfloat16")
            scale = element_bytes / DTYPE_BYTES[dtype] if is_float and not model.quantization else 1
            stored += size * scale
        total = stored or model.weights_bytes
        experts = total * model.expert_parameter_count / max(model.parameter_count, 1)
        per_gpu = (total - experts) / tensor_parallel + experts * expert_share
        return Weights(per_gpu, "safetensors headers",
                       f"{total / GIB:.2f} GiB in the checkpoint, {parallel.describe()}")
    if model.weights_bytes:
        warnings.append(f"runtime quantization {quantization}: weights estimated from the "
                        "config's parameter count, not from the checkpoint")
    method = model.quantization or quantization
    bits = model.quantization_bits
    if method and not bits:
        bits = QUANTIZATION_BITS.get(method)
        if bits is None:
            warnings.append(f"unknown bits per weight for {method}; weights counted at 16 bits")
    unquantized = (model.embedding_parameter_count + model.vocab_padding_parameters
                   + model.vision_parameter_count)
    experts = model.expert_parameter_count
    linear = model.parameter_count - model.embedding_parameter_count \
        - model.vision_parameter_count - experts
    if method in EXPERTS_ONLY_METHODS:
        expert_bytes = _mxfp4_expert_bytes(model, parallel)
        dense_bytes = (unquantized + linear) * element_bytes
        return Weights(dense_bytes / tensor_parallel + expert_bytes,
                       "estimated from config parameters",
                       f"{method}: routed experts at 4.25 bits (padded to {MXFP4_PAD}), "
                       f"attention, router, embeddings at 16 bits; {parallel.describe()}")
    per_weight = float(element_bytes)
    if bits and bits < element_bytes * 8:
        group = model.quantization_group_size
        per_weight = bits / 8 + (2 / group if group and group > 0 else 0)  # 16-bit group scale
    dense = unquantized * element_bytes + linear * per_weight
    per_gpu = dense / tensor_parallel + experts * per_weight * expert_share
    linear_rule = (f"linear layers {method} at {per_weight * 8:.2f} bits, embeddings "
                   f"(vocabulary padded to 64) and vision tower at {element_bytes * 8} bits"
                   if per_weight < element_bytes else
                   f"all at {element_bytes * 8} bits (vocabulary padded to 64)")
    return Weights(per_gpu, "estimated from config parameters",
                   f"{model.parameter_count / 1e9:.2f} B parameters, {linear_rule}; "
                   f"{parallel.describe()}")


def _expert_share(model: ModelInfo, parallel: Parallelism) -> float:
    """Fraction of all routed-expert weights on the busiest GPU."""
    if not parallel.expert_parallel or not model.num_experts:
        return 1 / parallel.tensor
    return parallel.local_experts(model.num_experts) / model.num_experts


def _mxfp4_expert_bytes(model: ModelInfo, parallel: Parallelism) -> float:
    """MXFP4 experts on one GPU, each padded to MXFP4_PAD in both dimensions."""
    experts = model.num_experts or 0
    width = model.moe_intermediate_size or 0
    if not experts or not width:
        return 0.0
    hidden = _round_up(model.hidden_size, MXFP4_PAD)
    if parallel.expert_parallel:
        local, width = parallel.local_experts(experts), _round_up(width, MXFP4_PAD)
    else:
        local, width = experts, _round_up(math.ceil(width / parallel.tensor), MXFP4_PAD)
    per_expert = 3 * hidden * width  # gate and up (2 x width) plus down
    return model.moe_layers * local * per_expert * MXFP4_BYTES_PER_WEIGHT


def non_torch_gib(communicating_gpus: int, gpu_name: str | None) -> tuple[float, str]:
    """Memory outside PyTorch's allocator that vLLM's profiler charges, and why.

    One GPU: cuBLAS workspaces. GPUs that exchange activations add NCCL and custom all-reduce
    buffers; the large part are NCCL's NVLS buffers, present only on NVSwitch Hopper/Blackwell
    boards. An unknown GPU model is planned with them (the safe side: fewer tokens).
    """
    if communicating_gpus == 1:
        return RUNTIME_GIB_SINGLE_GPU, "cuBLAS workspaces (one GPU)"
    name = (gpu_name or "").lower()
    nvswitch = any(marker in name for marker in NVLS_GPU_MARKERS) and not any(
        marker in name for marker in NO_NVSWITCH_MARKERS)
    if nvswitch or not name:
        which = (f"{gpu_name}: NVSwitch" if name
                 else "GPU model unknown: NVSwitch assumed, the safe side")
        return RUNTIME_GIB_TENSOR_PARALLEL, (
            f"cuBLAS workspaces + NCCL NVLink-SHARP and custom all-reduce buffers over "
            f"{communicating_gpus} GPUs ({which})")
    return RUNTIME_GIB_SINGLE_GPU, (
        f"cuBLAS workspaces + small NCCL buffers over {communicating_gpus} GPUs ({gpu_name}: no "
        "NVSwitch, so no NCCL NVLink-SHARP buffers)")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ActivationPeaks:
    """The two phases of vLLM's profiling run and the MoE workspace beside both."""

    sampler_gib: float
    forward_gib: float
    moe_workspace_gib: float

    @property
    def total_gib(self) -> float:
        return max(self.sampler_gib, self.forward_gib) + self.moe_workspace_gib

    def rule(self, seqs: int, batched: int) -> str:
        phase = "sampler" if self.sampler_gib >= self.forward_gib else "forward"
        text = (f"max(sampler over {seqs} sequences {self.sampler_gib:.2f}, forward over "
                f"{batched} tokens {self.forward_gib:.2f}) -> {phase}")
        if self.moe_workspace_gib:
            text += f" + fused-MoE workspace {self.moe_workspace_gib:.2f}"
        return text


def _activation_peaks(model: ModelInfo, max_num_seqs: int, max_num_batched_tokens: int,
                      element_bytes: int, tensor_parallel: int,
                      expert_parallel: bool) -> ActivationPeaks:
    """vLLM's profile_run: the forward pass keeps hidden states and one MLP's intermediate
    (gate/up and activation, split by TP); the sampler's fp32 logits are gathered whole on
    every GPU; fused MoE caches [tokens x top-k x width] workspaces (full expert width when
    experts are whole per GPU)."""
    tokens, hidden = max_num_batched_tokens, model.hidden_size
    hidden_bytes = tokens * hidden * element_bytes
    sampler = (SAMPLER_LOGIT_COPIES * max_num_seqs * (model.vocab_size or 0) * 4
               + SAMPLER_HIDDEN_COPIES * hidden_bytes)
    matrices = 3 if model.gated_mlp else 2
    mlp = tokens * matrices * model.dense_mlp_width / tensor_parallel * element_bytes
    forward = mlp + FORWARD_HIDDEN_COPIES * hidden_bytes
    workspace = 0.0
    if model.num_experts and model.num_experts_per_tok and model.moe_intermediate_size:
        split = 1 if expert_parallel else tensor_parallel
        gate_up = 2 * model.moe_intermediate_size / split
        # gate/up output, activated half, down output: per routed token copy
        workspace = tokens * model.num_experts_per_tok * (gate_up * 1.5 + hidden) * element_bytes
    return ActivationPeaks(sampler / GIB, forward / GIB, workspace / GIB)


def cuda_graph_capture_count(max_num_seqs: int) -> int:
    """How many batch sizes vLLM captures: 1, 2, 4, then steps of 8 to 256, then of 16, up to
    min(2 x max_num_seqs, 512)."""
    largest = min(2 * max_num_seqs, MAX_CUDA_GRAPH_CAPTURE)
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, MAX_CUDA_GRAPH_CAPTURE + 1, 16)]
    return sum(1 for size in sizes if size <= largest)


def cuda_graph_gib(layers: int, captures: int) -> float:
    """vLLM's CUDA-graph estimate: the first capture plus a per-graph cost taken from the
    logged 51-capture totals."""
    at_reference = CUDA_GRAPH_BASE_GIB + CUDA_GRAPH_PER_LAYER_GIB * layers
    per_graph = (at_reference - CUDA_GRAPH_FIRST_CAPTURE_GIB) / (CUDA_GRAPH_REFERENCE_CAPTURES - 1)
    return CUDA_GRAPH_FIRST_CAPTURE_GIB + (captures - 1) * per_graph


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
