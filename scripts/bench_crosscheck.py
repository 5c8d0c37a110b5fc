#!/usr/bin/env python3
"""Cross-check of kit bench's client against an independent, widely used load tool: NVIDIA's
AIPerf (PyPI `aiperf`), same target, same arrival process, same request count, one run per
arrival mode — and against `vllm bench serve` in the lockstep and poisson modes when a `vllm`
with that command is on PATH (not here: kit never installs vLLM).

Why AIPerf: it installs here from PyPI without a GPU stack (guidellm pulls torch and the CUDA
wheels; vLLM's own bench client would mean installing vLLM, which kit must not need), and it
measures streamed chat completions with the same definitions (TTFT to the first token, inter-token
latency per request = (latency - TTFT) / (output tokens - 1), request latency). It goes in its own
virtualenv (~/.cache/kit-aiperf-venv, created on first use) so its pins never touch kit's.

The arrival modes, each as both tools produce it:
  lockstep  kit --arrival lockstep = AIPerf --concurrency N (every stream starts at once)
            = vllm bench serve --max-concurrency N
  poisson   kit --arrival poisson --request-rate R = AIPerf --request-rate R --arrival-pattern
            poisson = vllm bench serve --request-rate R (burstiness 1)
  spread    kit --arrival spread (stream i starts i/N of a request's duration later); AIPerf
            has no such start, its nearest is --concurrency N --concurrency-ramp-duration <one
            request's duration>: shown, not judged

The target is the vLLM STAND-IN (tests/standin, not vLLM) as a local process on loopback, with
its chunked prefill under a token budget (STANDIN_PREFILL_BUDGET, STANDIN_PREFILL_US_PER_TOKEN):
prompts cost time and share steps, so requests that arrive together queue behind each other's
prefills as on a GPU. AIPerf needs a tokenizer and nothing can be downloaded here (its `builtin`
one fetches its encoding), so the script builds a small word-level one with the `tokenizers`
package AIPerf brings (it only synthesises the prompts; token counts come from the server's
usage, --use-server-token-count). Its unknown-word token is the plain word `unk`: AIPerf's
prompts are then words the stand-in counts one token each, as it counts kit's (with `<unk>`
every one counted three, and prompts three times as long cost three times the prefill); the
server's mean prompt length during each tool's run is printed to show it.

    python3 scripts/bench_crosscheck.py [--concurrency 16] [--low 4] [--rate 10] [--requests 160]

Prints, per mode, both tools' medians, their ratios and the stand-in's own mean of each figure
during each tool's run (its /metrics histograms); then the collision: kit's TTFT p50 at --low
and at --concurrency streams, lockstep against spread. Exit 1 when a TTFT or TPOT median of the
lockstep or poisson mode differs by more than 5 %, or the lockstep collision does not show (or
shows in spread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.bench.analysis import SloBounds, StepResult, summarize  # noqa: E402
from kit.bench.client import Endpoint, Load, run_step  # noqa: E402
from kit.bench.run import prompt_text  # noqa: E402
from tests.support.sites import LLAMA_8B  # noqa: E402
from tests.support.standin_process import serving  # noqa: E402

VENV = Path.home() / ".cache" / "kit-aiperf-venv"
AIPERF = "aiperf==0.13.0"
SERVED = "tiny-chat"
INPUT_TOKENS, OUTPUT_TOKENS = 128, 32
# one token every 100 ms; each prompt token costs 200 us of a step (128 tokens: 25.6 ms), under
# the default budget of 8192 tokens a step. A request that arrives while a step runs joins the
# next one, as in vLLM; the 100 ms between steps leave the tools' own dispatch time (AIPerf's
# processes hand each request on) room to land a round's requests in the same step.
PROGRAMMED = {"STANDIN_TOKEN_INTERVAL_MS": "100", "STANDIN_PREFILL_BUDGET": "1",
              "STANDIN_PREFILL_US_PER_TOKEN": "200"}
BAR = 0.05
JUDGED = ("median_ttft_ms", "median_tpot_ms")
COLLISION = 2.0  # lockstep TTFT p50 grows at least this much from --low to --concurrency …
NO_COLLISION = 1.3  # … and spread's at most this much
SERVER_HISTOGRAMS = {"median_ttft_ms": "vllm:time_to_first_token_seconds",
                     "median_tpot_ms": "vllm:request_time_per_output_token_seconds",
                     "median_e2el_ms": "vllm:e2e_request_latency_seconds",
                     "prompt_tokens": "vllm:request_prompt_tokens"}
TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
words = [f"w{i}" for i in range(2000)]
vocab = {"unk": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="unk"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(sys.argv[1] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "unk",
           "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 8192},
          open(sys.argv[1] + "/tokenizer_config.json", "w"))
"""
# kit's key, AIPerf's metric, label
PAIRS = (("median_ttft_ms", "time_to_first_token", "TTFT p50 (ms)"),
         ("median_tpot_ms", "inter_token_latency", "TPOT / ITL per request p50 (ms)"),
         ("median_e2el_ms", "request_latency", "request latency p50 (ms)"))


def aiperf_venv() -> Path:
    binary = VENV / "bin" / "aiperf"
    if not binary.exists():
        print(f"installing {AIPERF} into {VENV} (first run only)", flush=True)
        venv.create(VENV, with_pip=True)
        subprocess.run([VENV / "bin" / "pip", "install", "-q", AIPERF], check=True)
    return binary


def kit_step(port: int, load: Load, requests: int) -> StepResult:
    endpoint = Endpoint(address="127.0.0.1", port=port, host=f"127.0.0.1:{port}", tls=False,
                        ca_file=None, authorization=None, model=SERVED,
                        prompt=prompt_text(INPUT_TOKENS), output_tokens=OUTPUT_TOKENS)
    step = summarize(asyncio.run(run_step(endpoint, load, requests)), SloBounds(1e9, 1e9))
    if step.failed or step.client_overloaded:
        raise SystemExit(f"kit bench's client: {step.failures or 'event loop lagging'}")
    return step


def aiperf_medians(binary: Path, work: Path, port: int, load_args: list[str],
                   requests: int, warmup: int) -> dict[str, float]:
    out = work / f"aiperf-{len(list(work.glob('aiperf-*')))}"
    command = [binary, "profile", "--model", SERVED, "--url", f"http://127.0.0.1:{port}",
               "--endpoint-type", "chat", "--streaming", *load_args,
               "--request-count", str(requests), "--warmup-request-count", str(warmup),
               "--prompt-input-tokens-mean", str(INPUT_TOKENS),
               "--prompt-output-tokens-mean", str(OUTPUT_TOKENS),
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
               "--tokenizer", str(work / "tokenizer"), "--random-seed", "1",
               "--output-artifact-dir", str(out), "--ui-type", "none",
               "--workers-max", "1", "--record-processors", "1"]  # 2 cores: leave the rest
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"aiperf exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
    export = out / "profile_export_aiperf.json"  # the summary (a copy sits under each phase)
    if not export.exists():
        export = sorted(out.rglob("profile_export_aiperf.json"))[0]
    data = json.loads(export.read_text())
    return {key: data[metric]["p50"] for key, metric, _ in PAIRS}


def vllm_bench_serve() -> str | None:
    """`vllm` on PATH with a `bench serve` sub-command (the stand-in has none)."""
    binary = shutil.which("vllm")
    if binary is None:
        return None
    probe = subprocess.run([binary, "bench", "serve", "--help"], capture_output=True, text=True)
    return binary if probe.returncode == 0 else None


def vllm_medians(binary: str, work: Path, port: int, load_args: list[str],
                 requests: int) -> dict[str, float]:
    """`vllm bench serve` with the random dataset at the same lengths; its result file names
    the medians as kit does."""
    name = f"vllm-{len(list(work.glob('vllm-*')))}.json"
    command = [binary, "bench", "serve", "--backend", "openai-chat", "--endpoint",
               "/v1/chat/completions", "--base-url", f"http://127.0.0.1:{port}", "--model",
               SERVED, "--tokenizer", str(work / "tokenizer"), "--dataset-name", "random",
               "--random-input-len", str(INPUT_TOKENS), "--random-output-len",
               str(OUTPUT_TOKENS), "--ignore-eos", "--num-prompts", str(requests), *load_args,
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir",
               str(work), "--result-filename", name, "--disable-tqdm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"vllm bench serve exited {result.returncode}:\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    data = json.loads((work / name).read_text())
    return {key: data[key] for key, _, _ in PAIRS}


def server_means(port: int) -> dict[str, float]:
    """The stand-in's own running sums (s) and counts of TTFT, TPOT and request latency."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        name, value = line.partition("{")[0], line.rsplit(" ", 1)[-1]
        if name.endswith(("_sum", "_count")) and name.removesuffix("_sum").removesuffix(
                "_count") in SERVER_HISTOGRAMS.values():
            found[name] = float(value)
    return found


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean of each histogram over one tool's run, in ms, and of the prompt tokens (warm-ups
    included)."""
    view = {}
    for key, name in SERVER_HISTOGRAMS.items():
        count = after[f"{name}_count"] - before[f"{name}_count"]
        scale = 1 if key == "prompt_tokens" else 1000
        view[key] = scale * (after[f"{name}_sum"] - before[f"{name}_sum"]) / max(count, 1)
    return view


def compare(mode: str, kit: dict[str, float], others: dict[str, dict[str, float]],
            servers: dict[str, dict[str, float]], judged_mode: bool = True) -> bool:
    """One mode's table; True when every judged median is within BAR of every other tool's
    (always for a mode shown, not judged)."""
    tools = list(others)
    print(f"\n{mode}")
    print(f"{'':34} {'kit bench':>10} " + " ".join(f"{t:>17}" for t in tools) +
          "   the server's mean during each run: " + " | ".join(["kit", *tools]))
    ok = True
    for key, _, label in PAIRS:
        cells = []
        for tool in tools:
            ratio = kit[key] / others[tool][key]
            judged = judged_mode and key in JUDGED
            good = abs(ratio - 1) <= BAR or not judged
            ok &= good
            verdict = "" if not judged else (" ok" if good else " NOT")
            cells.append(f"{others[tool][key]:>8.2f} x{ratio:.3f}{verdict:>4}")
        means = " | ".join(f"{servers[t][key]:.2f}" for t in ["kit", *tools])
        print(f"{label:34} {kit[key]:>10.2f} " + " ".join(cells) + f"   {means}")
    prompts = " | ".join(f"{servers[t]['prompt_tokens']:.1f}" for t in ["kit", *tools])
    print(f"{'prompt tokens (the server counted)':34} {'':>10} " + " ".join(
        f"{'':>17}" for _ in tools) + f"   {prompts}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--low", type=int, default=4, help="the collision's low concurrency")
    parser.add_argument("--rate", type=float, default=10.0, help="poisson requests per second")
    parser.add_argument("--requests", type=int, default=160)
    args = parser.parse_args()
    binary = aiperf_venv()
    vllm = vllm_bench_serve()
    c, n = args.concurrency, args.requests
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min) at the "
          f"start; {os.cpu_count()} CPUs" + ("" if vllm else "; vllm bench serve: not installed"))
    ok = True
    with tempfile.TemporaryDirectory(prefix="kit-crosscheck-") as tmp:
        work = Path(tmp)
        (work / "tokenizer").mkdir()
        subprocess.run([VENV / "bin" / "python", "-c", TOKENIZER, str(work / "tokenizer")],
                       check=True)
        model = work / "tiny"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(LLAMA_8B))
        # no access log: nobody reads the stand-in's output pipe, which would fill and stop it
        with serving(str(model), "--served-model-name", SERVED, "--max-num-seqs", "1024",
                     "--disable-uvicorn-access-log", **PROGRAMMED) as (port, _):
            low = {arrival: kit_step(port, Load(arrival, args.low), 4 * args.low)
                   for arrival in ("lockstep", "spread")}
            spread_duration = None
            modes = (("lockstep", Load("lockstep", c), ["--concurrency", str(c)],
                      ["--max-concurrency", str(c)], c),
                     ("poisson", Load("poisson", rate=args.rate, seed=1),
                      ["--request-rate", f"{args.rate:g}", "--arrival-pattern", "poisson"],
                      ["--request-rate", f"{args.rate:g}", "--burstiness", "1"], 1),
                     ("spread", Load("spread", c), None, None, c))
            high = {}
            for mode, load, aiperf_args, vllm_args, warmup in modes:
                start = server_means(port)
                step = kit_step(port, load, n)
                high[mode] = step
                kit = {key: getattr(step, key) for key, _, _ in PAIRS}
                servers = {"kit": server_view(start, server_means(port))}
                others = {}
                if aiperf_args is None:  # spread: a ramp from 1 to N over one request's time
                    spread_duration = step.median_e2el_ms / 1000
                    aiperf_args = ["--concurrency", str(c), "--concurrency-ramp-duration",
                                   f"{spread_duration:.2f}"]
                before = server_means(port)
                others["AIPerf"] = aiperf_medians(binary, work, port, aiperf_args, n, warmup)
                servers["AIPerf"] = server_view(before, server_means(port))
                if vllm and vllm_args:
                    before = server_means(port)
                    others["vllm bench"] = vllm_medians(vllm, work, port, vllm_args, n)
                    servers["vllm bench"] = server_view(before, server_means(port))
                label = (f"{mode}: {args.rate:g} requests/s (most in flight: "
                         f"{step.max_concurrency})" if mode == "poisson" else
                         f"{mode}: {c} streams" + (f", AIPerf ramp {spread_duration:.2f} s"
                                                   if mode == "spread" else ""))
                ok &= compare(f"{label}, {n} requests, {INPUT_TOKENS} in / {OUTPUT_TOKENS} out"
                              + ("" if mode != "spread" else " (not judged: no AIPerf equivalent)"),
                              kit, others, servers, judged_mode=mode != "spread")
    print(f"\nthe collision (kit's TTFT p50, {args.low} -> {c} streams): prefills queue when the "
          "streams arrive together")
    for arrival, bar, sign in (("lockstep", COLLISION, ">="), ("spread", NO_COLLISION, "<=")):
        grows = high[arrival].median_ttft_ms / low[arrival].median_ttft_ms
        good = grows >= bar if sign == ">=" else grows <= bar
        ok &= good
        print(f"  {arrival:9} {low[arrival].median_ttft_ms:8.2f} -> "
              f"{high[arrival].median_ttft_ms:8.2f} ms  x{grows:.2f} (bar {sign} x{bar:g}) "
              f"{'met' if good else 'NOT met'}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min) at the end")
    print("all bars met" if ok else "a bar was NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
