"""A fake engine whose vLLM replicas speak sleep mode (tests/support/fake_engine.py's
ReplicaEngine, plus /is_sleeping, /sleep, /wake_up and the level-2 reload, reached by kit's curl
in the container): for `kit sleep`, `kit wake` and `kit status` without Docker."""

from __future__ import annotations

import json

from kit.engine.replica_client import CURL
from kit.plan.waker import WAKER_PORT, ask_argv
from tests.support.fake_engine import ReplicaEngine


class SleepyEngine(ReplicaEngine):
    """Each replica container (by name) awake until slept; `fail_wake`: names whose wake answers
    500 (and logs vLLM's traceback); `no_dev_mode`: names whose vLLM has no dev routes (404)."""

    def __init__(self) -> None:
        super().__init__({})
        self.asleep: set[str] = set()
        self.fail_wake: set[str] = set()
        self.no_dev_mode: set[str] = set()
        self.posts: list[tuple[str, str]] = []  # (container name, path) of every POST
        self.asked: list[str] = []  # container names, one per GET /is_sleeping
        self.busy: dict[str, int] = {}  # container name → requests running (its /metrics)
        # The waker's answers by path (its container runs; None: it does not answer, as while
        # it starts) and the paths asked of it, in order.
        self.waker: dict[str, tuple[int, object]] | None = None
        self.waker_asked: list[str] = []

    def _waker(self, path: str) -> tuple[int, str]:
        self.waker_asked.append(path)
        if self.waker is None or path not in self.waker:
            return 1, "urllib.error.URLError: <urlopen error [Errno 111] Connection refused>"
        status, answer = self.waker[path]
        return 0, f"{status}\n{json.dumps(answer)}"

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        if argv[:3] == ask_argv("/", 1)[:3]:
            return self._waker(argv[3].split(f":{WAKER_PORT}", 1)[1])
        if argv[:3] != ["sh", "-c", CURL]:
            return super().exec(container_id, argv)
        path = argv[4].split(":8000", 1)[1]
        route = path.split("?")[0]
        name = self.inspect(container_id)["Name"].lstrip("/")
        if route == "/metrics" and name in self.busy:
            self._call("exec", argv[4])
            return 0, f'vllm:num_requests_running{{m="x"}} {self.busy[name]}.0\n200'

        if route not in ("/is_sleeping", "/sleep", "/wake_up", "/collective_rpc",
                         "/reset_prefix_cache"):
            return super().exec(container_id, argv)
        self._call("exec", argv[4])
        if name in self.no_dev_mode:
            return 0, '{"detail":"Not Found"}\n404'
        if route == "/is_sleeping":
            self.asked.append(name)
            return 0, json.dumps({"is_sleeping": name in self.asleep}) + "\n200"
        self.posts.append((name, path))
        if route == "/sleep":
            self.asleep.add(name)
        elif route == "/wake_up" and name in self.fail_wake:
            self.write_log(container_id, "Traceback (most recent call last):\n"
                           "RuntimeError: CUDA error: out of memory\n")
            return 0, "Internal Server Error\n500"
        elif route == "/wake_up":
            self.asleep.discard(name)
        return 0, "\n200"
