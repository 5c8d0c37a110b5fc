"""vLLM 0.33's native multi-node mode as the stand-in imitates it (`--nnodes` > 1).

Every node runs `vllm serve` with the same model and sizes; the head (`--node-rank 0`) listens
on `--master-addr`:`--master-port` and waits until every other node has joined, workers
(`--headless`) connect there. A node that joins with another `--nnodes` or world size, or a rank
already taken, is refused. The head gives up after STANDIN_JOIN_TIMEOUT_S (default
`--distributed-timeout-seconds`, else 600) with torch's TCPStore text; a worker that cannot reach
the head gives up after the same time with torch's client-socket text. Once running, a node
whose peer goes away fails with NCCL's remote-error text (the whole model stops, as in vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from . import model

INTERFACE_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
NET = Path("/sys/class/net")


class JoinError(Exception):
    """The rendezvous failed; `lines` are what torch / Gloo / NCCL print."""

    def __init__(self, *lines: str):
        super().__init__(lines[-1])
        self.lines = lines


@dataclass(frozen=True)
class Role:
    nnodes: int
    rank: int
    master_addr: str
    master_port: int
    world: int
    timeout_s: float

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def hello(self) -> str:
        return f"rank={self.rank} nnodes={self.nnodes} world={self.world}\n"


def role(a: argparse.Namespace) -> Role | None:
    """This node's part, None when vLLM runs on one node."""
    if a.nnodes <= 1:
        return None
    default = a.distributed_timeout_seconds or 600
    timeout = float(os.environ.get("STANDIN_JOIN_TIMEOUT_S", default))
    world = a.tensor_parallel_size * a.pipeline_parallel_size
    return Role(a.nnodes, a.node_rank, a.master_addr, a.master_port, world, timeout)


def check_flags(a: argparse.Namespace) -> None:
    """Inconsistent multi-node flags, refused before anything starts (ParallelConfig)."""
    world = a.tensor_parallel_size * a.pipeline_parallel_size
    parallel = {"nnodes": a.nnodes, "node_rank": a.node_rank,
                "distributed_executor_backend": a.distributed_executor_backend}
    problem = None
    if a.nnodes < 1:
        problem = f"nnodes ({a.nnodes}) must be at least 1."
    elif not 0 <= a.node_rank < a.nnodes:
        problem = f"node_rank ({a.node_rank}) must be in [0, nnodes) with nnodes={a.nnodes}."
    elif a.node_rank > 0 and not a.headless:
        problem = f"node_rank {a.node_rank} > 0 runs no API server: start it with --headless."
    elif a.nnodes > 1 and a.distributed_executor_backend not in (None, "mp"):
        problem = ("nnodes > 1 is only supported by the multiprocessing backend "
                   f"(distributed_executor_backend='mp'), not {a.distributed_executor_backend!r}.")
    elif a.nnodes > 1 and world % a.nnodes:
        problem = (f"World size ({world}) must be divisible by nnodes ({a.nnodes}) for "
                   "multi-node multiprocessing.")
    if problem:
        raise model.ConfigError("ParallelConfig", problem, model.args_kwargs_repr(parallel))


def check_interfaces() -> None:
    """The interface Gloo and NCCL are told to use must exist on this node."""
    for name in INTERFACE_ENVS:
        value = os.environ.get(name)
        if value and not value.startswith("^") and "," not in value and not (NET / value).exists():
            raise JoinError(
                "RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/"
                f"device.cc:83] ifa != nullptr. Unable to find address for: {value}"
            )


class Head:
    """The rendezvous on the head: every worker rank must join before the model loads."""

    def __init__(self, me: Role):
        self.me = me
        self.peers: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.joined = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def wait_for_workers(self) -> None:
        self.server = await asyncio.start_server(self._join, self.me.master_addr,
                                                 self.me.master_port)
        try:
            await asyncio.wait_for(self.joined.wait(), self.me.timeout_s)
        except TimeoutError:
            raise JoinError(
                f"torch.distributed.DistStoreError: Timed out after {int(self.me.timeout_s) + 1} "
                f"seconds waiting for clients. {len(self.peers) + 1}/{self.me.nnodes} clients "
                "joined."
            ) from None

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode()
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        rank = int(fields.get("rank", "-1"))
        if (fields.get("nnodes") != str(self.me.nnodes) or fields.get("world") != str(self.me.world)
                or not 0 < rank < self.me.nnodes or rank in self.peers):
            writer.write(f"refused: the head runs nnodes={self.me.nnodes} "
                         f"world={self.me.world} with ranks {sorted(self.peers)} joined\n".encode())
            await writer.drain()
            writer.close()
            return
        self.peers[rank] = (reader, writer)
        writer.write(b"ok\n")
        await writer.drain()
        if len(self.peers) == self.me.nnodes - 1:
            self.joined.set()

    async def lost(self) -> int:
        """Waits until a worker goes away; returns its rank."""
        waits = {asyncio.ensure_future(reader.read()): rank
                 for rank, (reader, _) in self.peers.items()}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return waits[next(iter(done))]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for _, writer in self.peers.values():
            writer.close()


class Worker:
    """A headless node: joins the head, then runs until stopped or the head goes away."""

    def __init__(self, me: Role):
        self.me = me
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def join(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.me.timeout_s
        while True:
            try:
                self.reader, self.writer = await asyncio.open_connection(
                    self.me.master_addr, self.me.master_port)
                break
            except OSError:
                if loop.time() >= deadline:
                    after = f"{int(self.me.timeout_s * 1000)}ms"
                    where = f"({self.me.master_addr}, {self.me.master_port})"
                    text = f"The client socket has timed out after {after} while trying to " \
                           f"connect to {where}."
                    raise JoinError(f"[c10d] {text}",
                                    f"torch.distributed.DistNetworkError: {text}") from None
                await asyncio.sleep(0.2)
        self.writer.write(self.me.hello.encode())
        await self.writer.drain()
        answer = (await self.reader.readline()).decode().strip()
        if answer != "ok":
            raise JoinError(
                f"RuntimeError: node_rank {self.me.rank} of nnodes {self.me.nnodes} was refused "
                f"by the head at {self.me.master_addr}:{self.me.master_port}: {answer or 'closed'}"
            )

    async def lost(self) -> None:
        """Waits until the head goes away."""
        assert self.reader is not None
        await self.reader.read()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def peer_lost(peer: str) -> tuple[str, ...]:
    """What a node prints when another node of the model disappears (NCCL's remote error)."""
    return (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
        "c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL "
        "version 2.27.3",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.",
        "Last error:",
        f"socketProgressOpt: Call to recv from {peer} failed : Connection reset by peer",
    )
