"""The site spec: what the operator wrote in site.yaml, validated, with file:line:col errors.

Validation, all before anything is written:
1. YAML → Python with the position of every key recorded; duplicate keys, anchors/aliases, deep
   nesting, over-long numbers and oversized files refused here (a hostile spec fails fast);
2. pydantic field rules, strict (no bool or string coercion into numbers), every text value
   allow-listed by what it is (kit.names);
3. checks across fields and against the host (GPU sharing, names, vLLM flags and parallel sizes,
   TLS files and certificate, model directories and capacity) on every part that passed 2, so
   a typo in one key does not hide a problem elsewhere.
Every problem is reported with file:line:col, not only the first.
"""

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from kit import names
from kit.engine.desired import KIT_SERVICES
from kit.engine.url import DEFAULT_HOST, is_local, resolve, spec_engine
from kit.errors import BadInput
from kit.names import (
    ACME_SERVER,
    EMAIL,
    ENV_NAME,
    ENV_VALUE,
    HEADER_NAME,
    IMAGE_REF,
    INTERFACE_NAME,
    MODEL_REF,
    PATH_TEXT,
    SERVED_NAME,
    SERVICE_NAME,
    SITE_NAME,
    SIZE,
    USER_NAME,
)
from kit.spec.replicas import compose_names
from kit.spec.vllm_flags import (
    SHIPPED_VERSION,
    check_extra_args,
    choices,
    flag_table,
    flag_uses,
    image_version,
    parallel_sizes,
)

DEFAULT_SPEC = Path("site.yaml")
GPU_SHARE_LIMIT = 0.95
RESERVED_USERS = {"kit-probe"}
# The whole request body sits in one nginx buffer (kit.route reads it): bounded like memory.
MAX_BODY_BYTES = (1 << 10, 1 << 30)
MAX_TIMEOUT = 86400  # seconds: a day, for the slowest start or the longest generation
# Env variables whose value kit itself reads (and how it must look).
ENGINE_READY_TIMEOUT = "VLLM_ENGINE_READY_TIMEOUT_S"
# Hostile YAML: a site spec is small and flat; these bounds are far above any real one.
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 16
MAX_NUMBER_CHARS = 32


# No coercion: YAML's `yes` is not 1, "1" is not 1, 16384.0 is not 16384 (an int is a float).
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, **STRICT)


def _yaml_safe_key(name: str) -> str:
    """Refuse names a YAML 1.1 reader (docker-compose v1) would take for a bool, null or number
    when kit writes them unquoted as keys (service names, env names)."""
    if yaml.safe_load(name) != name:
        raise ValueError(f"{name!r} reads as {yaml.safe_load(name)!r} in YAML; choose another name")
    return name


def _body_size(value: str) -> str:
    """A size nginx accepts in both client_max_body_size and client_body_buffer_size (which
    takes no `g`): normalised to k/m units."""
    size = names.size_bytes(value)
    low, high = MAX_BODY_BYTES
    if not low <= size <= high:
        raise ValueError(f"{value!r} is outside 1k..1g (one request body is held in memory)")
    return names.nginx_size(size)


def _absolute_safe_path(path: Path) -> Path:
    if not path.is_absolute():
        raise ValueError(f"{str(path)!r} must be an absolute host path (e.g. /data/models)")
    if not names.is_name(PATH_TEXT, str(path)):
        raise ValueError(f"{str(path)!r} has spaces, quotes, ':' ',' '$' ';' or braces")
    if len(str(path)) > 4096 or any(len(part.encode()) > 255 for part in path.parts):
        raise ValueError("a path of at most 4096 characters, 255 bytes per folder name")
    refusal = names.bind_refusal(str(path))
    if refusal:
        raise ValueError(f"{str(path)!r} {refusal}: {BIND_FIX}")
    return path


BIND_FIX = ("kit never mounts it into a container, where a model's code runs; put the models "
            "(or the cache) in a folder of their own, e.g. /srv/models")


def _file_path(path: Path) -> Path:
    """A path kit opens itself: the OS refuses NUL (ValueError, not OSError) and long names."""
    if "\x00" in str(path) or len(str(path)) > 4096:
        raise ValueError("a file path holds no NUL character and at most 4096 characters")
    return path


Host = Annotated[str, AfterValidator(names.host)]
EngineAddress = Annotated[str, AfterValidator(spec_engine)]
FilePath = Annotated[Path, Strict(False), AfterValidator(_file_path)]
HostPath = Annotated[Path, Strict(False), AfterValidator(_absolute_safe_path)]
GpuIndex = Annotated[int, Field(ge=0, le=63)]
GiB = Annotated[float, Field(gt=0, le=4096)]
GpuMemory = GiB | dict[GpuIndex, GiB] | None


def _vocabulary(flag: str) -> Any:
    """A spec key whose values are exactly what vLLM's `flag` accepts (one list: the flag table)."""
    return Field(json_schema_extra={"enum": list(choices(flag))})


MIN_NGINX = (1, 25, 1)  # `http2 on;`; the njs API kit.js uses is in njs 0.7.9 and 0.8.x


class Images(StrictModel):
    vllm: Annotated[str, Field(pattern=IMAGE_REF)] = f"vllm/vllm-openai:v{SHIPPED_VERSION}"
    nginx: Annotated[str, Field(pattern=IMAGE_REF)] = "nginx:1.27-alpine"
    certbot: Annotated[str, Field(pattern=IMAGE_REF)] = "certbot/certbot:v3.1.0"  # acme mode
    # observability.enabled
    prometheus: Annotated[str, Field(pattern=IMAGE_REF)] = "prom/prometheus:v3.5.0"
    grafana: Annotated[str, Field(pattern=IMAGE_REF)] = "grafana/grafana:12.1.1"

    @field_validator("nginx")
    @classmethod
    def _nginx_serves_http2(cls, image: str) -> str:
        """The front door renders `http2 on;` (nginx >= 1.25.1, docs/compatibility.md): an
        older nginx named by its version tag would fail only when the door starts."""
        tag = re.search(r"(?:^|/)nginx(?:-[a-z]+)?:(\d+)\.(\d+)(?:\.(\d+))?(?![\d.])", image)
        if tag:
            # A tag without a patch version (nginx:1.25) names the newest of that line.
            major, minor, patch = (int(part) if part else 10**6 for part in tag.groups())
            if (major, minor, patch) < MIN_NGINX:
                raise ValueError(
                    f"{image} is older than nginx {'.'.join(map(str, MIN_NGINX))}, which the front "
                    "door needs (http2 on;); use nginx:1.27-alpine, kit's default")
        return image


class TLS(StrictModel):
    mode: Literal["self-signed", "files", "acme"] = "self-signed"
    # files mode: PEM certificate (chain) and private key paths, relative to the spec
    cert: FilePath | None = None
    key: FilePath | None = None
    email: Annotated[str, Field(pattern=EMAIL, max_length=254)] | None = None  # the ACME account
    acme_server: Annotated[str, Field(pattern=ACME_SERVER, max_length=1024)] | None = None
    staging: bool = False  # acme mode: Let's Encrypt's staging CA (untrusted certs, high limits)
    # A private CA's PEM certificate(s), relative to the spec: the CA of a private ACME server
    # (step-ca, pebble, …; certbot trusts it for the directory) and of the certificate the site
    # serves (the gate trusts it instead of the system store). acme and files modes.
    ca_bundle: FilePath | None = None

    @model_validator(mode="after")
    def _mode_needs(self) -> "TLS":
        if self.mode == "files" and (self.cert is None or self.key is None):
            raise ValueError("tls.mode files needs both tls.cert and tls.key")
        if self.mode == "acme" and not self.email:
            raise ValueError("tls.mode acme needs tls.email (the ACME account address)")
        if self.mode != "files" and (self.cert or self.key):
            raise ValueError(f"tls.cert/tls.key are only read in mode files, not {self.mode}")
        if self.mode != "acme" and (self.acme_server or self.staging):
            raise ValueError(
                f"tls.acme_server/tls.staging are only read in mode acme, not {self.mode}"
            )
        if self.mode == "self-signed" and self.ca_bundle:
            raise ValueError("tls.ca_bundle is read in modes acme and files; self-signed sites "
                             "are trusted through kit's own CA (nginx/tls/ca.crt)")
        return self


class Auth(StrictModel):
    users: list[Annotated[str, Field(pattern=USER_NAME)]] = []
    api_keys: bool = True

    @field_validator("users")
    @classmethod
    def _users_unique(cls, users: list[str]) -> list[str]:
        reserved = RESERVED_USERS.intersection(users)
        if reserved:
            raise ValueError(f"{', '.join(sorted(reserved))} is kit's own probe identity")
        dupes = sorted({u for u in users if users.count(u) > 1})
        if dupes:
            raise ValueError(f"duplicate user {', '.join(dupes)}")
        return users


class Proxy(StrictModel):
    """Every bound is one nginx and Docker accept (tests render both ends and run nginx -t)."""

    bind: Annotated[str, AfterValidator(names.ip)] = "0.0.0.0"
    https_port: Annotated[int, Field(ge=1, le=65535)] = 443
    http_port: Annotated[int, Field(ge=1, le=65535)] = 80
    max_body: Annotated[str, Field(pattern=SIZE), AfterValidator(_body_size)] = "1m"
    read_timeout: Annotated[int, Field(ge=1, le=MAX_TIMEOUT)] = 900  # seconds; long generations
    connect_timeout: Annotated[int, Field(ge=1, le=300)] = 10
    # auto: derived from the services' concurrency (kit/plan/build.py, docs/auth.md "Limits")
    rate_limit_per_ip: Annotated[int, Field(ge=1, le=1000000)] | Literal["auto"] = "auto"
    rate_limit_per_credential: Annotated[int, Field(ge=1, le=1000000)] | Literal["auto"] = "auto"
    failed_logins_per_ip: Annotated[int, Field(ge=1, le=10000)] = 20  # per minute
    # limit_conn's maximum is 65535; auto: derived from the services' concurrency like the rates
    max_connections_per_ip: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] = "auto"

    @model_validator(mode="after")
    def _ports_differ(self) -> "Proxy":
        if self.https_port == self.http_port:
            raise ValueError(f"https_port and http_port are both {self.http_port}")
        return self


class Node(StrictModel):
    """One server of a multi-node service: the fleet member (sibling spec) that runs it and the
    address the other nodes reach it at (vLLM's --master-addr for the head, VLLM_HOST_IP)."""

    name: Annotated[str, Field(pattern=SITE_NAME)]
    address: Annotated[str, AfterValidator(names.ip)]
    # The node's Docker engine, as a site's `engine:` (kit/engine/url.py); unset: the engine of
    # the sibling spec <fleet>/<name>/site.yaml (kit/stack/worker_nodes.py).
    engine: EngineAddress | None = None


class Slo(StrictModel):
    """A service's latency objective (p95): exact bucket bounds in vLLM's histograms, the SLO
    panels and the SLO alerts (kit/plan/observability.py)."""

    ttft_p95_ms: Annotated[int, Field(ge=1, le=3_600_000)] | None = None  # time to first token
    tpot_p95_ms: Annotated[int, Field(ge=1, le=60_000)] | None = None  # time per output token

    @model_validator(mode="after")
    def _one_set(self) -> "Slo":
        if self.ttft_p95_ms is None and self.tpot_p95_ms is None:
            raise ValueError("slo sets ttft_p95_ms, tpot_p95_ms or both")
        return self


class Observability(StrictModel):
    """Prometheus and Grafana beside the services; Grafana only behind the front door."""

    enabled: bool = False
    scrape_interval: Annotated[int, Field(ge=1, le=300)] = 15  # seconds; rules run as often
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 15
    replica_down_after: Annotated[int, Field(ge=1, le=3600)] = 60  # seconds: the alert's `for:`
    # The private subnet of the metrics network, where the front door, Prometheus and Grafana
    # have fixed addresses (Grafana trusts the user header from the front door's only). Unset:
    # one /28 of 198.18.0.0/15 picked by the site's name. Set it when that one is taken.
    subnet: Annotated[str, AfterValidator(names.private_subnet)] | None = None


class Routing(StrictModel):
    """How the front door spreads a service's requests over its replicas (least connections
    unless an affinity keeps a session or a conversation on one replica)."""

    affinity: Literal["none", "header", "prefix"] = "none"
    header: Annotated[str, Field(pattern=HEADER_NAME)] | None = None

    @model_validator(mode="after")
    def _header_for_header_affinity(self) -> "Routing":
        if self.affinity == "header" and self.header is None:
            raise ValueError("affinity header needs `header:` (e.g. header: X-Session-ID)")
        if self.affinity != "header" and self.header is not None:
            raise ValueError(f"`header:` is only read with affinity header (not {self.affinity})")
        return self


class Service(StrictModel):
    name: Annotated[str, Field(pattern=SERVICE_NAME), AfterValidator(_yaml_safe_key)]
    model: Annotated[str, Field(pattern=MODEL_REF, max_length=200)]
    served_name: Annotated[str, Field(pattern=SERVED_NAME)] | None = None
    gpus: Annotated[list[GpuIndex], Field(min_length=1)]
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] | None = None
    replicas: Annotated[int, Field(ge=1, le=64)] | None = None  # default: gpus / tensor_parallel
    routing: Routing = Routing()
    max_model_len: Annotated[int, Field(gt=0, le=16_777_216)] = 8192
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] | Literal["auto"] = "auto"
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.90
    dtype: Annotated[str, _vocabulary("--dtype")] = "auto"
    quantization: Annotated[str, _vocabulary("--quantization")] | None = None
    kv_cache_dtype: Annotated[str, _vocabulary("--kv-cache-dtype")] = "auto"
    trust_remote_code: bool = False
    extra_args: list[Annotated[str, Field(pattern=ENV_VALUE, max_length=4096)]] = []
    env: dict[
        Annotated[str, Field(pattern=ENV_NAME, max_length=256), AfterValidator(_yaml_safe_key)],
        Annotated[str, Field(pattern=ENV_VALUE, max_length=4096)],
    ] = {}
    startup_timeout: Annotated[int, Field(ge=30, le=MAX_TIMEOUT)] | None = None  # seconds
    # Multi-node (one vLLM over several servers, docs/multinode.md): the head first; `gpus` are
    # the indices on every node, tensor_parallel x pipeline_parallel = all nodes' GPUs.
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    nodes: Annotated[list[Node], Field(min_length=2, max_length=64)] | None = None
    network_interface: Annotated[str, Field(pattern=INTERFACE_NAME)] | None = None
    master_port: Annotated[int, Field(ge=1024, le=65535)] = 29501  # vLLM's --master-port default
    slo: Slo | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, gpus: list[int]) -> list[int]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU index listed twice in {gpus}")
        return gpus

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return _one_of(value, "--dtype")

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str | None) -> str | None:
        return _one_of(value, "--quantization")

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_kv_dtype(cls, value: str) -> str:
        return _one_of(value, "--kv-cache-dtype")

    @model_validator(mode="after")
    def _gpus_split_into_replicas(self) -> "Service":
        """One server: gpus is cut into replicas of tensor_parallel GPUs, so it must divide
        evenly and an explicit replicas count must be what that cut gives. Several nodes (or
        pipeline stages): one vLLM over tensor_parallel x pipeline_parallel = all their GPUs."""
        gpus = len(self.gpus)
        if self.nodes is not None or self.pipeline_parallel > 1:
            if self.replicas not in (None, 1):
                raise ValueError("replicas of a multi-node or pipeline-parallel service are not "
                                 "supported: it runs as one vLLM over all its GPUs")
            if self.tp * self.pipeline_parallel != self.gpu_count:
                nodes = f" on each of {len(self.nodes)} nodes" if self.nodes else ""
                raise ValueError(
                    f"tensor_parallel {self.tp} x pipeline_parallel {self.pipeline_parallel} must "
                    f"equal the {self.gpu_count} GPUs of the service ({gpus} listed in "
                    f"gpus{nodes}): vLLM runs one model over exactly those GPUs"
                )
            return self
        if self.tensor_parallel is None and self.replicas is not None and gpus % self.replicas:
            raise ValueError(f"gpus lists {gpus} GPU(s), which {self.replicas} replicas cannot "
                             "share evenly")
        if self.tensor_parallel is not None and gpus % self.tensor_parallel:
            raise ValueError(
                f"gpus lists {gpus} GPU(s), which tensor_parallel {self.tensor_parallel} does "
                f"not divide; each replica takes tensor_parallel GPUs of the list"
            )
        if self.replicas is not None and self.tp * self.replicas != gpus:
            raise ValueError(
                f"replicas is {self.replicas} but gpus lists {gpus} GPU(s) for "
                f"tensor_parallel {self.tp}: that makes {gpus // self.tp} replica(s)"
            )
        return self

    @model_validator(mode="after")
    def _nodes_distinct(self) -> "Service":
        if self.nodes is None:
            if self.network_interface is not None:
                raise ValueError("network_interface is only read for a service with nodes")
            return self
        for key in ("name", "address"):
            values = [getattr(node, key) for node in self.nodes]
            dupes = sorted({value for value in values if values.count(value) > 1})
            if dupes:
                raise ValueError(f"nodes list the {key} {', '.join(dupes)} twice")
        return self

    @property
    def gpu_count(self) -> int:
        """All GPUs the service runs on: its gpus on every node."""
        return len(self.gpus) * (len(self.nodes) if self.nodes else 1)

    @property
    def engine_ready_timeout(self) -> int | None:
        """VLLM_ENGINE_READY_TIMEOUT_S in seconds (validated whole seconds), None when unset."""
        value = self.env.get(ENGINE_READY_TIMEOUT)
        return int(value) if value is not None else None

    @property
    def tp(self) -> int:
        """GPUs per replica (of a multi-node service: its tensor-parallel size): tensor_parallel,
        else the list shared by `replicas` (default: one replica on all of gpus)."""
        if self.tensor_parallel is not None:
            return self.tensor_parallel
        if self.nodes is not None or self.pipeline_parallel > 1:
            return max(1, self.gpu_count // self.pipeline_parallel)
        if self.replicas is not None and len(self.gpus) % self.replicas == 0:
            return len(self.gpus) // self.replicas
        return len(self.gpus)

    @property
    def replica_count(self) -> int:
        """Containers of this service on this server (a multi-node service: one, the head)."""
        if self.nodes is not None or self.pipeline_parallel > 1:
            return 1
        return len(self.gpus) // self.tp

    @property
    def api_name(self) -> str:
        return self.served_name or self.name


def _one_of(value: str | None, flag: str) -> str | None:
    valid = choices(flag)
    if value is not None and valid and value not in valid:
        hint = difflib.get_close_matches(value, valid, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(
            f"{value!r} is not a {flag} value of vLLM {SHIPPED_VERSION}{did_you_mean}; "
            f"valid: {', '.join(valid)}"
        )
    return value


class Kubernetes(StrictModel):
    """What `kit export k8s` needs beyond the server's spec (docs/kubernetes.md)."""

    service_type: Literal["LoadBalancer", "NodePort", "ClusterIP"] = "LoadBalancer"  # front door


class Spec(StrictModel):
    site: Annotated[str, Field(pattern=SITE_NAME)]
    domain: Host
    images: Images = Images()
    models_root: HostPath
    hf_cache: HostPath | None = None
    gpu_memory_gib: GpuMemory = None
    tls: TLS = TLS()
    auth: Auth = Auth()
    proxy: Proxy = Proxy()
    healthcheck_interval: Annotated[int, Field(ge=1, le=300)] = 10  # seconds
    kubernetes: Kubernetes = Kubernetes()
    observability: Observability = Observability()
    services: Annotated[list[Service], Field(min_length=1)]
    # The Docker engine this site runs on (kit/engine/url.py); unset: DOCKER_HOST or the socket.
    engine: EngineAddress | None = None

    def service(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def gpu_memory_for(self, gpu: int) -> float | None:
        return gpu_memory_for(self.gpu_memory_gib, gpu)


def gpu_memory_for(gpu_memory_gib: float | dict[int, float] | None, gpu: int) -> float | None:
    if isinstance(gpu_memory_gib, dict):
        return gpu_memory_gib.get(gpu)
    return gpu_memory_gib


# --------------------------------------------------------------------------- YAML with positions


@dataclass
class Located:
    """A parsed document plus the (line, column) of every key path in it (1-based)."""

    data: Any
    marks: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    problems: list[tuple[tuple, str]] = field(default_factory=list)

    def position(self, path: tuple) -> tuple[int, int]:
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))


class Refused(yaml.MarkedYAMLError):
    """YAML that parses but that a site spec never needs (and a hostile one uses)."""

    def __init__(self, problem: str, fix: str, mark: yaml.Mark):
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing and before anything is expanded, anchors and
    aliases (billion laughs, self-reference) and deep nesting (Python's recursion limit)."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise Refused(
                "anchors and aliases (&name, *name) are not allowed in a site spec",
                "write the value out where it is used", event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise Refused(
                f"nested deeper than {MAX_DEPTH} levels",
                "a site spec nests four levels at most (services[].env.NAME)", event.start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def parse_yaml(text: str) -> Located:
    """YAML → plain data, remembering where each key is and refusing duplicate keys."""
    loader = _SpecLoader(text)
    try:
        root = loader.get_single_node()
        located = Located(data=None)
        if root is not None:
            located.data = _walk(root, (), located, loader)
        return located
    finally:
        loader.dispose()


COLLECTION_TAGS = {
    yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"
}


def _walk(node: yaml.Node, path: tuple, located: Located, loader: yaml.SafeLoader) -> Any:
    located.marks.setdefault(path, _mark(node))
    if COLLECTION_TAGS.get(type(node), node.tag) != node.tag:
        raise Refused(f"the tag {node.tag} is not allowed in a site spec", "remove the tag",
                      node.start_mark)
    if isinstance(node, yaml.MappingNode):
        result: dict = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, path, located, loader)
            if not isinstance(key, str | int | float | bool) or key is None:
                located.problems.append((path, "keys must be plain scalars"))
                continue
            child = (*path, key)
            located.marks[child] = _mark(key_node)
            if key in result:
                located.problems.append((child, f"duplicate key {key!r}"))
                continue
            result[key] = _walk(value_node, child, located, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), located, loader) for i, item in enumerate(node.value)]
    return _scalar(node, path, located, loader)


def _scalar(node: yaml.Node, path: tuple, located: Located, loader: yaml.SafeLoader) -> Any:
    """One scalar (or a key) built by YAML's rules; a value Python cannot build is a problem at
    its position (a 5,000-digit number, a 30 February timestamp), never a traceback."""
    if node.tag in NUMBER_TAGS and len(str(node.value)) > MAX_NUMBER_CHARS:
        located.marks.setdefault(path, _mark(node))
        located.problems.append((path, f"a number of {len(node.value)} characters"))
        return None
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as error:
        located.marks.setdefault(path, _mark(node))
        located.problems.append((path, f"{node.value!r} cannot be read: {error}"))
        return None


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class SpecProblem:
    path: tuple
    message: str
    fix: str | None = None


class SpecError(BadInput):
    """All problems of one spec, each as `file:line:col: key.path: message`."""

    def __init__(self, source: Path, located: Located | None, problems: list[SpecProblem]):
        self.problems = problems
        lines = []
        where_in = located.position if located else lambda path: (1, 1)
        for problem in sorted(problems, key=lambda problem: where_in(problem.path)):
            line, column = where_in(problem.path)
            where = f"{source}:{line}:{column}"
            key = dotted(problem.path)
            text = f"{where}: {key}: {problem.message}" if key else f"{where}: {problem.message}"
            if problem.fix:
                text += f"\n    fix: {problem.fix}"
            lines.append(text)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{source}: {len(problems)} {noun}:\n" + "\n".join(lines))


def dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_spec(path: Path, *, check_host: bool = True, check_capacity: bool = True) -> Spec:
    """Read and validate a spec file; raise SpecError listing every problem found.

    `check_capacity` False leaves a service that cannot fit its GPUs to the caller (`kit plan`
    shows the whole capacity table first)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise BadInput(
            f"spec file {path} does not exist",
            fix="pass the spec path (kit render path/to/site.yaml) or create one with `kit init`",
        ) from None
    except OSError as error:
        raise BadInput(f"cannot read spec file {path}: {error.strerror or error}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise BadInput(
            f"{path}: larger than {MAX_SPEC_BYTES >> 20} MiB; a site spec is a few KiB",
            fix="pass the site.yaml, not another file",
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        line, column = _line_column(raw, error.start)
        raise BadInput(
            f"{path}:{line}:{column}: not UTF-8 text ({error.reason})",
            fix="save the spec as UTF-8",
        ) from None
    return parse_spec(text, path, check_host=check_host, check_capacity=check_capacity)


def _line_column(text: str | bytes, offset: int) -> tuple[int, int]:
    before = text[:offset]
    newline = "\n" if isinstance(before, str) else b"\n"
    return before.count(newline) + 1, offset - (before.rfind(newline) + 1) + 1


def parse_spec(
    text: str, source: Path, *, check_host: bool = True, check_capacity: bool = True
) -> Spec:
    if len(text) > MAX_SPEC_BYTES:
        raise BadInput(f"{source}: larger than {MAX_SPEC_BYTES >> 20} MiB")
    try:
        located = parse_yaml(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise BadInput(
            f"{source}:{line}:{column}: invalid YAML: {error.problem or error}",
            fix=getattr(error, "fix", None)
            or "fix the YAML at that position (indentation, a missing ':' or quote, a tag)",
        ) from None
    except yaml.reader.ReaderError as error:
        line, column = _line_column(text, error.position)
        raise BadInput(
            f"{source}:{line}:{column}: invalid YAML: character {error.character!r} is not "
            "allowed in YAML text",
            fix="remove that character (control characters and NUL cannot appear in a spec)",
        ) from None
    except yaml.YAMLError as error:
        raise BadInput(f"{source}:1:1: invalid YAML: {error}") from None
    problems = [SpecProblem(path, message) for path, message in located.problems]
    if not isinstance(located.data, dict):
        problems.append(SpecProblem((), "the spec must be a mapping (site:, domain:, services:)"))
        raise SpecError(source, located, problems)
    if problems:
        raise SpecError(source, located, problems)
    spec = None
    try:
        spec = Spec.model_validate(located.data)
        parts = Parts.of(spec)
    except ValidationError as error:
        problems = _from_pydantic(error.errors())
        parts = Parts.salvage(located.data)
    problems += cross_checks(
        parts, spec_dir=source.parent, check_host=check_host, check_capacity=check_capacity
    )
    if problems or spec is None:
        raise SpecError(source, located, problems)
    return spec


def _from_pydantic(errors: list[dict]) -> list[SpecProblem]:
    """One problem per key (a union reports each alternative: the first says enough)."""
    problems: dict[tuple, SpecProblem] = {}
    for error in errors:
        problem = _problem(error)
        problems.setdefault(problem.path, problem)
    return list(problems.values())


def _problem(error: dict) -> SpecProblem:
    path = tuple(part for part in error["loc"] if not _is_union_tag(part))
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(path[:-1])
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1, cutoff=0.6)
        fix = f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(allowed)}"
        return SpecProblem(path, f"unknown key {path[-1]!r}", fix)
    if kind == "missing":
        return SpecProblem(path, "required key is missing", f"add {dotted(path)}: to the spec")
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    fix = None
    if kind == "string_pattern_mismatch":
        message = f"{value!r} has characters that are not allowed here ({_pattern_hint(path)})"
    elif kind != "value_error" and not isinstance(value, dict | list):
        message = f"{message} (got {value!r})"
    if isinstance(value, bool) and kind in ("int_type", "float_type", "string_type"):
        fix = "YAML reads yes/no/on/off/true/false as booleans: write the number or quote the text"
    elif isinstance(value, str) and kind in ("int_type", "float_type"):
        fix = "write the number without quotes"
    elif isinstance(value, float) and kind == "int_type":
        fix = "write a whole number without a decimal point"
    return SpecProblem(path, message, fix)


def _is_union_tag(part: Any) -> bool:
    """pydantic puts union member names (e.g. 'int', 'literal['auto']', 'constrained-float')
    into error locations."""
    return isinstance(part, str) and (
        "[" in part or part.startswith(("constrained-", "function-")) or part in (
            "int", "float", "str", "dict", "list", "bool", "path", "is-instance[Path]"
        )
    )


def _pattern_hint(path: tuple) -> str:
    hints = {
        "site": "lower-case letters, digits and '-', starting with a letter, at most 31",
        "name": "lower-case letters, digits and '-', starting with a letter",
        "users": "lower-case letters, digits, '.', '_' and '-', starting with a letter",
        "served_name": "letters, digits and . _ / : -",
        "model": "a directory name under models_root or an org/name Hugging Face id",
        "vllm": "an image reference like vllm/vllm-openai:v0.33.0",
        "nginx": "an image reference like nginx:1.27-alpine",
        "certbot": "an image reference like certbot/certbot:v3.1.0",
        "max_body": "a size like 1m, 512k or 1g",
        "email": "an e-mail address like ops@example.com (not starting with - or .)",
        "acme_server": "an https:// directory URL",
        "extra_args": "no newlines, NUL or '$'",
        "env": "names: letters, digits, '_'; values: no newlines, NUL or '$'",
    }
    for part in reversed(path):
        if part in hints:
            return hints[part]
    return "see `kit schema`"


def _allowed_keys(path: tuple) -> list[str]:
    model: Any = Spec
    for part in path:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        model = _model_in(annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


# --------------------------------------------------------------------------- checks across fields


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

    @classmethod
    def of(cls, spec: Spec) -> "Parts":
        return cls(list(enumerate(spec.services)), spec.domain, spec.tls, spec.models_root,
                   spec.gpu_memory_gib, spec.site, spec.observability, spec.engine,
                   spec.hf_cache)

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
        )


def _valid(kind: Any, value: Any) -> Any:
    """`value` validated as `kind` under the spec's strict rules, or None when it is not."""
    config = None if isinstance(kind, type) and issubclass(kind, BaseModel) else STRICT
    try:
        return TypeAdapter(kind, config=config).validate_python(value)
    except ValidationError:
        return None


def cross_checks(
    parts: Parts, *, spec_dir: Path, check_host: bool, check_capacity: bool = True
) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    problems += _unique_names(parts.services)
    problems += _gpu_sharing(parts.services)
    problems += _extra_args(parts.services)
    problems += _metrics_flags(parts.services, parts.observability)
    problems += _kit_read_env(parts.services)
    problems += _tls_files(parts, spec_dir)
    problems += _ca_bundle(parts, spec_dir)
    problems += _acme_domain(parts)
    problems += _multi_node(parts)
    if check_host and is_local(resolve(parts.engine)):  # elsewhere: the engine's preflight
        problems += _bind_sources(parts, resolve(parts.engine))
        if parts.models_root is not None:
            problems += _model_dirs(parts, check_capacity)
    return problems


def _bind_sources(parts: Parts, engine: str) -> list[SpecProblem]:
    """The folders vLLM's containers bind, as this host resolves them (symlinks followed): no
    system folder, nor one holding the engine's socket (its default one, and `engine:`'s)."""
    sockets = tuple(dict.fromkeys(os.path.realpath(socket.removeprefix("unix://")) for socket in (
        DEFAULT_HOST, engine) if socket.startswith("unix:///")))
    problems = []
    for key, path in (("models_root", parts.models_root), ("hf_cache", parts.hf_cache)):
        if path is None:
            continue
        real = os.path.realpath(path)
        refusal = names.bind_refusal(real, sockets)
        if refusal:
            shown = str(path) if real == names.normal_path(str(path)) else \
                f"{path} (a symlink to {real})"
            problems.append(SpecProblem((key,), f"{shown} {refusal}", BIND_FIX))
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
        total = sum(by_index[i].gpu_memory_utilization for i in users)
        if len(users) > 1 and total > GPU_SHARE_LIMIT + 1e-9:
            names_ = ", ".join(by_index[i].name for i in users)
            problems.append(SpecProblem(
                ("services", users[-1], "gpus"),
                f"GPU {gpu} is shared by {names_} whose gpu_memory_utilization adds up to "
                f"{total:.2f} (> {GPU_SHARE_LIMIT}); vLLM would fail to allocate at start",
                "lower gpu_memory_utilization of the services sharing it, or move one elsewhere",
            ))
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


# extra_args flags that would undo what the observability keys ask of vLLM: key → flag → why.
METRICS_FLAGS = {
    "slo": {"--custom-histogram-buckets": "kit writes the histogram bounds from slo (vLLM's "
            "defaults plus the SLO, so the SLO line is exact) and vLLM would keep only one"},
    "observability.enabled": {"--disable-log-stats": "it removes every vllm:* metric "
                              "Prometheus scrapes"},
}


def _metrics_flags(
    services: list[tuple[int, Service]], observability: Observability | None
) -> list[SpecProblem]:
    """A flag in extra_args that contradicts slo or observability.enabled."""
    table = flag_table()
    enabled = observability is not None and observability.enabled
    problems = []
    for i, service in services:
        keys = [key for key, on in (("slo", service.slo is not None),
                                    ("observability.enabled", enabled)) if on]
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


def spec_warnings(spec: Spec, spec_path: Path) -> list[str]:
    """Things that are allowed but worth saying before start-up."""
    warnings = _exposed_secrets(spec, spec_path)
    version = image_version(spec.images.vllm)
    if version != SHIPPED_VERSION:
        warnings.append(
            f"images.vllm {spec.images.vllm!r} is not vLLM {SHIPPED_VERSION}: extra_args were "
            f"checked against the {SHIPPED_VERSION} flag list, the newest kit knows"
        )
    if not spec.auth.users and not spec.auth.api_keys:
        warnings.append("auth has no users and api_keys is off: only kit's probe can get in")
    for i, service in enumerate(spec.services):
        if is_hub_id(spec.models_root, service.model):
            warnings.append(
                f"DOWNLOAD: services[{i}] ({service.name}) model {service.model!r} is no "
                f"directory under {spec.models_root}, so vLLM downloads it from the Hugging Face "
                "Hub and the backend network gets internet access for every service; if it is "
                "a typo of a local model, fix services[].model"
            )
    return warnings


def is_hub_id(models_root: Path, model: str) -> bool:
    """`org/name` is a Hub id unless that directory exists under models_root on this host."""
    return "/" in model and not (models_root / model).is_dir()


def _tls_files(parts: Parts, spec_dir: Path) -> list[SpecProblem]:
    """Files mode: both files readable, and a pair that serves the domain (render's check)."""
    tls = parts.tls
    if tls is None or tls.mode != "files":
        return []
    problems = []
    content = {}
    for key in ("cert", "key"):
        value = getattr(tls, key)
        path = value if value.is_absolute() else spec_dir / value
        try:
            content[key] = path.read_bytes()
        except FileNotFoundError:
            problems.append(SpecProblem(
                ("tls", key), f"file {path} does not exist",
                f"point tls.{key} at your PEM {key} file (paths are relative to the spec)",
            ))
        except OSError as error:
            problems.append(SpecProblem(
                ("tls", key), f"cannot read {path}: {error.strerror or error}",
                "make it readable by the user running kit (or run kit as that user)",
            ))
    if problems or parts.domain is None:
        return problems
    from kit.credentials.tls import cert_problems  # TLS parsing only where there are files

    return [
        SpecProblem(("tls", "cert"), f"tls.cert/tls.key cannot be used: {problem}",
                    f"point tls.cert and tls.key at a current certificate for {parts.domain} "
                    "and its key")
        for problem in cert_problems(content["cert"], content["key"], parts.domain,
                                     str(tls.cert))
    ]


def _ca_bundle(parts: Parts, spec_dir: Path) -> list[SpecProblem]:
    """tls.ca_bundle: readable, CA certificates in PEM and nothing else (never a key)."""
    if parts.tls is None or parts.tls.ca_bundle is None:
        return []
    path = parts.tls.ca_bundle if parts.tls.ca_bundle.is_absolute() else (
        spec_dir / parts.tls.ca_bundle)
    fix = ("point tls.ca_bundle at the PEM certificate(s) of the CA that signs your ACME "
           "server and its certificates (step-ca: its root_ca.crt; paths are relative to the "
           "spec)")
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return [SpecProblem(("tls", "ca_bundle"), f"file {path} does not exist", fix)]
    except OSError as error:
        return [SpecProblem(("tls", "ca_bundle"), f"cannot read {path}: "
                            f"{error.strerror or error}",
                            "make it readable by the user running kit (or run kit as that user)")]
    from kit.credentials.tls import ca_bundle_problems  # TLS parsing only where there is a file

    return [SpecProblem(("tls", "ca_bundle"), f"{path}: {problem}", fix)
            for problem in ca_bundle_problems(content)]


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


def _is_ip(value: str) -> bool:
    try:
        names.ip(value)
    except ValueError:
        return False
    return True


def _model_dirs(parts: Parts, check_capacity: bool) -> list[SpecProblem]:
    """Checks that need the model directory on this host (skipped when it is elsewhere)."""
    models_root = parts.models_root
    if models_root is None or not models_root.is_dir():
        return []  # rendering away from the GPU server: nothing to check here
    problems = []
    for i, service in parts.services:
        model_dir = models_root / service.model
        if is_hub_id(models_root, service.model):
            continue  # vLLM downloads it (spec_warnings says so)
        if not model_dir.is_dir():
            problems.append(SpecProblem(
                ("services", i, "model"),
                f"model directory {model_dir} does not exist",
                f"put the model under {models_root} or set model to an org/name Hub id",
            ))
            continue
        if (model_dir / "config.json").is_file():
            problems += _model_problems(parts, i, service, model_dir, check_capacity)
    return problems


def _model_problems(
    parts: Parts, i: int, service: Service, model_dir: Path, check_capacity: bool
) -> list[SpecProblem]:
    """What vLLM would refuse about this model directory, at the key that can fix it."""
    from kit.plan.fit import service_capacity
    from kit.plan.modelinfo import inspect_model_dir  # only where there is a config to read

    try:
        info = inspect_model_dir(model_dir)
    except BadInput as error:
        return [SpecProblem(("services", i, "model"), error.message, error.fix)]
    problems = [
        SpecProblem(("services", i, "model"), error,
                    "complete the model directory (re-download the missing or pointer files)")
        for error in info.errors
    ]
    if info.requires_trust_remote_code and not service.trust_remote_code:
        problems.append(SpecProblem(
            ("services", i, "trust_remote_code"),
            "the model's config.json has auto_map (custom code); vLLM refuses it without "
            "trust_remote_code",
            "set trust_remote_code: true if you trust this model's code",
        ))
    memory = [gpu_memory_for(parts.gpu_memory_gib, gpu) for gpu in service.gpus]
    if check_capacity and None not in memory:  # the plan covers heads and max_model_len too
        try:
            errors = service_capacity(info, service, min(memory)).errors
        except BadInput as error:
            errors = [error.message]
        return problems + [
            SpecProblem(("services", i), f"cannot start on this hardware: {error}",
                        "see `kit plan` for the capacity table")
            for error in errors if error not in info.errors
        ]
    heads = info.num_attention_heads
    if heads and heads % service.tp:
        problems.append(SpecProblem(
            ("services", i, "gpus"),
            f"tensor parallel size {service.tp} does not divide the model's "
            f"{heads} attention heads",
            "use a GPU count that divides the head count (e.g. 1, 2, 4, 8)",
        ))
    limit = info.derived_max_model_len
    if limit and service.max_model_len > limit:
        problems.append(SpecProblem(
            ("services", i, "max_model_len"),
            f"max_model_len {service.max_model_len} is above the model's limit {limit} "
            f"(vLLM refuses to start)",
            f"set max_model_len to at most {limit}",
        ))
    return problems


def _exposed_secrets(spec: Spec, spec_path: Path) -> list[str]:
    """A spec holding tokens should not be readable by everyone (its env values are secrets)."""
    secret_names = [
        f"services[{service.name}].env.{name}" for service in spec.services for name in service.env
        if name.endswith(("_TOKEN", "_KEY", "_SECRET")) or "PASSWORD" in name
    ]
    if secret_names and spec_path.stat().st_mode & 0o004:
        return [f"{spec_path} holds {', '.join(secret_names)} and anyone on this host can read it: "
                f"chmod 600 {spec_path} (kit keeps these values in compose/<service>.env, 0600)"]
    return []
