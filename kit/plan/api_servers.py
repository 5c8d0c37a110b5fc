"""How many API-server processes each service's vLLM runs (`--api-server-count`, docs/capacity.md).

vLLM 0.33 runs N API-server processes sharing the port over one engine core; the kernel hands
each new connection to one of them, so the per-chunk work (the usage in every chunk the door
asks for) is spread over N cores. `api_servers: auto` gives N only where the host's declared
cores hold it: every replica's engine core (and tensor-parallel workers) a core, the site's own
containers their share, and each API-server process a core of its own. With N >= 2 the door asks
usage on every chunk of every stream (kit/render/usage.py): an aborted stream's prompt is exact.
"""

import math
from dataclasses import dataclass

from kit.spec.model import Service, Spec

API_SERVER_FLAG = "--api-server-count"
# The site's own share of the host: the OS and Docker, the usage ledger's collector, the waker,
# door-figures and nginx's master (each well under a core, together about two).
SITE_CORES = 2
# nginx's workers per replica: ~38 us of CPU a token with the ledger on, 10,622 tokens/s on an
# H100 = 0.40 of a core (/work/shared/reference h100-costs.md), counted as half a core each.
NGINX_CORES_PER_REPLICA = 0.5
# One process was saturated at ~0.9 of a core at 256 streams on an H100; four hold the same
# load at under a quarter of a core each, room for 1,024 streams (vLLM's max_num_seqs on the
# largest GPUs). Beyond that the one engine core, not the API servers, bounds the throughput.
MAX_AUTO = 4


@dataclass(frozen=True)
class ApiServers:
    """One service's API-server processes per replica, and why (`kit plan` says it)."""

    count: int
    reason: str

    def to_json(self) -> dict:
        return {"count": self.count, "reason": self.reason}

    def line(self) -> str:
        return f"{self.count} ({self.reason})"

    @property
    def args(self) -> list[str]:
        """vLLM's flag, only when it is more than vLLM's own one (a site that does not use it
        renders as before)."""
        return [API_SERVER_FLAG, str(self.count)] if self.count > 1 else []


def _engine_processes(service: Service) -> int:
    """The busy processes of one replica's engine on this host: its engine core, and with
    tensor parallelism one GPU worker per GPU (a single GPU's runs inside the engine core)."""
    gpus = len(service.gpus) // service.replica_count
    return 1 + (gpus if gpus > 1 else 0)


def _fixed(service: Service, usage_on: bool, cpus: int | None) -> ApiServers | None:
    """A service's count when it is not the host's to share: set in the spec, or one."""
    if service.api_servers != "auto":
        return ApiServers(service.api_servers, "set in the spec")
    if service.adapters:
        return ApiServers(1, "auto: it serves LoRA adapters, loaded at runtime, which vLLM "
                             "refuses with more than one API-server process")
    if service.nodes is not None:
        return ApiServers(1, "auto: a multi-node service's workers run --headless")
    if not usage_on:
        return ApiServers(1, "auto: the usage ledger is off (more API-server processes "
                             "spread the usage the door asks on every chunk)")
    if cpus is None:
        return ApiServers(1, "auto: the host's cores are not declared (cpus: in the spec)")
    return None


def api_servers(spec: Spec) -> dict[str, ApiServers]:
    """{service name: its API-server processes}. `auto` where cores are declared:

        spare = cpus - SITE_CORES - ceil(replicas x NGINX_CORES_PER_REPLICA)
                - every replica's engine processes - the fixed services' API servers
        N     = clamp(spare // the auto services' replicas, 1, MAX_AUTO)
    """
    usage_on = spec.usage.enabled
    plans: dict[str, ApiServers] = {}
    auto: list[Service] = []
    for service in spec.services:
        fixed = _fixed(service, usage_on, spec.cpus)
        if fixed is None:
            auto.append(service)
        else:
            plans[service.name] = fixed
    if not auto or spec.cpus is None:
        return plans
    replicas = sum(service.replica_count for service in spec.services)
    nginx = math.ceil(replicas * NGINX_CORES_PER_REPLICA)
    engines = sum(_engine_processes(s) * s.replica_count for s in spec.services)
    taken = sum(plans[s.name].count * s.replica_count for s in spec.services if s.name in plans)
    spare = spec.cpus - SITE_CORES - nginx - engines - taken
    sharing = sum(service.replica_count for service in auto)
    count = max(1, min(MAX_AUTO, spare // sharing))
    others = f" - {taken} other services' API servers" if taken else ""
    why = (f"auto: {spec.cpus} cores - {SITE_CORES} the site's own - {nginx} nginx - {engines} "
           f"engine process(es){others} = {spare} for the API servers of {sharing} "
           f"replica(s), a core each, at most {MAX_AUTO}")
    plans |= {service.name: ApiServers(count, why) for service in auto}
    return {service.name: plans[service.name] for service in spec.services}
