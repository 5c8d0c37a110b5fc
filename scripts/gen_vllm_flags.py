#!/usr/bin/env python3
"""Generate kit/data/vllm-serve-flags-<version>.json from the `vllm serve` option list.

The input is the list printed from vLLM's real argument parser (shared/reference/
vllm-<version>-serve-flags.txt). kit ships the JSON so `extra_args` can be checked against the
pinned vLLM version without vLLM installed.

    python3 scripts/gen_vllm_flags.py ../shared/reference/vllm-0.33.0-serve-flags.txt
"""

import json
import re
import sys
from pathlib import Path

# Values vLLM 0.33.0 accepts for options the list prints without choices (its config validators
# hold them): the quantization list is vLLM's own "Unknown quantization method" message.
QUANTIZATION_METHODS = [
    "awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "gguf", "gptq_marlin", "awq_marlin", "gptq", "humming", "compressed-tensors",
    "bitsandbytes", "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4",
    "gpt_oss_mxfp4", "deepseek_v4_fp8", "cpu_awq", "online", "fp8_per_tensor", "fp8_per_block",
    "int8_per_channel_weight_only", "mxfp8",
]
KV_CACHE_DTYPES = [
    "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
]
EXTRA_CHOICES = {"--quantization": QUANTIZATION_METHODS, "--kv-cache-dtype": KV_CACHE_DTYPES}

LINE = re.compile(r"^(?P<names>[^|]+?)\s*\|\s*default=(?P<default>.*?)\s*\|\s*(?P<kind>[^|]*)\|")


def parse(text: str) -> dict:
    version = re.search(r"vLLM (\d+\.\d+\.\d+)", text).group(1)
    options = []
    for raw in text.splitlines():
        if raw.startswith("#") or not raw.strip() or "(positional)" in raw:
            continue
        match = LINE.match(raw)
        if not match:
            raise SystemExit(f"unparsed line: {raw[:80]}")
        names = [n.strip() for n in match["names"].split(",")]
        kind = match["kind"].strip()
        choices_match = re.search(r"choices=\{([^}]*)\}", kind)
        choices = None
        if choices_match and not choices_match.group(1).endswith("..."):
            choices = sorted(c for c in choices_match.group(1).split(",") if c != "None")
        nargs = re.search(r"nargs=(\S+)", kind)
        options.append({
            "names": names,
            "takes_value": kind != "bool-flag",
            "nargs": nargs.group(1) if nargs else None,
            "choices": EXTRA_CHOICES.get(names[0], choices),
        })
    return {"version": version, "options": options}


def main() -> None:
    source = Path(sys.argv[1])
    data = parse(source.read_text())
    out = Path(__file__).resolve().parent.parent / "kit" / "data"
    target = out / f"vllm-serve-flags-{data['version']}.json"
    target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target} ({len(data['options'])} options)")


if __name__ == "__main__":
    main()
