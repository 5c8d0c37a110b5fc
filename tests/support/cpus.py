"""The benchmarks' CPU split on a 2-core machine: the system under test on one CPU, the load
generators on the other, so a client's bursts never delay the server's timers (and the other
way round). Standard load-testing practice; it moves processes, it never touches a figure.

SERVER_CPU runs the vLLM stand-in's server process. CLIENT_CPUS run everything that makes load:
the calling script and what it starts (kit bench), the front door's containers (nginx, the
credential verifier: through their cpusets), and any process started inside the stand-in's
container besides the server (the `--compare-direct` client that kit bench runs there with
`docker exec`, health checks), which `ContainerSplit` moves as it appears. On a machine with
fewer than 2 CPUs nothing is moved.

The front door's own benchmarks (scripts/bench_frontdoor.py --h2 and --ledger, no Docker) split
the other way, as a real server is laid out: the door (nginx's masters and so every worker they
fork: the front door's and its verifier's) alone on DOOR_CPU, the load client and the stand-in
together on LOAD_CPUS — on a real server the clients are remote and the engine has cores of its
own, so the door shares a core with neither (`DoorSplit`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SERVER_CPU = 1
CLIENT_CPUS = {0}
DOOR_CPU = 1
LOAD_CPUS = {0}
POLL_S = 0.05  # how soon a process started in the server's container is moved to CLIENT_CPUS


def can_split() -> bool:
    return {SERVER_CPU, *CLIENT_CPUS} <= os.sched_getaffinity(0)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (a process that has just ended is skipped)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
    except (FileNotFoundError, ProcessLookupError):
        pass


def cgroup_procs(pid: int) -> Path:
    """The cgroup.procs file listing every process of `pid`'s container (cgroup v1 or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path == "/":  # the host's root: every process on the machine, not one container's
            continue
        if controllers == "cpuset":
            return Path("/sys/fs/cgroup/cpuset") / path.lstrip("/") / "cgroup.procs"
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.procs"
    raise RuntimeError(f"no cpuset cgroup for process {pid}")


class ContainerSplit:
    """While open: the server (the first process of container `server`) on SERVER_CPU, every
    other process of that container, the `others` containers and this process (with what it
    starts from now on) on CLIENT_CPUS. Closing gives this process its CPUs back."""

    def __init__(self, server, others: list) -> None:
        self.server_pid = int(server.attrs["State"]["Pid"])
        self.procs = cgroup_procs(self.server_pid)
        self.others = others
        self.mine = os.sched_getaffinity(0)
        self.moved: set[int] = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ContainerSplit:
        if can_split():
            os.sched_setaffinity(0, CLIENT_CPUS)
            for container in self.others:
                container.update(cpuset_cpus=",".join(map(str, sorted(CLIENT_CPUS))))
            pin(self.server_pid, {SERVER_CPU})
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()
        os.sched_setaffinity(0, self.mine)

    def _watch(self) -> None:
        while not self.stopped.wait(POLL_S):
            try:
                pids = {int(p) for p in self.procs.read_text().split()}
            except FileNotFoundError:
                return  # the container is gone
            for pid in pids - self.moved - {self.server_pid}:
                pin(pid, CLIENT_CPUS)
            self.moved = pids


class DoorSplit:
    """While open: nginx's master and workers (workers forked by a reload inherit it) on
    DOOR_CPU; the stand-in and this process, with the clients it starts from now on, on
    LOAD_CPUS. Closing gives this process its CPUs back; `describe` says where what runs."""

    def __init__(self, nginx_pids: set[int], standin_pid: int) -> None:
        self.nginx_pids = nginx_pids
        self.standin_pid = standin_pid
        self.mine = os.sched_getaffinity(0)
        self.split = {DOOR_CPU, *LOAD_CPUS} <= self.mine

    def __enter__(self) -> DoorSplit:
        if self.split:
            for pid in self.nginx_pids:
                pin(pid, {DOOR_CPU})
            pin(self.standin_pid, LOAD_CPUS)
            os.sched_setaffinity(0, LOAD_CPUS)
        return self

    def __exit__(self, *exc: object) -> None:
        os.sched_setaffinity(0, self.mine)

    def describe(self) -> str:
        if not self.split:
            return f"no CPU split (CPUs {sorted(self.mine)}): door, client and stand-in share them"
        load = ",".join(map(str, sorted(LOAD_CPUS)))
        return (f"nginx (masters + workers: the door, its verifier) alone on CPU {DOOR_CPU}; the "
                f"load client and the stand-in on CPU {load}")
