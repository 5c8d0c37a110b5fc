"""A service's LoRA adapters on this host: each declared adapter read without loading it
(adapter_config.json, the weights' safetensors header, their sha256), checked against its
service's base model, and the `vllm serve` flags that load them all at start (docs/adapters.md).

vLLM checks none of this before a request for the adapter arrives: a wrong base or a truncated
file is found by the first client, on every replica. Here it is found before anything starts.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import yaml

from kit.plan.capacity import LoraSlots
from kit.plan.modelinfo import read_safetensors_header
from kit.spec.model import Adapter, Service
from kit.spec.vllm_flags import choices, flag_table, flag_uses
from kit.weights.verify import file_sha256, tree_links_out

ADAPTER_CONFIG = "adapter_config.json"
SAFETENSORS_WEIGHTS = "adapter_model.safetensors"
PICKLE_WEIGHTS = "adapter_model.bin"  # vLLM loads it too; only its size and sha256 are checked
HUB_CACHE = "hub"  # under HF_HOME (hf_cache): models--<org>--<name>/snapshots/<commit>
# The LoRA flags kit derives from `adapters:`; extra_args may set them instead (its value wins).
DERIVED_FLAGS = ("--enable-lora", "--max-lora-rank", "--max-loras", "--max-cpu-loras")
MODULES_FLAG = "--lora-modules"  # name=path per adapter: vLLM loads them before /health answers
# What follows the adapter list goes in the service's --config file (kit/layout.py LORA_CONFIG),
# not in its replicas' command: --lora-modules and the slot counts derived from the count.
# --enable-lora and --max-lora-rank (vLLM sizes its buffers by it) stay in the command.
FILE_FLAGS = ("--max-loras", "--max-cpu-loras")
CONFIG_FLAG = "--config"  # vLLM: "Read CLI options from a config file" (YAML; CLI wins)
# vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with this set: rendered
# for a service with adapters, reached by kit inside the replica's container (kit adapters),
# never through the front door (kit/names.py refuses them there).
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@dataclass(frozen=True)
class AdapterInfo:
    """What one adapter's files say, and what vLLM would refuse or trip over in them."""

    folder: Path | None  # on this host; None: a Hub id vLLM downloads (nothing read)
    base: str | None = None  # adapter_config.json's base_model_name_or_path
    rank: int | None = None  # the largest rank of any module (r, rank_pattern)
    target_modules: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)
    local: bool = False  # a folder under models_root (not a Hub id's snapshot or download)
    outside: str | None = None  # a file reached through a link out of the mounted tree


def source_folder(adapter: Adapter, models_root: Path, hf_cache: Path | None) -> Path | None:
    """Where the adapter's files are on this host: a folder under models_root, a Hub adapter's
    snapshot of `revision` in hf_cache, or None (a Hub id vLLM downloads when it starts)."""
    local = models_root / adapter.path
    if "/" not in adapter.path or local.is_dir():
        return local
    if adapter.revision is None or hf_cache is None:
        return None
    return hub_snapshot(hf_cache, adapter.path, adapter.revision)


def hub_snapshot(cache: Path, repo: str, revision: str) -> Path:
    """The snapshot folder of `repo` at `revision` (a commit, or a branch its refs/ file names)
    in a Hugging Face cache, as huggingface_hub lays it out; it may not exist."""
    repo_dir = cache / HUB_CACHE / ("models--" + repo.replace("/", "--"))
    ref = repo_dir / "refs" / revision
    commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    return repo_dir / "snapshots" / commit


def read_adapter(folder: Path, sha256: str | None = None) -> AdapterInfo:
    """The adapter in `folder`: its config and weights checked, never loaded."""
    if not folder.is_dir():
        return AdapterInfo(folder, problems=[f"adapter folder {folder} does not exist"])
    problems: list[str] = []
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        config, problems = {}, [f"{folder} has no {ADAPTER_CONFIG}: not a PEFT LoRA adapter"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        config, problems = {}, [f"{folder / ADAPTER_CONFIG} cannot be read as JSON: {error}"]
    if not isinstance(config, dict):
        config, problems = {}, [f"{folder / ADAPTER_CONFIG} is not a JSON object"]
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type is {config['peft_type']!r}: vLLM serves LoRA adapters only")
    if config.get("use_dora"):
        problems.append("use_dora is true: vLLM does not serve DoRA adapters")
    rank = _rank(config, problems) if config else None
    targets = config.get("target_modules") or ()
    return AdapterInfo(folder, config.get("base_model_name_or_path"), rank,
                       (targets,) if isinstance(targets, str) else tuple(map(str, targets)),
                       problems + _weights_problems(folder, sha256))


def _rank(config: dict, problems: list[str]) -> int | None:
    """The largest rank vLLM must hold for this adapter: r, or a larger one of rank_pattern."""
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
               for rank in ranks):
        problems.append(f"r (and rank_pattern) must be positive whole numbers, not {ranks}")
        return None
    return max(ranks)


def _weights_problems(folder: Path, sha256: str | None) -> list[str]:
    """The weights file complete (its safetensors header against its size) and, when the spec
    gives one, its sha256."""
    weights = folder / SAFETENSORS_WEIGHTS
    if not weights.is_file():
        weights = folder / PICKLE_WEIGHTS
        if not weights.is_file() or weights.stat().st_size == 0:
            return [f"{folder} has no {SAFETENSORS_WEIGHTS} (nor a non-empty {PICKLE_WEIGHTS})"]
    elif (problem := read_safetensors_header(weights)[1]) is not None:
        return [problem]
    if sha256 is not None:
        stat = weights.stat()
        found = _weights_sha256(weights, stat.st_size, stat.st_mtime_ns)
        if found != sha256:
            return [f"{weights.name} has sha256 {found}, not the {sha256} the spec gives: "
                    "another version of the adapter, or a corrupted copy"]
    return []


@cache
def _weights_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """A file's sha256, once per version of it (size and mtime are the key): validate, plan and
    render each read the adapters."""
    return file_sha256(path)


def same_base(declared: str | None, model: str, model_name_or_path: str | None = None) -> bool:
    """Whether an adapter trained on `declared` fits the service's `model`: the last part of the
    name (a Hub id's, a folder's), compared without case, matches the service's model or the
    name its config.json was saved from (`_name_or_path`). A missing base is not refused."""
    if not declared:
        return True
    candidates = {_last_part(model)} | ({_last_part(model_name_or_path)}
                                        if model_name_or_path else set())
    return _last_part(declared) in candidates


def model_name_or_path(model_dir: Path) -> str | None:
    """The name a local model's config.json was saved from (transformers' `_name_or_path`)."""
    try:
        saved = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    name = saved.get("_name_or_path") if isinstance(saved, dict) else None
    return name if isinstance(name, str) else None


def _last_part(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].casefold()


def flag_values(service: Service) -> dict[str, str]:
    """{canonical flag: last value} of the LoRA flags extra_args sets (as vLLM's parser: the
    last use wins; a boolean flag maps to the form written)."""
    values = {}
    for use in flag_uses(service.extra_args, flag_table()):
        if use.option is not None and use.option.canonical.startswith(("--enable-lora",
                                                                       "--max-lora", "--max-cpu")):
            values[use.option.canonical] = use.values[-1] if use.values else use.flag
    return values


def allowed_rank(rank: int) -> int | None:
    """The smallest --max-lora-rank vLLM accepts that holds `rank` (None: above its largest)."""
    fitting = [int(value) for value in choices("--max-lora-rank") if int(value) >= rank]
    return min(fitting) if fitting else None


def lora_slots(service: Service, infos: list[AdapterInfo]) -> LoraSlots | None:
    """The LoRA memory vLLM reserves for this service: --max-loras slots of --max-lora-rank
    (extra_args' values, else kit's); None without adapters. Rank 0: not known here. Its
    modules (--lora-target-modules) are extra_args' memory flags (kit/plan/fit.py)."""
    if not service.adapters:
        return None
    given = flag_values(service)
    ranks = [info.rank for info in infos if info.rank is not None]
    rank = (int(given["--max-lora-rank"]) if given.get("--max-lora-rank", "").isdigit()
            else allowed_rank(max(ranks)) if ranks and len(ranks) == len(infos) else None)
    slots = given.get("--max-loras", "")
    return LoraSlots(int(slots) if slots.isdigit() else len(service.adapters), rank or 0)


def service_adapters(service: Service, models_root: Path,
                     hf_cache: Path | None) -> list[AdapterInfo]:
    """Every adapter of the service as this host has it (a Hub id to download: not read)."""
    infos = []
    for adapter in service.adapters:
        folder = source_folder(adapter, models_root, hf_cache)
        info = read_adapter(folder, adapter.sha256) if folder else AdapterInfo(None)
        local = folder == models_root / adapter.path
        mounted = models_root if local else hf_cache
        infos.append(replace(info, local=local, outside=tree_links_out(mounted, folder)
                             if folder and mounted else None))
    return infos


def adapter_problems(service: Service, infos: list[AdapterInfo],
                     model_name_or_path: str | None) -> list[tuple[int, str, str]]:
    """(adapter index, problem, fix) for what vLLM would refuse when the adapter is first
    asked for: its files, a base other than the service's model, a rank it cannot hold."""
    given = flag_values(service).get("--max-lora-rank", "")
    limit = int(given) if given.isdigit() else max(int(value) for value in
                                                   choices("--max-lora-rank"))
    found = []
    for j, (adapter, info) in enumerate(zip(service.adapters, infos, strict=True)):
        if info.outside:
            found.append((j, f"adapter {adapter.name}: {info.outside}",
                          "copy the adapter's files into its folder (a link may point only "
                          "inside the tree vLLM's container mounts)"))
            continue
        found += [(j, problem, "replace the adapter's files (re-download or re-export it)")
                  for problem in info.problems]
        if not same_base(info.base, service.model, model_name_or_path):
            found.append((j, f"adapter {adapter.name} was trained on {info.base!r}, not on the "
                             f"service's model {service.model!r}",
                          "serve it on a service of that base model, or use the adapter "
                          "trained on this one"))
        if info.rank is not None and info.rank > limit:
            whose = "the service's" if given.isdigit() else "vLLM's largest"
            found.append((j, f"adapter {adapter.name} has rank {info.rank}, above {whose} "
                             f"--max-lora-rank {limit}",
                          f"raise --max-lora-rank in extra_args to {allowed_rank(info.rank)}"
                          if allowed_rank(info.rank) else
                          f"vLLM holds ranks up to {limit}: retrain the adapter at a lower rank"))
        if info.local and adapter.revision:
            found.append((j, f"revision {adapter.revision} is read for a Hub adapter only; "
                             f"{adapter.path} is a folder under models_root",
                          "remove revision (the folder is what vLLM loads)"))
        if (info.folder is None and "/" in adapter.path
                and (adapter.revision or adapter.sha256)):
            found.append((j, f"adapter {adapter.name}: {adapter.path} is a Hub id whose "
                             f"revision {adapter.revision or '(unset)'} is not in hf_cache, so "
                             "kit cannot check its sha256 nor pin its revision (vLLM's "
                             "--lora-modules takes neither)",
                          "download it into hf_cache first (huggingface-cli download "
                          f"{adapter.path} --revision <commit> --cache-dir <hf_cache>/hub) and "
                          "name that revision"))
    return found


def command_modules(command: tuple[str, ...] | list[str]) -> dict[str, str]:
    """{adapter name: path in the container} a `vllm serve` command loads at start (the values
    of its --lora-modules, `name=path`, up to the next flag)."""
    modules: dict[str, str] = {}
    taking = False
    for part in command:
        if part.startswith("--"):
            taking = part == MODULES_FLAG
        elif taking:
            name, _, path = part.partition("=")
            modules[name] = path
    return modules


def declared_modules(command: tuple[str, ...] | list[str],
                     config_text: Callable[[], str]) -> dict[str, str]:
    """{adapter name: path} a replica loads at start: its command's --lora-modules, else (vLLM
    puts the command after the file: the command wins) those of its --config file, whose text
    `config_text` reads (kit's adapters.yaml, lora/<service>/ in the site folder)."""
    modules = command_modules(command)
    if modules or CONFIG_FLAG not in command:
        return modules
    document = yaml.safe_load(config_text()) or {}
    items = document.get(MODULES_FLAG.removeprefix("--")) if isinstance(document, dict) else None
    return command_modules([MODULES_FLAG, *map(str, items or [])])
