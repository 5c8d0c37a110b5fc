"""kit plan: the KV-cache capacity of every service, before vLLM spends minutes finding out.

Two forms: `kit plan [SPEC]` plans each service of a spec; `kit plan --model-dir DIR ...`
plans one model directory with explicit numbers (stable flags and JSON keys for other tools).
Exit 2 when any service cannot start (the report is still printed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from kit.capacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KV_CACHE_DTYPE_BYTES,
    CapacityReport,
    plan_capacity,
)
from kit.errors import BadInput, ExitCode
from kit.modelinfo import ModelInfo, find_config, free_disk_gib, inspect_model_dir
from kit.plan import service_capacity

NVIDIA_SMI_QUERY = ["--query-gpu=index,memory.total,name", "--format=csv,noheader,nounits"]
DTYPES = ["auto", "bfloat16", "float16", "half", "float", "float32"]


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


@click.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model-dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Plan this model directory instead of a spec (config.json alone is enough).")
@click.option("--gpu-memory-gib", type=click.FloatRange(min=0, min_open=True),
              help="Memory of one GPU in GiB (default: nvidia-smi, smallest GPU).")
@click.option("--tensor-parallel", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
              default=DEFAULT_GPU_MEMORY_UTILIZATION, show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=1),
              help="Longest request in tokens (default: the model's limit, as vLLM does).")
@click.option("--kv-cache-dtype", type=click.Choice(list(KV_CACHE_DTYPE_BYTES)), default="auto",
              show_default=True)
@click.option("--quantization", help="vLLM --quantization method (default: the checkpoint's).")
@click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1),
              help="Default: vLLM's for the GPU size.")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Default: vLLM's for the GPU size (the recommendation may be lower).")
@click.option("--weights-gib", type=click.FloatRange(min=0, min_open=True),
              help="Total weight size in GiB, split over the tensor-parallel GPUs "
                   "(default: safetensors headers, else the config's parameter count).")
@click.option("--typical-request-tokens", type=click.IntRange(min=1),
              help="Prompt + completion of a typical request (default 2048).")
@click.option("--hf-cache", type=click.Path(file_okay=False, path_type=Path),
              help="Warn when this directory's disk has no room for another copy of the weights.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys) instead of text.")
@click.pass_context
def plan(ctx: click.Context, spec: Path | None, model_dir: Path | None, as_json: bool,
         hf_cache: Path | None, **numbers) -> None:
    """KV-cache capacity per GPU of each service in SPEC (default ./site.yaml), or of
    --model-dir with the numbers given; exit 2 if a service cannot start."""
    if model_dir is not None:
        if spec is not None:
            raise click.UsageError("give either SPEC or --model-dir, not both")
        failed = _plan_model_dir(model_dir, as_json, hf_cache, **numbers)
    else:
        given = [f"--{name.replace('_', '-')}" for name in [*numbers, "hf_cache"]
                 if name != "typical_request_tokens"
                 and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)} apply to --model-dir only; a spec "
                                   "plans each service with its own settings")
        failed = _plan_spec(spec or Path("site.yaml"), as_json, numbers["typical_request_tokens"])
    if failed:
        ctx.exit(ExitCode.BAD_INPUT)


def _plan_model_dir(model_dir: Path, as_json: bool, hf_cache: Path | None, *,
                    gpu_memory_gib: float | None, max_model_len: int | None, **options) -> bool:
    model = inspect_model_dir(model_dir, hf_cache_dir=hf_cache)
    gpu_name = None
    if gpu_memory_gib is None:
        gpus = query_gpus()
        if not gpus:
            raise BadInput(
                "no GPU size: --gpu-memory-gib was not given and nvidia-smi is not on PATH",
                fix="pass --gpu-memory-gib (e.g. 80 for an H100 80GB)",
            )
        smallest = min(gpus, key=lambda gpu: gpu.memory_gib)
        gpu_memory_gib, gpu_name = smallest.memory_gib, smallest.name
    length = max_model_len or model.derived_max_model_len or 2048  # vLLM's own fallback
    report = plan_capacity(model, gpu_memory_gib=gpu_memory_gib, max_model_len=length,
                           gpu_name=gpu_name, **options)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo("\n".join(_table(str(model_dir), model, report)))
    return bool(report.errors)


def _plan_spec(spec_path: Path, as_json: bool, typical_request_tokens: int | None) -> bool:
    from kit.spec import load_spec  # the spec form only; the standalone form needs no spec

    spec = load_spec(spec_path)
    detected = {gpu.index: gpu for gpu in query_gpus()} if _needs_nvidia_smi(spec) else {}
    results: dict[str, dict] = {}
    lines: list[str] = []
    failed = False
    for service in spec.services:
        title = f"service {service.name}: {service.model} on GPU {_join(service.gpus)}, " \
                f"tensor_parallel {service.tp}"
        model_dir = spec.models_root / service.model
        config = find_config(model_dir) if model_dir.is_dir() else None
        memory = [spec.gpu_memory_for(gpu) or _detected(detected, gpu) for gpu in service.gpus]
        problem = _unplannable(service.model, config, memory, spec.hf_cache)
        if problem:
            results[service.name] = {"planned": False, "reason": problem}
            lines += [title, f"  not planned: {problem}", ""]
            continue
        model = inspect_model_dir(model_dir)
        names = {detected[gpu].name for gpu in service.gpus if gpu in detected}
        try:
            report = service_capacity(
                model, service, min(memory), typical_request_tokens=typical_request_tokens,
                gpu_name=names.pop() if len(names) == 1 else None,
            )
        except BadInput as error:
            results[service.name] = {"planned": False, "reason": str(error)}
            lines += [title, f"  not planned: {error}", ""]
            failed = True
            continue
        notes = []
        if model.requires_trust_remote_code and not service.trust_remote_code:
            notes.append("the model has custom code (auto_map) but "
                         "services[].trust_remote_code is false")
        failed = failed or bool(report.errors)
        planned = report.to_json()
        planned["warnings"] += notes
        results[service.name] = {"planned": True, **planned}
        lines += [*_table(title, model, report, service.max_num_seqs),
                  *(f"  warning: {note}" for note in notes), ""]
    click.echo(json.dumps({"services": results}, indent=2) if as_json else "\n".join(lines))
    return failed


def _needs_nvidia_smi(spec) -> bool:
    return any(spec.gpu_memory_for(gpu) is None for s in spec.services for gpu in s.gpus)


def _detected(detected: dict[int, Gpu], index: int) -> float | None:
    gpu = detected.get(index)
    return gpu.memory_gib if gpu else None


def _unplannable(model_ref: str, config: Path | None, memory: list[float | None],
                 hf_cache: Path | None) -> str | None:
    """Why a service cannot be planned here, or None."""
    if config is None:
        room = (f"; {free_disk_gib(hf_cache):.1f} GiB free in hf_cache {hf_cache} for the "
                "download" if hf_cache else "")
        return (f"{model_ref} is not a model directory with config.json under models_root on "
                "this host (a Hugging Face id is downloaded by vLLM and cannot be inspected "
                f"beforehand){room}; copy the model there to plan it")
    if None in memory:
        return ("GPU memory unknown: set gpu_memory_gib in the spec or run kit plan on the GPU "
                "server (nvidia-smi)")
    return None


def _join(values) -> str:
    return ",".join(str(value) for value in values)


def _table(title: str, model: ModelInfo, report: CapacityReport,
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
                     f"CUDA graphs {report.cuda_graphs_gib:.2f})"),
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
    lines += [f"  warning: {warning}" for warning in report.warnings]
    lines += [f"  ERROR: {error}" for error in report.errors]
    return lines
