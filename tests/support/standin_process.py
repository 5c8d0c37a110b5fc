"""The vLLM stand-in (tests/standin) run as a local process on a free loopback port, for the
tests of the stand-in itself and of `kit bench`'s client (no Docker)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.support.docker_engine import pick_free_port

STANDIN = Path(__file__).resolve().parents[1] / "standin"

# The model the reference start-up errors were produced with: Llama-3.1-8B's dimensions.
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}



def model_dir(root: Path, name: str, config: dict) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def standin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STANDIN_", "NVIDIA_", "CUDA_", "VLLM_"))}
    env.update(NVIDIA_VISIBLE_DEVICES="0", STANDIN_LOAD_SECONDS="0.2")
    env.update(extra)
    return env


def run_standin(*args: str, timeout: float = 15, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STANDIN / "vllm"), *args], env=standin_env(**env),
        capture_output=True, text=True, timeout=timeout,
    )


@contextmanager
def serving(*args: str, host: str = "127.0.0.1", port: int | None = None, **env: str):
    """A stand-in serving on `host` (a loopback address) and `port` (default: a free one);
    yields (port, process). Stops it with SIGTERM."""
    port = port or pick_free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN / "vllm"), "serve", *args, "--port", str(port),
         "--host", host],
        env=standin_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_listening(port, proc, host)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
        proc.stdout.close()


def wait_listening(port: int, proc: subprocess.Popen, host: str = "127.0.0.1",
                   timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError("stand-in did not listen in time")
