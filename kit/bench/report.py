"""What `kit bench` leaves behind: the terminal table, DIR/bench.json, DIR/bench.csv, DIR/bench.png
(throughput and p95 latencies against concurrency, SLO lines, the boundary) and
DIR/bench-pareto.png (tokens/s per user against tokens/s per GPU). Every file is written
atomically; matplotlib (the optional extra kit[plot]) draws off-screen (Agg), loaded through
kit.usage.plot.pyplot. Without it `kit bench` still measures and writes the table, JSON and
CSV; it says before the run and after it that the charts were skipped and how to get them
(`charts_missing`).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import ModuleType

from kit.bench.run import BenchRun
from kit.errors import BadInput
from kit.files import atomic_write
from kit.usage.plot import figure_png, pyplot

CSV_COLUMNS = (
    "arrival", "request_rate", "max_concurrency", "passed", "completed", "failed",
    "request_throughput", "output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "p95_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
    "client_lag_p90_ms",
)
SERVER_COLUMNS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                  "num_requests_waiting_capacity", "num_requests_waiting_deferred",
                  "waiting_with_slots_full", "waiting_with_free_slots", "num_preemptions")
ARRIVALS = {
    "spread": "spread (closed loop, the streams' starts spread over one request: N users' "
              "steady state)",
    "lockstep": "lockstep (closed loop, all streams start at once: vllm bench serve "
                "--max-concurrency)",
    "poisson": "poisson (open loop at a request rate, exponential gaps: vllm bench serve "
               "--request-rate, burstiness 1); streams = the most in flight",
}
DIRECT_COLUMNS = ("ratio_output_throughput", "ratio_median_ttft_ms", "ratio_median_tpot_ms")


def table(run: BenchRun) -> str:
    """The steps in concurrency order, then the answer and the recommendation."""
    direct = any(step.direct for step in run.steps)
    poisson = run.arrival == "poisson"
    head = (("  req/s " if poisson else "") + f"{'streams':>7} {'result':>6} {'ok':>5} "
            f"{'failed':>6} {'tok/s':>8} "
            f"{'TTFT p50':>9} {'TTFT p95':>9} {'TPOT p50':>9} {'TPOT p95':>9} {'running':>7} "
            f"{'waiting':>7} {'KV':>5}" + ("  front/direct tok/s TTFT TPOT" if direct else ""))
    lines = [f"arrival: {ARRIVALS[run.arrival]}", head]
    for step in sorted(run.steps, key=lambda s: s.level):
        server = step.server
        kv = server.get("kv_cache_usage_perc")
        rate = f"{step.request_rate:>7g} " if poisson else ""
        line = (f"{rate}{step.max_concurrency:>7} {'pass' if step.passed else 'FAIL':>6} "
                f"{step.completed:>5} {step.failed:>6} {step.output_throughput:>8.0f} "
                f"{step.median_ttft_ms:>9.1f} {step.p95_ttft_ms:>9.1f} "
                f"{step.median_tpot_ms:>9.2f} {step.p95_tpot_ms:>9.2f} "
                f"{_gauge(server.get('num_requests_running')):>7} "
                f"{_gauge(server.get('num_requests_waiting')):>7} "
                f"{'-' if kv is None else f'{kv:.0%}':>5}")
        if step.direct:
            d = step.direct
            line += (f"  x{d['ratio_output_throughput']:.3f} x{d['ratio_median_ttft_ms']:.3f} "
                     f"x{d['ratio_median_tpot_ms']:.3f}")
        lines.append(line)
        for cause, count in step.failures.items():
            lines.append(f"{'':>15}{count} failed: {cause}")
    result = run.to_json()
    slo = run.slo
    lines.append(f"SLO: TTFT p95 <= {slo.ttft_p95_ms:g} ms, TPOT p95 <= {slo.tpot_p95_ms:g} ms, "
                 "no failed request")
    unit = " requests/s" if poisson else ""
    lines.append(f"max_passing_concurrency {_value(run.max_passing)}{unit}, "
                 f"first_failing_concurrency {_value(run.first_failing)}{unit}, binding "
                 f"constraint {result['binding_constraint'] or '-'}")
    if run.recommendation:
        seqs = run.recommendation.max_num_seqs
        at_least = "" if run.recommendation.measured else "at least "
        lines.append(f"recommendation ({run.recommendation.knob}): max_num_seqs "
                     f"{at_least}{_value(seqs)} per replica — {run.recommendation.reason}")
    if run.stopped:
        lines.append(f"stopped early: {run.stopped}")
    return "\n".join(lines)


def _gauge(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def write_outputs(run: BenchRun, out: Path, *, charts: bool = True) -> list[Path]:
    """bench.json, bench.csv and (with `charts`: matplotlib is there) bench.png and
    bench-pareto.png in `out` (created if needed)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.csv"]
    atomic_write(paths[0], (json.dumps(run.to_json(), indent=1) + "\n").encode())
    atomic_write(paths[1], csv_text(run).encode())
    if charts:
        paths += [out / "bench.png", out / "bench-pareto.png"]
        atomic_write(paths[2], curve_png(run))
        atomic_write(paths[3], pareto_png(run))
    return paths


def csv_text(run: BenchRun) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *SERVER_COLUMNS, *DIRECT_COLUMNS, "failures"])
    for step in sorted(run.steps, key=lambda s: s.level):
        data = step.__dict__
        writer.writerow([
            *(data[key] for key in CSV_COLUMNS),
            *(step.server.get(key, "") for key in SERVER_COLUMNS),
            *((step.direct or {}).get(key, "") for key in DIRECT_COLUMNS),
            "; ".join(f"{n} {cause}" for cause, n in step.failures.items()),
        ])
    return buffer.getvalue()


CHARTS = "kit bench (bench.png, bench-pareto.png)"


def charts_missing() -> str | None:
    """None when matplotlib can draw the charts; else what the user is told: the charts are
    skipped, the figures are not, and how to get them."""
    try:
        drawing()
    except BadInput as missing:
        return (f"charts skipped: {missing.message}; the table, bench.json and bench.csv are "
                f"written all the same. For the charts: {missing.fix}")
    return None


def drawing() -> ModuleType:
    """matplotlib's pyplot for bench.png and bench-pareto.png; BadInput naming the extra when
    it is missing."""
    return pyplot(CHARTS)


def _figure(rows: int):
    plt = drawing()
    return plt, plt.subplots(rows, 1, figsize=(8, 3.2 * rows), sharex=rows > 1)


def curve_png(run: BenchRun) -> bytes:
    """Output tokens/s, p95 TTFT and p95 TPOT against concurrency (log 2 scale), the SLO as
    lines, the boundary as a band between the last pass and the first failure."""
    pyplot, (figure, axes) = _figure(3)
    steps = sorted(run.steps, key=lambda s: s.level)
    x = [s.level for s in steps]
    series = (("output tokens/s", [s.output_throughput for s in steps], None),
              ("TTFT p95 (ms)", [s.p95_ttft_ms for s in steps], run.slo.ttft_p95_ms),
              ("TPOT p95 (ms)", [s.p95_tpot_ms for s in steps], run.slo.tpot_p95_ms))
    for ax, (label, y, slo) in zip(axes, series, strict=True):
        ax.plot(x, y, marker="o", color="tab:blue")
        for step, value in zip(steps, y, strict=True):
            if not step.passed:
                ax.plot([step.level], [value], marker="x", color="tab:red", ms=10)
        if slo is not None:
            ax.axhline(slo, color="tab:red", linestyle="--", label=f"SLO {slo:g} ms")
            ax.legend(loc="upper left")
        if run.max_passing:
            ax.axvspan(run.max_passing, run.first_failing or run.max_passing, color="tab:orange",
                       alpha=0.25)
            ax.axvline(run.max_passing, color="tab:green", linestyle=":")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(f"requests per second ({run.arrival})" if run.arrival == "poisson"
                        else f"concurrent streams ({run.arrival})")
    axes[0].set_title(f"kit bench {run.service}: boundary {_value(run.max_passing)} "
                      f"(first failing {_value(run.first_failing)})")
    return figure_png(pyplot, figure)


def pareto_png(run: BenchRun) -> bytes:
    """Each step as (tokens/s per GPU, tokens/s per user): the trade-off concurrency buys."""
    pyplot, (figure, ax) = _figure(1)
    steps = sorted(run.steps, key=lambda s: s.level)
    per_gpu = [s.output_throughput / max(run.gpus, 1) for s in steps]
    per_user = [1000 / s.median_tpot_ms if s.median_tpot_ms else 0.0 for s in steps]
    ax.plot(per_gpu, per_user, marker="o", color="tab:blue")
    for step, gx, uy in zip(steps, per_gpu, per_user, strict=True):
        ax.annotate(f"{step.level:g}", (gx, uy), textcoords="offset points",
                    xytext=(4, 4), color="tab:blue" if step.passed else "tab:red")
    ax.axhline(1000 / run.slo.tpot_p95_ms, color="tab:red", linestyle="--",
               label="TPOT SLO as tokens/s per user")
    ax.legend(loc="upper right")
    ax.set_xlabel("output tokens/s per GPU")
    ax.set_ylabel("output tokens/s per user (1000 / TPOT p50)")
    unit = "requests/s" if run.arrival == "poisson" else "concurrent streams"
    ax.set_title(f"kit bench {run.service}: labels are {unit} (red: SLO missed)")
    ax.grid(True, alpha=0.3)
    return figure_png(pyplot, figure)
