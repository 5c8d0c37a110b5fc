"""kit/dataplane/waker/waker.py against stand-ins run as local processes (no Docker): each service's
one replica a stand-in in sleep mode on its own loopback address (127.0.0.2, 127.0.0.3, …) and one
shared port, as the replicas share vLLM's port on the backend network; the waker's config as kit
plans it (kit/plan/waker.py), with the times a test picks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kit.plan.waker import SWAP_IDLE_GRACE_S
from tests.support.docker_engine import pick_free_port
from tests.support.standin_calls import Answer, call
from tests.support.standin_process import LLAMA_8B, model_dir, serving

SLEEPY = {"VLLM_SERVER_DEV_MODE": "1", "STANDIN_SLEEP_SECONDS": "0.1",
          "STANDIN_WAKE_SECONDS": "0.3", "STANDIN_TOKEN_INTERVAL_MS": "5"}


def chat(name: str) -> dict:
    return {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


class Replicas:
    """The stand-ins by service name: their address, and calls to them."""

    def __init__(self, port: int, hosts: dict[str, str]) -> None:
        self.port = port
        self.hosts = hosts

    def call(self, service: str, method: str, path: str, body: object = None) -> Answer:
        return call(self.port, method, path, body, host=self.hosts[service])

    def account(self, service: str) -> dict:
        """The stand-in's own sleep account (its /standin/sleep: wakes, sleeps, held…)."""
        return self.call(service, "GET", "/standin/sleep").json()


@contextmanager
def sleepy_replicas(tmp_path: Path, services: list[str], *,
                    service_env: dict[str, dict[str, str]] | None = None,
                    **env: str) -> Iterator[Replicas]:
    """One stand-in per service, serving `<service>` in sleep mode, on 127.0.0.2, .3, …; `env`
    for every one, `service_env` by service name for that one alone."""
    port = pick_free_port()
    hosts = {name: f"127.0.0.{i + 2}" for i, name in enumerate(services)}
    with ExitStack() as stack:
        for name, host in hosts.items():
            model = model_dir(tmp_path, name, LLAMA_8B)
            _, proc = stack.enter_context(serving(
                str(model), "--served-model-name", name, "--max-model-len", "4096",
                "--enable-sleep-mode", host=host, port=port,
                **{**SLEEPY, **env, **(service_env or {}).get(name, {})}))
            # its log read as it comes (a benchmark's minutes of requests would fill the pipe
            # and stop the stand-in): nothing here reads it
            threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield Replicas(port, hosts)


def waker_config(replicas: Replicas, services: list[dict], **overrides: object) -> dict:
    """The waker's config (the keys kit/plan/waker.py renders) for `services`: each a dict of
    name, after (seconds), and optionally level, group, gpus, share, min_awake (seconds: 0,
    a swap at once, unless a test says otherwise)."""
    config = {
        "listen": "127.0.0.1", "port": pick_free_port(), "door": "127.0.0.1",
        "vllm_port": replicas.port, "wake_timeout": 20, "max_held": 64, "retry_after": 10,
        "share_limit": 0.95, "idle_grace": SWAP_IDLE_GRACE_S,
        "services": [{"replicas": [replicas.hosts[s["name"]]], "level": 1, "group": None,
                      "gpus": [0], "share": 0.9, "min_awake": 0, **s} for s in services],
    }
    return {**config, **overrides}


def as_argument(config: dict) -> str:
    return json.dumps(config)
