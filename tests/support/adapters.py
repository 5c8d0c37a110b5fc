"""LoRA adapter folders as PEFT writes them (adapter_config.json + adapter_model.safetensors
with lora_A / lora_B tensors), whole or broken, and a site spec that declares them."""

import hashlib
import json
import struct
from pathlib import Path

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapter(folder: Path, *, base: str | None = "meta-llama/Llama-3.1-8B-Instruct",
                  rank: int = 16, targets: tuple[str, ...] = LLAMA_TARGETS, hidden: int = 64,
                  truncate: bool = False, peft_type: str = "LORA") -> str:
    """A PEFT LoRA adapter in `folder`; returns the sha256 of its weights file. `truncate`
    cuts the weights short, as an interrupted copy leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": peft_type, "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(targets), "base_model_name_or_path": base,
              "task_type": "CAUSAL_LM"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    data = adapter_weights(rank, targets, hidden)
    if truncate:
        data = data[: len(data) - rank * hidden * len(targets) * 2]
    (folder / "adapter_model.safetensors").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def adapter_weights(rank: int = 16, targets: tuple[str, ...] = LLAMA_TARGETS,
                    hidden: int = 64) -> bytes:
    """adapter_model.safetensors of zero lora_A [rank x hidden] and lora_B [hidden x rank]
    tensors (bf16) for each target module of one layer."""
    header: dict = {}
    offset = 0
    for module in targets:
        for part, shape in (("lora_A", [rank, hidden]), ("lora_B", [hidden, rank])):
            size = shape[0] * shape[1] * 2
            name = f"base_model.model.model.layers.0.self_attn.{module}.{part}.weight"
            header[name] = {"dtype": "BF16", "shape": shape,
                            "data_offsets": [offset, offset + size]}
            offset += size
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + bytes(offset)


def adapters_yaml(entries: list[dict]) -> str:
    """The `adapters:` key of a service (indented for the base spec's service), as flow YAML."""
    return "    adapters: " + json.dumps(entries) + "\n"
