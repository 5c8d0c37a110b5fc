"""A service's replicas: its GPU list cut into tensor-parallel groups, each its own container.

`gpus: [0, 1, 2, 3]` with `tensor_parallel: 1` is four replicas pinned to 0, 1, 2 and 3; with
`tensor_parallel: 2` it is two, on [0, 1] and [2, 3]. A single-replica service keeps its own
name as compose service and DNS name (so a one-container site renders as it always did); the
replicas of a larger one are `<service>-r<index>`. One owner for that naming: the spec checks
names against it, the plan lays replicas out with it, status and probe group containers by it.
"""

from dataclasses import dataclass

REPLICA_SUFFIX = "-r"


@dataclass(frozen=True)
class ReplicaPlan:
    """One replica of a service: its index, the GPUs it is pinned to, and its compose name."""

    index: int
    gpus: list[str]
    host: str  # the compose service and DNS name of this replica's container


def replica_host(service: str, index: int, count: int) -> str:
    """The compose service (and DNS) name of replica `index` of `count`."""
    return service if count == 1 else f"{service}{REPLICA_SUFFIX}{index}"


def split_gpus(gpus: list[int], tensor_parallel: int) -> list[list[int]]:
    """Consecutive groups of `tensor_parallel` GPUs, in the order the spec lists them."""
    return [gpus[i:i + tensor_parallel] for i in range(0, len(gpus), tensor_parallel)]


def replica_plans(service: str, gpus: list[int], tensor_parallel: int) -> list[ReplicaPlan]:
    groups = split_gpus(gpus, tensor_parallel)
    return [
        ReplicaPlan(index, [str(gpu) for gpu in group], replica_host(service, index, len(groups)))
        for index, group in enumerate(groups)
    ]


def compose_names(service: str, count: int) -> list[str]:
    """Every compose service name a service with `count` replicas renders."""
    return [replica_host(service, index, count) for index in range(count)]


def gpu_layout(gpus: list[int], tensor_parallel: int) -> str:
    """How `kit plan` names a service's GPUs: its replicas' groups when it has several (each
    replica has the capacity the plan shows)."""
    groups = split_gpus(gpus, tensor_parallel)
    if len(groups) == 1:
        return f"GPU {','.join(map(str, gpus))}, tensor_parallel {tensor_parallel}"
    pins = " | ".join(",".join(map(str, group)) for group in groups)
    return (f"GPU {pins}: {len(groups)} replicas of tensor_parallel {tensor_parallel} "
            "(capacity per replica)")
