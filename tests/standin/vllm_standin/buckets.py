"""`--custom-histogram-buckets`: vLLM 0.33's bucket families and the check of the JSON mapping.

Each family key replaces the bounds of a fixed group of histograms (vLLM's metrics docs,
"Custom Histogram Buckets"); bounds must be positive, finite and strictly increasing, and an
unknown family key is refused, as vLLM refuses it.
"""

from __future__ import annotations

import json
import math

FAMILIES = {
    "request_latency": (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ),
    "time_to_first_token": ("vllm:time_to_first_token_seconds",),
    "inter_token_latency": (
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ),
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    "request_params_n": ("vllm:request_params_n",),
    "request_tokens": (
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_prefill_kv_computed_tokens",
    ),
    "kv_cache_residency": (
        "vllm:kv_block_lifetime_seconds",
        "vllm:kv_block_idle_before_evict_seconds",
        "vllm:kv_block_reuse_gap_seconds",
    ),
}


def parse(text: str | None) -> dict[str, tuple[float, ...]]:
    """Histogram name → its bounds, from the flag's JSON; ValueError says what is wrong."""
    if text is None:
        return {}
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error}") from None
    if not isinstance(mapping, dict):
        raise ValueError("must be a JSON object mapping bucket-family keys to lists of bounds")
    bounds: dict[str, tuple[float, ...]] = {}
    for family, values in mapping.items():
        if family not in FAMILIES:
            raise ValueError(f"unknown bucket family {family!r}; known: {', '.join(FAMILIES)}")
        numbers = isinstance(values, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        )
        if not numbers or not values:
            raise ValueError(f"{family}: must be a non-empty list of numbers, got {values!r}")
        if not all(math.isfinite(v) and v > 0 for v in values) or any(
            b <= a for a, b in zip(values, values[1:], strict=False)
        ):
            raise ValueError(f"{family}: bounds must be positive, finite, strictly increasing")
        for name in FAMILIES[family]:
            bounds[name] = tuple(float(v) for v in values)
    return bounds
