"""LoRA adapters as vLLM 0.33 serves them — the stand-in's teaching of vLLM's behaviour.

What is vLLM's (its sources): `--lora-modules name=path` (or JSON `{"name", "path",
"base_model_name"}`) loaded at start, and a failure there ends the server; each adapter is a
model of its own name in requests and in /v1/models (`root` its path, `parent` the base's served
name, `max_model_len` null); POST /v1/load_lora_adapter {lora_name, lora_path} and
/v1/unload_lora_adapter {lora_name} exist only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is 1/true;
a rank above --max-lora-rank and a folder without an adapter are refused. vLLM checks no base
model. What is the stand-in's own: the wording of a truncated weights file's refusal, the
programmed load time (STANDIN_LORA_LOAD_SECONDS, seconds each load takes), and a replica told to
fail a load: a file named after the adapter in STANDIN_LORA_REFUSE_DIR (default
/tmp/standin-lora-refuse, e.g. `docker exec REPLICA touch /tmp/standin-lora-refuse/NAME`) makes
its load fail as vLLM reports an engine failure while loading (400, `Loading lora NAME failed:
...`), on that replica only.
"""

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

REFUSE_DIR = "/tmp/standin-lora-refuse"  # the stand-in's own: a load of a NAME file here fails


class LoraError(Exception):
    """A refused adapter: vLLM's message, error type and HTTP status."""

    def __init__(self, message: str, err_type: str = "BadRequestError", status: int = 400):
        super().__init__(message)
        self.message, self.err_type, self.status = message, err_type, status


def runtime_updates() -> bool:
    """vLLM's envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING: "1" or "true", any case."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1",
                                                                                      "true")


def parse_modules(values: list[str] | None) -> list[tuple[str, str]]:
    """--lora-modules entries as (name, path): `name=path`, or a JSON object."""
    modules = []
    for value in values or []:
        if value.lstrip().startswith("{"):
            entry = json.loads(value)
            modules.append((str(entry["name"]), str(entry["path"])))
        else:
            name, _, path = value.partition("=")
            modules.append((name, path))
    return modules


@dataclass
class Adapters:
    """The adapters one server holds: loaded at start, then at runtime when allowed."""

    enabled: bool
    max_rank: int
    base: str  # the served name every adapter's `parent` names
    load_s: float = 0.0
    loaded: dict[str, str] = field(default_factory=dict)  # name -> path

    def check(self, name: str, path: str) -> None:
        """What vLLM's LoRA loader refuses (vLLM reads the adapter only when it is loaded)."""
        if not self.enabled:
            raise LoraError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        folder = Path(path)
        config_file = folder / "adapter_config.json"
        if not config_file.is_file():
            raise LoraError(f"Loading lora {name} failed: No adapter found for {path}",
                            "NotFoundError", 404)
        config = json.loads(config_file.read_text())
        rank = int(config.get("r", 0))
        if rank > self.max_rank:
            raise LoraError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_rank}.")
        weights = folder / "adapter_model.safetensors"
        if weights.is_file():
            data = weights.read_bytes()
            length = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
            header = json.loads(data[8:8 + length] or b"{}") if length else {}
            needed = max((entry["data_offsets"][1] for key, entry in header.items()
                          if key != "__metadata__"), default=0)
            if not length or len(data) - 8 - length < needed:
                raise LoraError(f"Loading lora {name} failed: Error while deserializing header: "
                                "incomplete metadata, file not fully covered")

    def load(self, name: str, path: str) -> None:
        if name in self.loaded:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.",
                            "InvalidUserInput")
        self.check(name, path)
        if (Path(os.environ.get("STANDIN_LORA_REFUSE_DIR", REFUSE_DIR)) / name).exists():
            raise LoraError(f"Loading lora {name} failed: CUDA out of memory. Tried to allocate "
                            "64.00 MiB (the stand-in was told to fail this load)")
        self.loaded[name] = path

    def unload(self, name: str) -> None:
        if name not in self.loaded:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del self.loaded[name]

    def cards(self) -> list[dict]:
        """/v1/models entries of the loaded adapters, as vLLM's LoRA model cards."""
        return [{"id": name, "root": path, "parent": self.base, "max_model_len": None}
                for name, path in self.loaded.items()]
