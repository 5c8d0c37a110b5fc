"""kit plan: the KV-cache capacity of every service, before vLLM spends minutes finding out.

Two forms: `kit plan [SPEC]` plans each service of a spec; `kit plan --model-dir DIR ...`
plans one model directory with explicit numbers (stable flags and JSON keys for other tools).
Exit 2 when any service cannot start (the report is still printed).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from kit.errors import ExitCode
from kit.plan.capacity import DEFAULT_GPU_MEMORY_UTILIZATION
from kit.plan.fit import capacity_table, fit_model_dir, fit_spec, fits_json, fits_text
from kit.spec.model import DEFAULT_SPEC
from kit.spec.vllm_flags import choices


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
@click.option("--kv-cache-dtype", type=click.Choice(choices("--kv-cache-dtype")), default="auto",
              show_default=True)
@click.option("--quantization", type=click.Choice(choices("--quantization")),
              help="vLLM --quantization method (default: the checkpoint's).")
@click.option("--dtype", type=click.Choice(choices("--dtype")), default="auto", show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1),
              help="Default: vLLM's for the GPU size.")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Default: vLLM's for the GPU size (the recommendation may be lower).")
@click.option("--expert-parallel/--no-expert-parallel", default=False, show_default=True,
              help="vLLM --enable-expert-parallel: whole experts per GPU over TP x DP ranks.")
@click.option("--data-parallel-size", type=click.IntRange(min=1), default=1,
              show_default=True,
              help="vLLM --data-parallel-size: replicas that share the experts with "
                   "--expert-parallel (each GPU's KV cache is its own).")
@click.option("--gpu-name",
              help="GPU model, e.g. 'NVIDIA H100 80GB HBM3' (default: nvidia-smi's); decides "
                   "whether multi-GPU NCCL buffers are NVSwitch-sized.")
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
        numbers["data_parallel"] = numbers.pop("data_parallel_size")
        model, report = fit_model_dir(model_dir, hf_cache=hf_cache, **numbers)
        click.echo(json.dumps(report.to_json(), indent=2) if as_json
                   else "\n".join(capacity_table(str(model_dir), model, report)))
        failed = bool(report.errors)
    else:
        given = [f"--{name.replace('_', '-')}" for name in [*numbers, "hf_cache"]
                 if name != "typical_request_tokens"
                 and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)} apply to --model-dir only; a spec "
                                   "plans each service with its own settings")
        from kit.site import Site

        site = Site.load(spec or DEFAULT_SPEC, check_capacity=False)  # the table shows misfits
        fits = fit_spec(site.spec, typical_request_tokens=numbers["typical_request_tokens"])
        click.echo(json.dumps(fits_json(fits), indent=2) if as_json else "\n".join(fits_text(fits)))
        failed = any(fit.failed for fit in fits)
    if failed:
        ctx.exit(ExitCode.BAD_INPUT)
