"""One vLLM over several servers: what each node runs in vLLM 0.33's native multi-node mode.

vLLM's multiprocessing backend spans nodes by itself (no Ray): every node starts `vllm serve`
with the same model and parallel sizes plus `--nnodes`, its `--node-rank` and the head's
`--master-addr`/`--master-port`; the workers run `--headless` (no API server), the head serves
the API once every node has joined. Every flag here is in vLLM 0.33.0's `vllm serve` list
(tests/unit/plan/test_multinode.py checks them against kit/data/vllm-serve-flags-0.33.0.json).
"""

from dataclasses import dataclass

HEAD_RANK = 0
# Environment vLLM, NCCL and Gloo read: the node's own address and the interface they bind.
HOST_IP_ENV = "VLLM_HOST_IP"
INTERFACE_ENVS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@dataclass(frozen=True)
class NodePlan:
    name: str  # the fleet member (sibling spec) that runs this rank
    address: str
    rank: int

    @property
    def is_head(self) -> bool:
        return self.rank == HEAD_RANK


@dataclass(frozen=True)
class MultiNodePlan:
    nodes: list[NodePlan]  # rank order: the head first
    master_port: int
    interface: str | None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, None: NCCL picks one
    serve_args: list[str]  # the `vllm serve` arguments every node shares
    serve_env: dict[str, str]  # the environment every node shares (the spec's env)

    @property
    def head(self) -> NodePlan:
        return self.nodes[HEAD_RANK]

    @property
    def workers(self) -> list[NodePlan]:
        return self.nodes[HEAD_RANK + 1:]

    def args(self, node: NodePlan) -> list[str]:
        """The node's whole argv on host networking: the head serves the API on its own
        address only (reached by the front door), never on every interface of the host."""
        flags = node_flags(len(self.nodes), str(node.rank), self.head.address, self.master_port)
        return [*self.serve_args, *flags, *(["--host", node.address] if node.is_head else [])]

    def env(self, node: NodePlan) -> dict[str, str]:
        """The shared environment, the node's own address for vLLM, and the interface NCCL
        and Gloo must use."""
        env = {**self.serve_env, HOST_IP_ENV: node.address}
        if self.interface:
            env.update(dict.fromkeys(INTERFACE_ENVS, self.interface))
        return env


def node_flags(nnodes: int, rank: str, master_addr: str, master_port: int) -> list[str]:
    """The `vllm serve` flags that make one node of `nnodes` (`rank` may be a variable the
    orchestrator expands, as Kubernetes does with $(LWS_WORKER_INDEX)); workers are headless."""
    flags = [
        "--distributed-executor-backend", "mp",
        "--nnodes", str(nnodes),
        "--node-rank", rank,
        "--master-addr", master_addr,
        "--master-port", str(master_port),
    ]
    return flags if rank == str(HEAD_RANK) else [*flags, "--headless"]


def multinode_plan(service, serve_args: list[str], serve_env: dict[str, str]
                   ) -> MultiNodePlan | None:
    """The nodes of a spec service in rank order, None for a service on this server alone."""
    if service.nodes is None:
        return None
    return MultiNodePlan(
        nodes=[NodePlan(node.name, node.address, rank) for rank, node in enumerate(service.nodes)],
        master_port=service.master_port,
        interface=service.network_interface,
        serve_args=serve_args,
        serve_env=serve_env,
    )

