"""kit bench: the highest load a service carries within its SLO, through the front door."""

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kit.bench.analysis import DEFAULT_SLO
from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.errors import ExitCode
from kit.site import Site

if TYPE_CHECKING:
    from kit.bench.mix import MixOptions
    from kit.bench.run import BenchRun


def _positive_list(convert, what: str, example: str):
    """A click callback: comma-separated positive finite numbers, sorted, each once."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            values = tuple(convert(part) for part in value.split(","))
        except ValueError:
            values = ()
        if not values or not all(0 < v < float("inf") for v in values):
            raise click.BadParameter(f"{value!r}: give {what} separated by commas, e.g. {example}")
        return tuple(sorted(set(values)))

    return parse


@click.command()
@spec_argument
@click.option("--service", help="The service to measure (needed when the spec has several).")
@click.option("--slo-ttft-p95-ms", type=click.FloatRange(min=0, min_open=True),
              help="A step passes when p95 time to first token is at most this "
              f"[default: the service's slo.ttft_p95_ms, else {DEFAULT_SLO.ttft_p95_ms:g}].")
@click.option("--slo-tpot-p95-ms", type=click.FloatRange(min=0, min_open=True),
              help="... and p95 time per output token is at most this "
              f"[default: the service's slo.tpot_p95_ms, else {DEFAULT_SLO.tpot_p95_ms:g}].")
@click.option("--input-tokens", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Prompt length, as the server counts it (sized from its usage answer).")
@click.option("--output-tokens", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens generated per request (ignore_eos: exactly this many).")
@click.option("--arrival", type=click.Choice(["spread", "lockstep", "poisson"]),
              help="How requests arrive. spread: N streams in a closed loop, their starts "
              "spread over one request's duration (N users' steady state); lockstep: N streams "
              "all starting at once (vllm bench serve --max-concurrency N); poisson: an open "
              "loop at a request rate (vllm bench serve --request-rate R), where the search "
              "varies the rate [default: spread; poisson with --request-rate].")
@click.option("--workload", type=click.Choice(["random", "shared-prefix", "multiturn"]),
              default="random", show_default=True,
              help="What the prompts share (docs/benchmarks.md): random (nothing), shared-prefix "
                   "(a system prompt of --input-tokens words, then a 50-word question of its "
                   "own), multiturn (each stream a user of 8 turns on that system prompt, "
                   "re-sending the conversation with its answers).")
@click.option("--concurrency", metavar="LIST",
              callback=_positive_list(int, "positive integers", "1,4,16,64"),
              help="Run this grid (e.g. 1,4,16,64) instead of searching for the boundary.")
@click.option("--request-rate", metavar="LIST",
              callback=_positive_list(float, "positive request rates (per second)", "0.5,2,8"),
              help="Poisson arrival: run this grid of requests per second (e.g. 1,2,4) "
              "instead of searching for the highest rate within the SLO.")
@click.option("--requests-per-step", type=click.IntRange(min=1),
              help="Counted requests per step [default: max(100, 5 x concurrency)].")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True), default=10,
              show_default=True, help="Start no step after this long; what finished is kept.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Where bench.json/.csv/.png go [default: bench/ beside the spec].")
@click.option("--max-client-lag-ms", type=click.FloatRange(min=0, min_open=True), default=10,
              show_default=True, help="Stop when kit's own event loop runs this late (p90): "
              "beyond it the client, not the server, would set the latencies.")
@click.option("--compare-direct", is_flag=True,
              help="Also run each step straight at one replica inside the stack network, with "
              "front door / direct ratios.")
@click.option("--write-spec", is_flag=True,
              help="Write the recommended max_num_seqs into the spec (only a measured "
              "boundary: some step must have missed the SLO; else nothing is written, exit 1), "
              "changing no other byte; through a symlink, keeping mode and owner.")
@click.option("--mix", is_flag=True,
              help="Instead of the search: interactive streams alone, a batch credential "
              "($KIT_BENCH_BATCH_KEY, class batch) alone at twice the service's slots, then "
              "both; prints interactive p95 TTFT against idle, batch's share of what "
              "interactive leaves and batch's p99 wait (docs/policy.md).")
@click.option("--mix-seconds", type=click.FloatRange(min=1), default=30, show_default=True,
              help="--mix: how long each of its three phases runs.")
@click.option("--interactive-streams", type=click.IntRange(min=1), default=4,
              show_default=True, help="--mix: the interactive client's streams.")
@click.option("--mix-rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="--mix: rounds of the three phases, interleaved (a noisy machine).")
@wait_lock_option
@click.pass_context
def bench(ctx: click.Context, spec: Path, service: str | None, slo_ttft_p95_ms: float | None,
          slo_tpot_p95_ms: float | None, input_tokens: int, output_tokens: int,
          arrival: str | None, workload: str, concurrency: tuple[int, ...] | None,
          request_rate: tuple[float, ...] | None, requests_per_step: int | None,
          max_minutes: float, out: Path | None, max_client_lag_ms: float, compare_direct: bool,
          write_spec: bool, mix: bool, mix_seconds: float, interactive_streams: int,
          mix_rounds: int, wait_lock: float) -> None:
    """Find the most concurrent streams SPEC's service carries within the SLO, through the front
    door, and say what to set.

    Concurrency 1, 2, 4, ... until a step misses the SLO (p95 TTFT, p95 TPOT, or any failed
    request), then bisection until the boundary is known within 10 %; with --arrival poisson
    the same over request rates, from the rate one stream sustains. Metrics as `vllm bench
    serve` defines them. Exit 0 with an answer; 1 when the run stopped early (Ctrl-C, time, a
    client that could not keep up) — the finished steps are printed and written either way.
    Requests go as kit's probe identity, or with `Authorization: Bearer $KIT_BENCH_API_KEY` when
    that variable is set (a key from `kit keys add`).
    """
    from kit.bench.mix import MixOptions
    from kit.bench.report import charts_missing, table, write_outputs
    from kit.bench.run import BenchOptions, pick_service, run_bench, slo_for

    if mix and workload != "random":
        raise click.BadParameter("--mix measures batch beside interactive requests of its own "
                                 "shape; drop --workload", param_hint="--workload")
    if mix:
        _mix(ctx, spec, service, input_tokens, output_tokens, out,
             MixOptions(mix_seconds, interactive_streams, mix_rounds))
        return

    arrival = arrival or ("poisson" if request_rate else "spread")
    if request_rate and arrival != "poisson":
        raise click.BadParameter(f"a request rate is an open-loop load; --arrival {arrival} "
                                 "is a closed loop of streams: use --concurrency",
                                 param_hint="--request-rate")
    if concurrency and arrival == "poisson":
        raise click.BadParameter("--arrival poisson is driven by a request rate, not streams: "
                                 "use --request-rate", param_hint="--concurrency")
    skipped = charts_missing()  # no matplotlib: measured all the same, said before and after
    if skipped:
        click.echo(skipped)
    site = Site.load(spec, check_host=False)
    options = BenchOptions(
        service=service,
        slo=slo_for(pick_service(site, service), slo_ttft_p95_ms, slo_tpot_p95_ms),
        input_tokens=input_tokens,
        output_tokens=output_tokens, concurrency=concurrency, arrival=arrival,
        workload=workload,
        request_rates=request_rate,
        requests_per_step=requests_per_step, max_minutes=max_minutes,
        compare_direct=compare_direct, max_client_lag_ms=max_client_lag_ms,
    )
    run = run_bench(site, options, click.echo)
    click.echo(table(run))
    for path in write_outputs(run, out or site.layout.root / "bench", charts=skipped is None):
        click.echo(f"wrote {path}")
    if skipped:
        click.echo(skipped)
    if not run.answered:
        ctx.exit(ExitCode.FAILED)
    if write_spec:
        with holding(site.layout.root, "bench --write-spec", wait_lock):
            _write_spec(ctx, site, run)


def _mix(ctx: click.Context, spec: Path, service: str | None, input_tokens: int,
         output_tokens: int, out: Path | None, options: "MixOptions") -> None:
    """`--mix`: the interactive and batch classes at once (kit/bench/mix.py); exit 1 when a
    request failed (the door's 429s to batch are sent again, not failures)."""
    from kit.bench.mix import batch_authorization, mix_report, run_mix
    from kit.bench.run import BenchDoor, pick_service
    from kit.files import atomic_write

    site = Site.load(spec, check_host=False)
    chosen = pick_service(site, service)
    batch_authorization(site)  # exit 2 before anything is sent
    door = BenchDoor(site, chosen)
    endpoint = door.endpoint(door.sized_prompt(input_tokens), output_tokens)
    result = run_mix(site, chosen.name, endpoint, options, click.echo)
    click.echo(mix_report(result))
    folder = out or site.layout.root / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "mix.json", (json.dumps(result.to_json(), indent=1) + "\n").encode())
    click.echo(f"wrote {folder / 'mix.json'}")
    if result.failed:
        ctx.exit(ExitCode.FAILED)


def _write_spec(ctx: click.Context, site: Site, run: "BenchRun") -> None:
    """max_num_seqs into the spec only when a failing step bounds it; otherwise say why nothing
    was written and exit 1 (the command could not do what --write-spec asks)."""
    from kit.bench.spec_edit import write_max_num_seqs

    recommendation = run.recommendation
    if recommendation is None or recommendation.max_num_seqs is None:
        why = "no max_num_seqs meets the SLO"
    elif not recommendation.measured:
        why = (f"no step failed, so no boundary was measured (every step up to "
               f"{run.max_passing} streams met the SLO); raise --concurrency to find it")
    else:
        written = write_max_num_seqs(site.spec_path, run.service, recommendation.max_num_seqs)
        click.echo(f"{written}: max_num_seqs {recommendation.max_num_seqs} for {run.service}; "
                   "now run kit render && kit up")
        return
    click.echo(f"nothing written to the spec: {why}")
    ctx.exit(ExitCode.FAILED)
