"""Checks across the fields of a spec, on every part that validated on its own.

A typo in one key does not hide a GPU clash in another: `Parts` salvages what validated, and
every check here reads only the spec (what it names on this host: kit/plan/host.py).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    TypeAdapter,
    ValidationError,
)

from kit import names
from kit.engine.desired import KIT_SERVICES
from kit.names import (
    SITE_NAME,
)
from kit.spec.model import (
    ENGINE_READY_TIMEOUT,
    GPU_SHARE_LIMIT,
    MAX_TIMEOUT,
    OFFLINE_ENV,
    STRICT,
    TLS,
    EngineAddress,
    GpuMemory,
    Host,
    HostPath,
    Observability,
    Service,
    Spec,
    Usage,
)
from kit.spec.problems import SpecProblem
from kit.spec.replicas import compose_names
from kit.spec.vllm_flags import (
    DEV_MODE_ENV,
    EMBED,
    GENERATE,
    check_extra_args,
    flag_table,
    flag_uses,
    parallel_sizes,
)


@dataclass(frozen=True)
class Parts:
    """The parts of a spec the cross-field checks read, each one that validated on its own:
    the checks run even when other keys failed, so one typo does not hide a GPU clash."""

    services: list[tuple[int, Service]]
    domain: str | None
    tls: TLS | None
    models_root: Path | None
    gpu_memory_gib: float | dict[int, float] | None
    site: str | None = None
    observability: Observability | None = None
    engine: str | None = None
    hf_cache: Path | None = None
    usage: Usage | None = None
    offline: bool = False

    @classmethod
    def of(cls, spec: Spec) -> "Parts":
        return cls(list(enumerate(spec.services)), spec.domain, spec.tls, spec.models_root,
                   spec.gpu_memory_gib, spec.site, spec.observability, spec.engine,
                   spec.hf_cache, spec.usage, spec.offline)

    @classmethod
    def salvage(cls, data: dict) -> "Parts":
        raw_services = data.get("services")
        listed = raw_services if isinstance(raw_services, list) else []
        services = [(i, service) for i, raw in enumerate(listed)
                    if (service := _valid(Service, raw)) is not None]
        return cls(
            services,
            _valid(Host, data.get("domain")),
            _valid(TLS, data.get("tls", {})),
            _valid(HostPath, data.get("models_root")),
            _valid(GpuMemory, data.get("gpu_memory_gib")),
            _valid(Annotated[str, Field(pattern=SITE_NAME)], data.get("site")),
            _valid(Observability, data.get("observability", {})),
            _valid(EngineAddress, data.get("engine")),
            _valid(HostPath, data.get("hf_cache")),
            _valid(Usage, data.get("usage", {})),
        )


def _valid(kind: Any, value: Any) -> Any:
    """`value` validated as `kind` under the spec's strict rules, or None when it is not."""
    config = None if isinstance(kind, type) and issubclass(kind, BaseModel) else STRICT
    try:
        return TypeAdapter(kind, config=config).validate_python(value)
    except ValidationError:
        return None


def cross_checks(parts: Parts) -> list[SpecProblem]:
    """The checks that read the spec alone: names, GPUs, vLLM flags, metrics, ACME, nodes."""
    problems: list[SpecProblem] = []
    problems += _unique_names(parts.services)
    problems += _adapter_names(parts.services) + _lora_flags(parts.services)
    problems += _gpu_sharing(parts.services)
    problems += _extra_args(parts.services)
    problems += _metrics_flags(parts.services, parts.observability, parts.usage)
    problems += _kit_read_env(parts.services)
    problems += _acme_domain(parts)
    problems += _offline(parts)
    problems += _multi_node(parts)
    problems += _sleep_mode(parts.services)
    return problems


def _unique_names(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """Service names are compose keys; served names are nginx `map` keys, which nginx compares
    in lower case: two that differ only in case would collide there (vLLM tells them apart)."""
    problems = []
    seen_names: dict[str, int] = {}
    seen_served: dict[str, int] = {}
    for i, service in services:
        if service.name in KIT_SERVICES:
            problems.append(SpecProblem(
                ("services", i, "name"),
                f"{service.name!r} is {KIT_SERVICES[service.name]}", "choose another name",
            ))
        if service.name in seen_names:
            problems.append(SpecProblem(
                ("services", i, "name"),
                f"duplicate service name {service.name!r} "
                f"(also services[{seen_names[service.name]}])",
            ))
        seen_names.setdefault(service.name, i)
        problems += _replica_names(services, i, service)
        served = service.api_name  # case-sensitive, as vLLM and the front door's routing are
        if served in seen_served:
            problems.append(SpecProblem(
                ("services", i, "served_name"),
                f"duplicate served name {served!r} (also services[{seen_served[served]}]); "
                "clients pick a model by it",
                "give each service its own served_name",
            ))
        seen_served.setdefault(served, i)
    return problems


def _adapter_names(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """An adapter's name is a model clients ask for: no other adapter's, no served name (the
    door routes each name to one service; vLLM would serve the base under a clashing one)."""
    taken = {service.api_name: f"the served name of services[{i}]" for i, service in services}
    problems = []
    for i, service in services:
        for j, adapter in enumerate(service.adapters):
            if adapter.name in taken:
                problems.append(SpecProblem(
                    ("services", i, "adapters", j, "name"),
                    f"adapter name {adapter.name!r} is also {taken[adapter.name]}; clients pick "
                    "a model by it", "give the adapter a name of its own"))
            taken.setdefault(adapter.name, f"adapter services[{i}].adapters[{j}]")
    return problems


# extra_args LoRA flags that `adapters:` owns or contradicts: flag → why.
ADAPTER_OWNED_FLAGS = {
    "--lora-modules": "declare adapters in services[].adapters: kit checks them and the front "
                      "door routes only declared names",
}


def _lora_flags(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """--lora-modules belongs to `adapters:`; --disable-lora and a CPU cache smaller than the
    GPU slots (vLLM: max_cpu_loras must be >= max_loras) cannot serve what is declared."""
    table = flag_table()
    problems = []
    for i, service in services:
        values: dict[str, tuple[int, str]] = {}
        for use in flag_uses(service.extra_args, table):
            name = use.option.canonical if use.option else use.flag
            if name in ADAPTER_OWNED_FLAGS:
                problems.append(SpecProblem(("services", i, "extra_args", use.index),
                                            f"{use.flag}: {ADAPTER_OWNED_FLAGS[name]}",
                                            f"remove {use.flag} from extra_args"))
            elif use.flag == "--disable-lora" and service.adapters:
                problems.append(SpecProblem(("services", i, "extra_args", use.index),
                                            "--disable-lora contradicts the service's adapters",
                                            "remove --disable-lora, or the adapters"))
            values[name] = (use.index, use.values[-1] if use.values else "")
        slots = values.get("--max-loras", (0, str(len(service.adapters))))[1]
        index, cpu = values.get("--max-cpu-loras", (0, ""))
        if service.adapters and cpu.isdigit() and slots.isdigit() and int(cpu) < int(slots):
            problems.append(SpecProblem(
                ("services", i, "extra_args", index),
                f"--max-cpu-loras {cpu} is below --max-loras {slots} (kit's default: one slot "
                "per adapter); vLLM refuses to start", f"set --max-cpu-loras to at least {slots}"))
    return problems


def _replica_names(
    services: list[tuple[int, Service]], i: int, service: Service
) -> list[SpecProblem]:
    """A replica's compose name (`<service>-r<index>`) must not be another service's name."""
    if service.replica_count == 1:
        return []
    taken = {other.name: j for j, other in services if j != i}
    return [
        SpecProblem(
            ("services", taken[host], "name"),
            f"{host!r} is also the name of replica {index} of service {service.name} "
            f"(services[{i}])",
            "rename one of them",
        )
        for index, host in enumerate(compose_names(service.name, service.replica_count))
        if host in taken
    ]


def _gpu_sharing(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    by_index = dict(services)
    share: dict[int, list[int]] = {}
    for i, service in services:
        for gpu in service.gpus:
            share.setdefault(gpu, []).append(i)
    problems = []
    for gpu, users in sorted(share.items()):
        total = _awake_share([by_index[i] for i in users])
        if len(users) > 1 and total > GPU_SHARE_LIMIT + 1e-9:
            names_ = ", ".join(by_index[i].name for i in users)
            problems.append(SpecProblem(
                ("services", users[-1], "gpus"),
                f"GPU {gpu} is shared by {names_} whose gpu_memory_utilization adds up to "
                f"{total:.2f} awake at once (> {GPU_SHARE_LIMIT}); vLLM would fail to "
                "allocate at start",
                "lower gpu_memory_utilization of the services sharing it, move one elsewhere, "
                "or give them idle_sleep with one swap_group (one of them awake at a time)",
            ))
    return problems + _lone_swap_groups(services)


def _awake_share(users: list[Service]) -> float:
    """The GPU share of the services on one GPU that may be awake at once: every service
    outside a swap group, and each swap group's largest member (a member fits alone; waking
    one puts the others sharing its GPUs to sleep, docs/sleep.md)."""
    groups: dict[str, float] = {}
    total = 0.0
    for service in users:
        group = service.idle_sleep.swap_group if service.idle_sleep else None
        if group is None:
            total += service.gpu_memory_utilization
        else:
            groups[group] = max(groups.get(group, 0.0), service.gpu_memory_utilization)
    return total + sum(groups.values())


def _lone_swap_groups(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """A swap group whose member shares no GPU with another member swaps nothing: a typo."""
    problems = []
    for i, service in services:
        group = service.idle_sleep.swap_group if service.idle_sleep else None
        if group is None:
            continue
        partners = [other for j, other in services if j != i and other.idle_sleep is not None
                    and other.idle_sleep.swap_group == group
                    and set(other.gpus) & set(service.gpus)]
        if not partners:
            problems.append(SpecProblem(
                ("services", i, "idle_sleep", "swap_group"),
                f"swap group {group!r} has no other service on the GPUs of {service.name} "
                f"({', '.join(map(str, service.gpus))}): a swap group shares GPUs",
                "give the services that share these GPUs the same swap_group, or remove it"))
    return problems


def _extra_args(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """Flags vLLM would refuse, and parallel sizes that need more GPUs than the service pins."""
    table = flag_table()
    problems = [
        SpecProblem(("services", i, "extra_args", index), message)
        for i, service in services
        for index, message in check_extra_args(service.extra_args, table)
    ]
    for i, service in services:
        sizes = parallel_sizes(service.extra_args, table)
        if service.pipeline_parallel > 1 and "--pipeline-parallel-size" in sizes:
            problems.append(SpecProblem(
                ("services", i, "extra_args", sizes["--pipeline-parallel-size"][0]),
                "--pipeline-parallel-size repeats the service's pipeline_parallel",
                "keep pipeline_parallel and remove the flag from extra_args",
            ))
            continue
        world = service.tp * service.pipeline_parallel
        for _, size in sizes.values():
            world *= size
        if world != service.tp * service.pipeline_parallel:  # a replica's (or the nodes') GPUs
            index, _ = max(sizes.values())
            written = " x ".join(f"{flag} {size}" for flag, (_, size) in sizes.items())
            has = (f"gpus lists {len(service.gpus)}" if service.replica_count == 1 else
                   f"each of its {service.replica_count} replicas has {service.tp}")
            problems.append(SpecProblem(
                ("services", i, "extra_args", index),
                f"tensor parallel {service.tp} x {written} needs {world} GPUs but {has}; "
                "vLLM would wait for GPUs the container does not have",
                "list that many GPUs in gpus, or remove the size from extra_args "
                "(kit runs one tensor-parallel group over the service's GPUs)",
            ))
    for i, service in services:
        if service.task not in (GENERATE, EMBED):
            problems.append(SpecProblem(
                ("services", i, "extra_args"),
                f"extra_args make {service.name} a `{service.task}` model; kit proves a "
                "service through the front door with a completion (a generative model) or an "
                "embedding (--runner pooling / --convert embed), and cannot gate this one",
                "serve it as a generative or an embedding model (--runner generate|pooling, "
                "--convert embed)",
            ))
    return problems


def _sleep_mode(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """idle_sleep owns vLLM's dev mode: set by hand it would open the dev routes (or, without
    sleep mode, for nothing); a multi-node service's workers are out of kit's reach to wake."""
    problems = [
        SpecProblem(("services", i, "env", DEV_MODE_ENV),
                    f"{DEV_MODE_ENV} is set by kit for a service with idle_sleep (it opens "
                    "vLLM's development routes, which only kit's own components reach)",
                    f"remove {DEV_MODE_ENV} from env (add idle_sleep to sleep an idle service)")
        for i, service in services if DEV_MODE_ENV in service.env
    ]
    problems += [
        SpecProblem(("services", i, "idle_sleep"),
                    "idle_sleep is not built for a multi-node service (kit reaches its head "
                    "only, and each node's vLLM would have to sleep and wake)",
                    "remove idle_sleep, or run the model on one server")
        for i, service in services if service.idle_sleep is not None and service.nodes
    ]
    return problems


def _multi_node(parts: Parts) -> list[SpecProblem]:
    """The head of a multi-node service runs here, beside the front door; one such service per
    site, since its API and master port are on the head's host network."""
    spanning = [(i, service) for i, service in parts.services if service.nodes]
    problems = [
        SpecProblem(
            ("services", i, "nodes", 0, "name"),
            f"the first node is the head, which runs on this site ({parts.site!r}) with the "
            f"front door, not {service.nodes[0].name!r}",
            f"list {parts.site} first in nodes (its fleet siblings after it)",
        )
        for i, service in spanning
        if parts.site is not None and service.nodes and service.nodes[0].name != parts.site
    ]
    problems += [
        SpecProblem(("services", i, "nodes"),
                    f"a second multi-node service (also services[{spanning[0][0]}]): both heads "
                    "would serve on this host's network at the same ports",
                    "run one multi-node service per site")
        for i, _ in spanning[1:]
    ]
    return problems


# extra_args flags that would undo what the observability and usage keys ask of vLLM:
# key → flag → why.
METRICS_FLAGS = {
    "usage.enabled": {"--enable-force-include-usage": "the usage ledger asks vLLM for the usage "
                      "each stream needs and gives each client only the usage it asked for; "
                      "usage on every chunk costs vLLM's API server throughput (x0.87 on an "
                      "H100: docs/usage.md)",
                      "--stream-interval": "the usage ledger counts an aborted stream's "
                      "completion tokens from its chunks, one token each at vLLM's default "
                      "interval of 1; a larger one would undercount them (docs/usage.md)"},
    "slo": {"--custom-histogram-buckets": "kit writes the histogram bounds from slo (vLLM's "
            "defaults plus the SLO, so the SLO line is exact) and vLLM would keep only one"},
    "observability.enabled": {"--disable-log-stats": "it removes every vllm:* metric "
                              "Prometheus scrapes"},
}


def _metrics_flags(
    services: list[tuple[int, Service]], observability: Observability | None,
    usage: Usage | None,
) -> list[SpecProblem]:
    """A flag in extra_args that contradicts slo, observability.enabled or usage.enabled."""
    table = flag_table()
    enabled = observability is not None and observability.enabled
    ledger = usage is None or usage.enabled  # a broken usage key: its default, on
    problems = []
    for i, service in services:
        keys = [key for key, on in (("slo", service.slo is not None),
                                    ("observability.enabled", enabled),
                                    ("usage.enabled", ledger)) if on]
        for use in flag_uses(service.extra_args, table):
            canonical = use.option.canonical if use.option else use.flag
            problems += [
                SpecProblem(("services", i, "extra_args", use.index),
                            f"{use.flag} conflicts with {key}: {METRICS_FLAGS[key][canonical]}",
                            f"remove {use.flag} from extra_args")
                for key in keys if canonical in METRICS_FLAGS[key]
            ]
    return problems


def _kit_read_env(services: list[tuple[int, Service]]) -> list[SpecProblem]:
    """Env values kit reads itself (the healthcheck's start period follows vLLM's timeout)."""
    problems = []
    for i, service in services:
        value = service.env.get(ENGINE_READY_TIMEOUT)
        if value is not None and not (value.isascii() and value.isdigit()
                                      and 1 <= int(value) <= MAX_TIMEOUT):
            problems.append(SpecProblem(
                ("services", i, "env", ENGINE_READY_TIMEOUT),
                f"{value!r} is not a whole number of seconds from 1 to {MAX_TIMEOUT} "
                "(vLLM reads it with int())",
                f'write seconds, e.g. {ENGINE_READY_TIMEOUT}: "1200" for 20 minutes',
            ))
    return problems


def _acme_domain(parts: Parts) -> list[SpecProblem]:
    """An ACME CA issues for public DNS names only: certbot would fail at every renewal."""
    if parts.tls is None or parts.tls.mode != "acme" or parts.domain is None:
        return []
    if _is_ip(parts.domain) or "." not in parts.domain:
        return [SpecProblem(
            ("domain",),
            f"tls.mode acme needs a public DNS name with a dot, not {parts.domain!r} "
            "(ACME CAs do not issue certificates for IP addresses or single-label names)",
            "set domain to the server's DNS name, or use tls.mode self-signed or files",
        )]
    return []


def _offline(parts: Parts) -> list[SpecProblem]:
    """An offline site reaches no public CA, and no service may undo what keeps vLLM off the
    network (kit.plan.build.OFFLINE_ENV)."""
    if not parts.offline:
        return []
    problems = []
    if parts.tls is not None and parts.tls.mode == "acme" and parts.tls.acme_server is None:
        problems.append(SpecProblem(
            ("tls", "mode"),
            "offline: true, but tls.mode acme asks Let's Encrypt for certificates over the "
            "Internet (certbot would fail at every renewal)",
            "use tls.mode files or self-signed, or set tls.acme_server to an ACME CA on your "
            "own network",
        ))
    for i, service in parts.services:
        for key in sorted(OFFLINE_ENV.keys() & service.env.keys()):
            if service.env[key] != OFFLINE_ENV[key]:
                problems.append(SpecProblem(
                    ("services", i, "env", key),
                    f"offline: true sets {key}={OFFLINE_ENV[key]} for vLLM; "
                    f"{service.env[key]!r} would let it reach the network",
                    f"remove {key} from the service's env",
                ))
    return problems


def _is_ip(value: str) -> bool:
    try:
        names.ip(value)
    except ValueError:
        return False
    return True
