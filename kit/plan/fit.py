"""The capacity of each spec service on its GPUs: the one path `kit plan` and `kit render` share.

`kit render` plans with the GPU sizes the spec gives (so its output depends on the spec only);
`kit plan` adds what nvidia-smi reports on this host. Both call `service_capacity` below.
"""

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kit.errors import BadInput
from kit.plan.adapters import lora_slots, service_adapters
from kit.plan.api_servers import ApiServers, api_servers
from kit.plan.capacity import CapacityReport, LoraSlots, plan_capacity
from kit.plan.modelinfo import (
    NO_CHAT_TEMPLATE,
    ModelInfo,
    find_config,
    free_disk_gib,
    inspect_model_dir,
)
from kit.spec.model import Service, Spec
from kit.spec.replicas import gpu_layout
from kit.spec.vllm_flags import EMBED, flag_table, flag_uses
from kit.weights.lock import model_dir as weights_model_dir

NVIDIA_SMI_QUERY = ["--query-gpu=index,memory.total,name", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Gpu:
    index: int
    memory_gib: float
    name: str


def query_gpus(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[Gpu]:
    """The GPUs nvidia-smi reports on this host (empty when there is no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    result = run(["nvidia-smi", *NVIDIA_SMI_QUERY], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BadInput(
            f"nvidia-smi failed: {(result.stderr or result.stdout).strip()}",
            fix="give the GPU size with --gpu-memory-gib (or gpu_memory_gib in the spec)",
        )
    gpus = []
    for line in result.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) >= 2 and fields[0].isdigit():
            name = fields[2] if len(fields) > 2 else ""
            gpus.append(Gpu(int(fields[0]), float(fields[1]) / 1024, name))
    return gpus


def service_capacity(model: ModelInfo, service: Service, gpu_memory_gib: float,
                     lora: LoraSlots | None = None, **context) -> CapacityReport:
    """The capacity plan of one spec service on GPUs of this size (with `lora`, its adapters'
    slots: kit/plan/adapters.py; an embedding model answers no chat, so a missing chat template
    is no warning there)."""
    if service.task == EMBED:
        model = replace(model, warnings=[w for w in model.warnings if w != NO_CHAT_TEMPLATE])
    memory = _memory_flags(service.extra_args)
    targets = memory.pop("lora_targets", None)
    return plan_capacity(
        model,
        gpu_memory_gib=gpu_memory_gib,
        tensor_parallel=service.tp,
        gpu_memory_utilization=service.gpu_memory_utilization,
        max_model_len=service.max_model_len,
        kv_cache_dtype=service.kv_cache_dtype,
        quantization=service.quantization,
        dtype=service.dtype,
        max_num_seqs=service.max_num_seqs if service.max_num_seqs != "auto" else None,
        lora=replace(lora, targets=targets) if lora and targets else lora,
        **memory,
        **context,
    )


def _memory_flags(extra_args: list[str]) -> dict:
    """What the service's extra_args change in vLLM's memory account (the last use wins, as in
    vLLM's parser): eager mode, expert parallel over TP x DP ranks, the batched-token budget,
    the modules LoRA adapts."""
    settings: dict = {"cuda_graphs_in_budget": True}
    for use in flag_uses(extra_args, flag_table()):
        name = use.option.canonical if use.option else None
        number = int(use.values[-1]) if use.values and use.values[-1].isdigit() else None
        if name == "--enforce-eager":
            settings["cuda_graphs_in_budget"] = False
        elif name == "--enable-expert-parallel":
            settings["expert_parallel"] = use.flag != "--disable-expert-parallel"
        elif name == "--max-num-batched-tokens" and number:
            settings["max_num_batched_tokens"] = number
        elif name == "--data-parallel-size" and number:
            settings["data_parallel"] = number
        elif name == "--lora-target-modules" and use.values:
            settings["lora_targets"] = tuple(use.values)
    return settings


@dataclass(frozen=True)
class ServiceFit:
    """How one service fits its GPUs: the report, or why it could not be planned here."""

    service: Service
    model: ModelInfo | None = None
    report: CapacityReport | None = None
    unplanned: str | None = None  # why there is no report
    failed: bool = False  # the service cannot start (errors in the report, or refused)
    notes: list[str] = field(default_factory=list)
    api_servers: ApiServers | None = None  # its vLLM's API-server processes (kit plan of a spec)


def fit_service(spec: Spec, service: Service, detected: dict[int, Gpu] | None = None,
                **context) -> ServiceFit:
    """Plan `service` with the spec's GPU sizes, else those `detected` on this host."""
    detected = detected or {}
    model_dir = weights_model_dir(spec.models_root, service)
    config = find_config(model_dir) if model_dir.is_dir() else None
    memory = [spec.gpu_memory_for(gpu) or _detected_gib(detected, gpu) for gpu in service.gpus]
    if config is None:
        room = (f"; {free_disk_gib(spec.hf_cache):.1f} GiB free in hf_cache {spec.hf_cache} for "
                "the download" if spec.hf_cache else "")
        return ServiceFit(service, unplanned=(
            f"{service.model} is not a model directory with config.json under models_root on "
            "this host (a Hugging Face id is downloaded by vLLM and cannot be inspected "
            f"beforehand){room}; copy the model there to plan it"))
    if None in memory:
        return ServiceFit(service, unplanned=(
            "GPU memory unknown: set gpu_memory_gib in the spec or run kit plan on the GPU "
            "server (nvidia-smi)"))
    sizes = [gib for gib in memory if gib is not None]  # all of them: None returned above
    model = inspect_model_dir(model_dir)
    names = {detected[gpu].name for gpu in service.gpus if gpu in detected}
    try:
        report = service_capacity(
            model, service, min(sizes), gpu_name=names.pop() if len(names) == 1 else None,
            lora=lora_slots(service, service_adapters(service, spec.models_root, spec.hf_cache)),
            **context)
    except BadInput as error:
        return ServiceFit(service, model, unplanned=str(error), failed=True)
    notes = []
    if model.requires_trust_remote_code and not service.trust_remote_code:
        notes.append("the model has custom code (auto_map) but services[].trust_remote_code is "
                     "false")
    return ServiceFit(service, model, report, failed=bool(report.errors), notes=notes)


def _detected_gib(detected: dict[int, Gpu], index: int) -> float | None:
    gpu = detected.get(index)
    return gpu.memory_gib if gpu else None


def fit_spec(spec: Spec, **context) -> list[ServiceFit]:
    """Every service of the spec, asking nvidia-smi only when the spec leaves a GPU size open."""
    open_size = any(spec.gpu_memory_for(gpu) is None for s in spec.services for gpu in s.gpus)
    detected = {gpu.index: gpu for gpu in query_gpus()} if open_size else {}
    servers = api_servers(spec)
    return [replace(fit_service(spec, service, detected, **context),
                    api_servers=servers[service.name]) for service in spec.services]


def fit_model_dir(model_dir: Path, *, hf_cache: Path | None, gpu_memory_gib: float | None,
                  max_model_len: int | None, gpu_name: str | None = None,
                  **options) -> tuple[ModelInfo, CapacityReport]:
    """Plan one model directory with explicit numbers (`kit plan --model-dir`); `gpu_name` is the
    GPU model (nvidia-smi's when it is asked for the size and no name is given)."""
    model = inspect_model_dir(model_dir, hf_cache_dir=hf_cache)
    if gpu_memory_gib is None:
        gpus = query_gpus()
        if not gpus:
            raise BadInput(
                "no GPU size: --gpu-memory-gib was not given and nvidia-smi is not on PATH",
                fix="pass --gpu-memory-gib (e.g. 80 for an H100 80GB)",
            )
        smallest = min(gpus, key=lambda gpu: gpu.memory_gib)
        gpu_memory_gib, gpu_name = smallest.memory_gib, gpu_name or smallest.name
    length = max_model_len or model.derived_max_model_len or 2048  # vLLM's own fallback
    report = plan_capacity(model, gpu_memory_gib=gpu_memory_gib, max_model_len=length,
                           gpu_name=gpu_name, **options)
    return model, report


def fits_json(fits: list[ServiceFit]) -> dict:
    """`kit plan --json` of a spec: per service the report's keys, or why it is not planned."""
    services: dict[str, dict] = {}
    for fit in fits:
        servers = {"api_servers": fit.api_servers.to_json()} if fit.api_servers else {}
        if fit.report is None:
            services[fit.service.name] = {"planned": False, "reason": fit.unplanned, **servers}
            continue
        planned = fit.report.to_json()
        planned["warnings"] += fit.notes
        services[fit.service.name] = {"planned": True, **planned, **servers}
    return {"services": services}


def fits_text(fits: list[ServiceFit]) -> list[str]:
    """`kit plan` of a spec as text: one capacity table per service."""
    lines: list[str] = []
    for fit in fits:
        service = fit.service
        title = f"service {service.name}: {service.model} on {gpu_layout(service.gpus, service.tp)}"
        servers = [f"  api_servers  {fit.api_servers.line()}"] if fit.api_servers else []
        if fit.report is None or fit.model is None:
            lines += [title, f"  not planned: {fit.unplanned}", *servers, ""]
            continue
        lines += [*capacity_table(title, fit.model, fit.report, service.max_num_seqs),
                  *servers, *(f"  warning: {note}" for note in fit.notes), ""]
    return lines


def capacity_table(title: str, model: ModelInfo, report: CapacityReport,
                   max_num_seqs: int | str = "auto") -> list[str]:
    """The human-readable plan of one service (per GPU)."""
    limit = report.max_model_len_limit
    kib = report.kv_bytes_per_token / 1024
    seqs = (f"auto -> {report.recommended_max_num_seqs}: {report.recommended_max_num_seqs_reason}"
            if max_num_seqs == "auto" else
            f"{max_num_seqs} (set); recommended {report.recommended_max_num_seqs}: "
            f"{report.recommended_max_num_seqs_reason}")
    rows = [
        ("model", f"{', '.join(model.architectures) or model.model_type}, "
                  f"{model.num_hidden_layers} layers, {model.num_key_value_heads} KV heads"
                  + (", MLA" if model.is_mla else "")
                  + (f", {model.quantization}" if model.quantization else "")),
        ("budget", f"{report.gpu_memory_gib:.1f} GiB x {report.gpu_memory_utilization:g} = "
                   f"{report.kv_budget_gib:.2f} GiB per GPU"),
        ("weights", f"{report.weights_gib:.2f} GiB per GPU ({report.weights_source})"),
        ("overhead", f"{report.overhead_gib:.2f} GiB (activation {report.activation_gib:.2f}, "
                     f"runtime {report.runtime_gib:.2f}, "
                     f"CUDA graphs {report.cuda_graphs_gib:.2f}"
                     + (f", LoRA {report.lora_gib:.2f}" if report.lora_gib else "") + ")"),
        ("KV cache", f"{report.kv_cache_gib:.2f} GiB = {report.kv_cache_tokens:,} tokens "
                     f"({kib:g} KiB per token per GPU, {report.kv_cache_dtype})"),
        ("max_model_len", f"{report.max_model_len:,} (model limit "
                          f"{f'{limit:,}' if limit else 'unknown'}; longest that fits "
                          f"{report.max_model_len_fit:,})"),
        ("concurrency", f"{report.max_concurrency:.2f} requests of {report.max_model_len:,} "
                        f"tokens, {report.max_concurrency_typical:.2f} of "
                        f"{report.typical_request_tokens:,}"),
        ("max_num_seqs", seqs),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [title] + [f"  {name.ljust(width)}  {value}" for name, value in rows]
    lines.append("  memory account per GPU (vLLM's rule; what changes it):")
    term_width = max((len(term.name) for term in report.terms), default=0)
    lines += [f"    {term.name.ljust(term_width)}  {term.gib:8.2f} GiB  {term.rule}; "
              f"changed by {term.changed_by}" for term in report.terms]
    lines += [f"  warning: {warning}" for warning in report.warnings]
    lines += [f"  ERROR: {error}" for error in report.errors]
    return lines
