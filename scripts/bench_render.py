#!/usr/bin/env python3
"""How long `kit render` of an 8-GPU, 4-service site takes in a fresh process (bar: < 0.5 s).

Renders into a temp folder twice per run: the first render creates credentials (a CA, bcrypt
hashes at cost 12 for the probe identity and one user), the second is the steady state an
operator sees when changing the spec. Prints the wall time of each, median of N runs.

    python3 scripts/bench_render.py [--runs 5]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
site: bench
domain: llm.bench.internal
models_root: {models}
tls: {{mode: self-signed}}
auth: {{users: [ops], api_keys: true}}
services:
  - {{name: llama70b, model: llama-70b, gpus: [0, 1, 2, 3], max_model_len: 32768,
      max_num_seqs: 256}}
  - {{name: qwen, model: qwen-7b, gpus: [4, 5], max_model_len: 16384, max_num_seqs: 128}}
  - {{name: small-a, model: mistral-7b, gpus: [6], max_num_seqs: 64}}
  - {{name: small-b, model: mistral-7b, served_name: small-b, gpus: [7], max_num_seqs: 64}}
"""


def timed_render(spec: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `kit render` in a fresh interpreter."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kit", "render", str(spec)], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    load = os.getloadavg()[0]
    first, steady, unchanged = [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            spec = Path(folder) / "site.yaml"
            spec.write_text(SPEC.format(models=Path(folder) / "models"))
            first.append(timed_render(spec))
            spec.write_text(spec.read_text().replace("max_num_seqs: 128", "max_num_seqs: 96"))
            steady.append(timed_render(spec))
            unchanged.append(timed_render(spec))
    print(f"kit render, 8 GPUs / 4 services, fresh process each, median of {runs} runs:")
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; wall includes waiting for")
    print("a core, CPU is what the render itself used")
    for label, times in (
        ("first render (CA, server cert, 2 bcrypt hashes)", first),
        ("spec changed (steady state)", steady),
        ("nothing changed", unchanged),
    ):
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        print(f"  {label:<50} wall {wall:.3f} s   CPU {cpu:.3f} s")
    wall = statistics.median(t[0] for t in steady)
    print(f"  bar: steady-state render < 0.5 s wall: {'met' if wall < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
