#!/usr/bin/env python3
"""Cross-check of kit bench's client against an independent, widely used load tool: NVIDIA's
AIPerf (PyPI `aiperf`), same target, same concurrency, same request count, one run.

Why AIPerf: it installs here from PyPI without a GPU stack (guidellm pulls torch and the CUDA
wheels; vLLM's own bench client would mean installing vLLM, which kit must not need), and it
measures streamed chat completions with the same definitions (TTFT to the first token, inter-token
latency per request = (latency - TTFT) / (output tokens - 1), request latency). It goes in its own
virtualenv (~/.cache/kit-aiperf-venv, created on first use) so its pins never touch kit's.

The target is the vLLM STAND-IN (tests/standin, not vLLM) as a local process on loopback with a
programmed TTFT and token pace. AIPerf needs a tokenizer and nothing can be downloaded here (its
`builtin` one fetches its encoding), so the script builds a small word-level one with the
`tokenizers` package AIPerf brings (it only synthesises the prompts; token counts come from the
server's usage, --use-server-token-count).

    python3 scripts/bench_crosscheck.py [--concurrency 16] [--requests 160]

Prints both tools' medians, their ratios and, beside them, the stand-in's own mean of each figure
during each tool's run (its /metrics histograms): which client adds what; exit 1 when a median
differs by more than 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.bench import Slo, summarize  # noqa: E402
from kit.bench_client import Endpoint, run_step  # noqa: E402
from kit.bench_run import prompt_text  # noqa: E402
from tests.conftest import LLAMA_8B  # noqa: E402
from tests.unit.test_standin import serving  # noqa: E402

VENV = Path.home() / ".cache" / "kit-aiperf-venv"
AIPERF = "aiperf==0.13.0"
SERVED = "tiny-chat"
INPUT_TOKENS, OUTPUT_TOKENS = 128, 32
PROGRAMMED = {"STANDIN_TTFT_MS": "100", "STANDIN_TOKEN_INTERVAL_MS": "20"}
BAR = 0.05
SERVER_HISTOGRAMS = {"median_ttft_ms": "vllm:time_to_first_token_seconds",
                     "median_tpot_ms": "vllm:request_time_per_output_token_seconds",
                     "median_e2el_ms": "vllm:e2e_request_latency_seconds"}
TOKENIZER = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
words = [f"w{i}" for i in range(2000)]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(sys.argv[1] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
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


def kit_medians(port: int, concurrency: int, requests: int) -> dict[str, float]:
    endpoint = Endpoint(address="127.0.0.1", port=port, host=f"127.0.0.1:{port}", tls=False,
                        ca_file=None, authorization=None, model=SERVED,
                        prompt=prompt_text(INPUT_TOKENS), output_tokens=OUTPUT_TOKENS)
    step = summarize(asyncio.run(run_step(endpoint, concurrency, requests)), Slo(1e9, 1e9))
    if step.failed or step.client_overloaded:
        raise SystemExit(f"kit bench's client: {step.failures or 'event loop lagging'}")
    return {key: getattr(step, key) for key, _, _ in PAIRS}


def aiperf_medians(binary: Path, work: Path, port: int, concurrency: int,
                   requests: int) -> dict[str, float]:
    out = work / "aiperf"
    command = [binary, "profile", "--model", SERVED, "--url", f"http://127.0.0.1:{port}",
               "--endpoint-type", "chat", "--streaming", "--concurrency", str(concurrency),
               "--request-count", str(requests), "--warmup-request-count", str(concurrency),
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
    print(f"AIPerf's summary: {export.relative_to(out)}")
    data = json.loads(export.read_text())
    return {key: data[metric]["p50"] for key, metric, _ in PAIRS}


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
    """Mean of each histogram over one tool's run, in ms (warm-ups included)."""
    view = {}
    for key, name in SERVER_HISTOGRAMS.items():
        count = after[f"{name}_count"] - before[f"{name}_count"]
        view[key] = 1000 * (after[f"{name}_sum"] - before[f"{name}_sum"]) / max(count, 1)
    return view


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=160)
    args = parser.parse_args()
    binary = aiperf_venv()
    with tempfile.TemporaryDirectory(prefix="kit-crosscheck-") as tmp:
        work = Path(tmp)
        (work / "tokenizer").mkdir()
        subprocess.run([VENV / "bin" / "python", "-c", TOKENIZER, str(work / "tokenizer")],
                       check=True)
        model = work / "tiny"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(LLAMA_8B))
        with serving(str(model), "--served-model-name", SERVED, "--max-num-seqs", "1024",
                     **PROGRAMMED) as (port, _):
            start = server_means(port)
            kit = kit_medians(port, args.concurrency, args.requests)
            middle = server_means(port)
            other = aiperf_medians(binary, work, port, args.concurrency, args.requests)
            kit_server, other_server = server_view(start, middle), server_view(middle,
                                                                              server_means(port))
    print(f"stand-in: TTFT {PROGRAMMED['STANDIN_TTFT_MS']} ms, one token every "
          f"{PROGRAMMED['STANDIN_TOKEN_INTERVAL_MS']} ms; {args.concurrency} streams, "
          f"{args.requests} requests, {INPUT_TOKENS} in / {OUTPUT_TOKENS} out tokens")
    print(f"{'':34} {'kit bench':>10} {'AIPerf':>10}  ratio        the server's mean during "
          "each run: kit | AIPerf")
    ok = True
    for key, _, label in PAIRS:
        ratio = kit[key] / other[key]
        good = abs(ratio - 1) <= BAR
        ok &= good
        print(f"{label:34} {kit[key]:>10.2f} {other[key]:>10.2f}  x{ratio:.3f} "
              f"({'within' if good else 'NOT within'} {BAR:.0%})  "
              f"{kit_server[key]:.2f} | {other_server[key]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
