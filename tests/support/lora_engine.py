"""A fake engine whose vLLM replicas hold LoRA adapters as vLLM does (tests/support/fake_engine.py's
ReplicaEngine): each start loads its command's --lora-modules, else its --config file's (read
at that start from the folder mounted at LORA_MOUNT, as vLLM reads it); kit's curl in the
container reaches /metrics (vllm:lora_requests_info), /v1/models (adapters with their
parent), /v1/load_lora_adapter, /v1/unload_lora_adapter and a completion on an adapter (404
unless it is loaded): for `kit adapters`, `kit up` and the rolling update without Docker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from kit.engine.desired import ContainerConfig
from kit.engine.replica_client import CURL
from kit.layout import LORA_CONFIG, LORA_MOUNT
from kit.plan.adapters import declared_modules
from tests.support.fake_engine import ReplicaEngine

BASE = "beta"  # the served name every adapter's card names as parent (tests/support/sites.py)


class LoraEngine(ReplicaEngine):
    """`held`: container name → {adapter: path} its vLLM serves now; `refuse`: (container name,
    adapter) pairs whose load fails as vLLM reports an engine failure; `runtime_routes`: False
    for a vLLM started without VLLM_ALLOW_RUNTIME_LORA_UPDATING (FastAPI's 404)."""

    def __init__(self) -> None:
        super().__init__({})
        self.held: dict[str, dict[str, str]] = {}
        self.refuse: set[tuple[str, str]] = set()
        self.runtime_routes = True
        self.posts: list[tuple[str, str, str]] = []  # (container, route, adapter), in order
        self.answered: list[tuple[str, str]] = []  # (container, model) of each completion
        self.skip_at_start: set[str] = set()  # adapters a start does not load (vLLM would fail)
        self.watch: Callable[[], object] | None = None  # its value is kept with each POST
        self.seen: list[object] = []
        self._lock = threading.Lock()  # kit loads on every replica at once
        self.lora_folders: dict[str, Path | None] = {}  # container id → its adapters folder
        # container name → {adapter: /metrics reads for which a request on it still runs}
        self.busy: dict[str, dict[str, int]] = {}
        self.unloaded_busy: list[tuple[str, str]] = []  # unloads with a request on it running

    def create_container(self, name: str, config: ContainerConfig, labels: dict[str, str],
                         aliases: list[str]) -> str:
        container_id = super().create_container(name, config, labels, aliases)
        self.lora_folders[container_id] = next(
            (Path(m.source) for m in config.mounts if m.target == LORA_MOUNT), None)
        return container_id

    def start(self, container_id: str) -> None:
        super().start(container_id)
        container = self._get(container_id)
        folder = self.lora_folders.get(container_id)
        self.held[self._name(container_id)] = {
            name: path for name, path in declared_modules(
                container.argv, lambda: (folder / LORA_CONFIG).read_text() if folder else ""
            ).items() if name not in self.skip_at_start}

    def _name(self, container_id: str) -> str:
        return self.inspect(container_id)["Name"].lstrip("/")

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        if argv[:3] != ["sh", "-c", CURL]:
            return super().exec(container_id, argv)
        with self._lock:
            return self._answer(container_id, argv)

    def _answer(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        route = argv[4].split(":8000", 1)[1]
        name = self._name(container_id)
        held = self.held.setdefault(name, {})
        body = json.loads(argv[5]) if argv[5] else {}
        if route == "/v1/models":
            self._call("exec", argv[4])
            cards = [{"id": BASE, "parent": None}] + [{"id": a, "parent": BASE, "root": p}
                                                     for a, p in held.items()]
            return 0, json.dumps({"object": "list", "data": cards}) + "\n200"
        if route == "/metrics":  # vLLM's gauges: requests in flight, and on which adapters
            self._call("exec", argv[4])
            running = [a for a, left in self.busy.get(name, {}).items() if left > 0]
            for adapter in running:
                self.busy[name][adapter] -= 1
            return 0, (f'vllm:num_requests_running{{engine="0",model_name="{BASE}"}} '
                       f'{float(len(running))}\n'
                       f'vllm:num_requests_waiting{{engine="0",model_name="{BASE}"}} 0.0\n'
                       'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
                       'waiting_lora_adapters=""} 1.0e+09\n'
                       f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters='
                       f'"{",".join(running)}",waiting_lora_adapters=""}} 2.0e+09\n200')
        if route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            self._call("exec", argv[4])
            adapter = body["lora_name"]
            self.posts.append((name, route, adapter))
            self.seen.append(self.watch() if self.watch else None)
            if not self.runtime_routes:
                return 0, '{"detail":"Not Found"}\n404'
            if route == "/v1/unload_lora_adapter":
                if self.busy.get(name, {}).get(adapter, 0) > 0:
                    self.unloaded_busy.append((name, adapter))
                if held.pop(adapter, None) is None:
                    return 0, _error(f"The lora adapter '{adapter}' cannot be found.", 404)
                return 0, f"Success: LoRA adapter '{adapter}' removed successfully.\n200"
            if adapter in held:
                return 0, _error(f"The lora adapter '{adapter}' has already been loaded.", 400)
            if (name, adapter) in self.refuse:
                return 0, _error(f"Loading lora {adapter} failed: CUDA out of memory", 400)
            held[adapter] = body["lora_path"]
            return 0, f"Success: LoRA adapter '{adapter}' added successfully.\n200"
        model = body.get("model")
        if model is not None and model != BASE:
            self._call("exec", argv[4])
            self.answered.append((name, model))
            if model not in held:
                return 0, _error(f"The model `{model}` does not exist.", 404)
        return super().exec(container_id, argv)


def _error(message: str, status: int) -> str:
    return json.dumps({"error": {"message": message, "code": status}}) + f"\n{status}"
