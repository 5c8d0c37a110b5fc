"""The site spec's schema: what the operator may write in site.yaml, as strict pydantic models.

Every text value is allow-listed by what it is (kit/names.py) and every vLLM flag checked against
the pinned flag table (kit/spec/vllm_flags.py). Loading with positions: kit/spec/load.py.
"""

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, overload

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)

from kit import names
from kit.engine.url import spec_engine
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
    REVISION,
    SERVED_NAME,
    SERVICE_NAME,
    SHA256,
    SITE_NAME,
    SIZE,
    SMTP_USER,
    USER_NAME,
)
from kit.spec.vllm_flags import (
    SHIPPED_VERSION,
    choices,
    serving_task,
)

DEFAULT_SPEC = Path("site.yaml")
# What `offline: true` gives every vLLM container: the Hub client never asks the network (a Hub
# id is served from hf_cache, files from models_root) and vLLM sends no usage statistics.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
GPU_SHARE_LIMIT = 0.95
RESERVED_USERS = {"kit-probe"}
# The whole request body sits in one nginx buffer (route.js reads it): bounded like memory.
MAX_BODY_BYTES = (1 << 10, 1 << 30)
MAX_TIMEOUT = 86400  # seconds: a day, for the slowest start or the longest generation
# The host's CPU cores (`cpus:`) and a service's vLLM API-server processes (`api_servers:`,
# vLLM's --api-server-count; kit/plan/api_servers.py decides `auto`, docs/capacity.md).
CPU_BOUNDS = (1, 1024)
API_SERVER_BOUNDS = (1, 16)
# Env variables whose value kit itself reads (and how it must look).
ENGINE_READY_TIMEOUT = "VLLM_ENGINE_READY_TIMEOUT_S"


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


def _cpu_count(value: int) -> int:
    low, high = CPU_BOUNDS
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low}..{high}: write the host's CPU cores as "
                         "`nproc` counts them (e.g. cpus: 16), or remove cpus")
    return value


def _api_server_count(value: int) -> int:
    low, high = API_SERVER_BOUNDS
    if not low <= value <= high:
        raise ValueError(f"{value} API-server processes is outside {low}..{high}: write auto "
                         f"(kit chooses from the host's cpus) or a count in {low}..{high}")
    return value


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
MIN_NGINX = (1, 25, 1)  # `http2 on;`; the njs API the door's modules use is in njs 0.7.9 and 0.8.x


class Images(StrictModel):
    vllm: Annotated[str, Field(pattern=IMAGE_REF)] = f"vllm/vllm-openai:v{SHIPPED_VERSION}"
    nginx: Annotated[str, Field(pattern=IMAGE_REF)] = "nginx:1.27-alpine"
    certbot: Annotated[str, Field(pattern=IMAGE_REF)] = "certbot/certbot:v3.1.0"  # acme mode
    # observability.enabled
    prometheus: Annotated[str, Field(pattern=IMAGE_REF)] = "prom/prometheus:v3.5.0"
    grafana: Annotated[str, Field(pattern=IMAGE_REF)] = "grafana/grafana:12.1.1"
    # observability.alerts (docs/observability.md, "Delivered alerts")
    alertmanager: Annotated[str, Field(pattern=IMAGE_REF)] = "prom/alertmanager:v0.33.1"

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
    # acme mode: after a failed certbot run, the first retry this many seconds later (doubling up
    # to 1 h, or later when the CA names a time). Sooner suits a private CA you control; Let's
    # Encrypt counts failed validations (5 an hour per name): keep the default there.
    acme_retry_s: Annotated[int, Field(ge=10, le=3600)] = 60
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
        if self.mode != "acme" and (self.acme_server or self.staging
                                    or "acme_retry_s" in self.model_fields_set):
            raise ValueError(f"tls.acme_server/tls.staging/tls.acme_retry_s are only read in "
                             f"mode acme, not {self.mode}")
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
    # How long a Basic credential's verdict (valid or not) is trusted before the verifier is
    # asked again, in the background (docs/auth.md): shorter, a revoked password held by no
    # rotation stops sooner; longer, fewer bcrypt checks. Rotations drop every verdict anyway.
    password_recheck_s: Annotated[int, Field(ge=5, le=3600)] = 60
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
    # the sibling spec <fleet>/<name>/site.yaml (kit/nodes/worker_nodes.py).
    engine: EngineAddress | None = None


class Slo(StrictModel):
    """A service's latency objective (p95): exact bucket bounds in vLLM's histograms, the SLO
    panels and the SLO alerts (docs/observability.md)."""

    ttft_p95_ms: Annotated[int, Field(ge=1, le=3_600_000)] | None = None  # time to first token
    tpot_p95_ms: Annotated[int, Field(ge=1, le=60_000)] | None = None  # time per output token

    @model_validator(mode="after")
    def _one_set(self) -> "Slo":
        if self.ttft_p95_ms is None and self.tpot_p95_ms is None:
            raise ValueError("slo sets ttft_p95_ms, tpot_p95_ms or both")
        return self


class Webhook(StrictModel):
    """A webhook receiver: its URL (which often holds a token) lives in a file of its own."""

    url_file: FilePath  # relative to the spec; 0600, one http(s) URL


class Smtp(StrictModel):
    host: Host
    port: Annotated[int, Field(ge=1, le=65535)] = 587
    username: Annotated[str, Field(pattern=SMTP_USER)] | None = None
    password_file: FilePath | None = None  # relative to the spec; 0600, the password alone
    require_tls: bool = True  # STARTTLS before anything is sent (off: a relay on a trusted LAN)

    @model_validator(mode="after")
    def _password_with_user(self) -> "Smtp":
        if (self.username is None) != (self.password_file is None):
            raise ValueError("smtp.username and smtp.password_file go together (or neither: a "
                             "relay that asks no login)")
        return self


class Email(StrictModel):
    to: Annotated[str, Field(pattern=EMAIL, max_length=254)]
    sender: Annotated[str, Field(pattern=EMAIL, max_length=254, alias="from")]
    smtp: Smtp


class Receiver(StrictModel):
    """One place alerts go: exactly one of a webhook, an email, a Slack incoming webhook."""

    webhook: Webhook | None = None
    email: Email | None = None
    slack_webhook_file: FilePath | None = None  # relative to the spec; 0600, Slack's URL

    @model_validator(mode="after")
    def _one_kind(self) -> "Receiver":
        kinds = [self.webhook, self.email, self.slack_webhook_file]
        if sum(kind is not None for kind in kinds) != 1:
            raise ValueError("a receiver is one of webhook: {url_file: …}, email: {…} or "
                             "slack_webhook_file: …")
        return self


class Alerts(StrictModel):
    """Alertmanager beside Prometheus: kit's alerts delivered, grouped, repeated while firing
    (docs/observability.md, "Delivered alerts")."""

    receivers: Annotated[list[Receiver], Field(min_length=1, max_length=16)]
    group_wait: Annotated[int, Field(ge=0, le=3600)] = 30  # s before a new group's first notice
    group_interval: Annotated[int, Field(ge=1, le=86400)] = 300  # s between a group's updates
    repeat_interval: Annotated[int, Field(ge=60, le=604800)] = 14400  # s: still firing, again


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
    alerts: Alerts | None = None  # Alertmanager and where it delivers; unset: none rendered

    @model_validator(mode="after")
    def _alerts_need_prometheus(self) -> "Observability":
        if self.alerts is not None and not self.enabled:
            raise ValueError("observability.alerts needs observability.enabled: true (Prometheus "
                             "evaluates the rules Alertmanager delivers)")
        return self


def _ledger_size(value: str) -> str:
    if names.size_bytes(value) < MIN_LEDGER_BYTES:
        raise ValueError(f"{value} is too small for the usage ledger: give it at least 64m")
    return value


MIN_LEDGER_BYTES = 64 << 20


class Usage(StrictModel):
    """The usage ledger (docs/usage.md): one record per request through the front door, kept on
    the server in a named volume, read by `kit usage` and `kit audit`."""

    enabled: bool = True
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 400  # an audit year and a month
    # the ledger's bound on disk: beyond it the oldest days go first (recorded in pruned.jsonl)
    max_disk: Annotated[str, Field(pattern=SIZE), AfterValidator(_ledger_size)] = "20g"
    gpu_hour_cost: Annotated[float, Field(ge=0, le=1_000_000)] | None = None  # chargeback
    # the window requests nobody authenticated, and refusals, are counted in, one record each per
    # address (docs/usage.md, "Aggregated records"); None: the collector's own, 60 s
    aggregate_seconds: Annotated[int, Field(ge=10, le=3600)] | None = None
    # a door record still missing (a later one arrived) this long with the collector caught up
    # is counted lost (docs/usage.md, "Lost records"); None: the collector's own, 30 s
    lost_after_seconds: Annotated[int, Field(ge=5, le=3600)] | None = None


DEFAULT_EPSILON = 0.25  # prefix routing's load bound: no replica above 1.25 × the mean


class Routing(StrictModel):
    """How the front door spreads a service's requests over its replicas (least connections
    unless an affinity keeps a session or a conversation on one replica; prefix routing under a
    load bound: docs/routing.md)."""

    affinity: Literal["none", "header", "prefix"] = "none"
    header: Annotated[str, Field(pattern=HEADER_NAME)] | None = None
    # prefix only: a replica takes a request while it carries at most (1 + ε) × the mean in flight
    epsilon: Annotated[float, Field(ge=0.05, le=4)] | None = None

    @model_validator(mode="after")
    def _header_for_header_affinity(self) -> "Routing":
        if self.affinity == "header" and self.header is None:
            raise ValueError("affinity header needs `header:` (e.g. header: X-Session-ID)")
        if self.affinity != "header" and self.header is not None:
            raise ValueError(f"`header:` is only read with affinity header (not {self.affinity})")
        if self.affinity != "prefix" and self.epsilon is not None:
            raise ValueError(f"`epsilon:` is only read with affinity prefix (not {self.affinity})")
        return self

    def load_bound(self) -> float:
        """Prefix routing's ε (the spec's, else DEFAULT_EPSILON)."""
        return DEFAULT_EPSILON if self.epsilon is None else self.epsilon


class Adapter(StrictModel):
    """A LoRA adapter served on its service's base model (docs/adapters.md): clients ask for it
    by `name` as a model; `path` is a folder under models_root or a Hub id (org/name)."""

    name: Annotated[str, Field(pattern=SERVED_NAME)]
    path: Annotated[str, Field(pattern=MODEL_REF, max_length=200)]
    # a Hub adapter's commit or branch, served from its snapshot in hf_cache (vLLM's
    # --lora-modules cannot pin one itself)
    revision: Annotated[str, Field(pattern=REVISION)] | None = None
    sha256: Annotated[str, Field(pattern=SHA256)] | None = None  # adapter weights


IDLE_SLEEP_UNITS = {"s": 1, "m": 60, "h": 3600}
IDLE_SLEEP_BOUNDS = (10, 7 * 86400)  # seconds: at least a few requests' gap, at most a week
# idle_sleep.min_awake: how long a swap group's member woken keeps its GPUs against a partner
# while in use (docs/sleep.md). At most 60 s: a partner's request held meanwhile must still be
# answered within the waker's 120 s (kit/plan/waker.py WAKE_TIMEOUT_S), its sleep and wake
# included; 0s swaps at once (each request for the other model a switch).
MIN_AWAKE_BOUNDS = (0, 60)
MIN_AWAKE_DEFAULT_S = 30


def _with_unit(value: Any) -> Any:
    """A bare number is the likely slip (`after: 15`): say which unit is missing."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"{value} has no unit: write it with s, m or h (e.g. {value}m)")
    return value


def _duration_seconds(value: str, bounds: tuple[int, int], upper: str, examples: str,
                      in_range: str) -> int:
    """`90s`, `15m`, `2h`: a whole number and one unit, within `bounds` (seconds; `upper` is
    the upper one as the message writes it)."""
    match = re.fullmatch(r"(0|[1-9][0-9]{0,5})([smh])", value)
    if match is None:
        raise ValueError(f"{value!r} is not a duration: write a whole number and s, m or h "
                         f"(e.g. {examples})")
    seconds = int(match[1]) * IDLE_SLEEP_UNITS[match[2]]
    if not bounds[0] <= seconds <= bounds[1]:
        raise ValueError(f"{value!r} is outside {bounds[0]}s..{upper}: write a duration in "
                         f"that range (e.g. {in_range})")
    return seconds


def _idle_duration(value: str) -> str:
    _duration_seconds(value, IDLE_SLEEP_BOUNDS, f"{IDLE_SLEEP_BOUNDS[1] // 3600}h",
                      "90s, 15m, 2h", "15m")
    return value


def _min_awake_duration(value: str) -> str:
    _duration_seconds(value, MIN_AWAKE_BOUNDS, f"{MIN_AWAKE_BOUNDS[1]}s", "0s, 30s, 1m", "30s")
    return value


class IdleSleep(StrictModel):
    """vLLM's sleep mode for an idle service (docs/sleep.md): level 1 offloads the weights to
    CPU memory and drops the KV cache, level 2 drops the weights too."""

    after: Annotated[str, BeforeValidator(_with_unit), AfterValidator(_idle_duration)]
    level: Annotated[int, Field(ge=1, le=2)] = 1  # vLLM's sleep levels
    # Services of one swap group may share GPUs beyond what fits awake at once: waking one puts
    # the least recently used ones sharing its GPUs to sleep first (docs/sleep.md).
    swap_group: Annotated[str, Field(pattern=SERVICE_NAME)] | None = None
    # A member woken keeps its GPUs against its partners' requests this long while it is in use
    # (default MIN_AWAKE_DEFAULT_S): a swap group cannot thrash (docs/sleep.md).
    min_awake: Annotated[str, BeforeValidator(_with_unit),
                         AfterValidator(_min_awake_duration)] | None = None

    @property
    def after_seconds(self) -> int:
        return int(self.after[:-1]) * IDLE_SLEEP_UNITS[self.after[-1]]

    @property
    def min_awake_seconds(self) -> int:
        if self.min_awake is None:
            return MIN_AWAKE_DEFAULT_S
        return int(self.min_awake[:-1]) * IDLE_SLEEP_UNITS[self.min_awake[-1]]

    @model_validator(mode="after")
    def _min_awake_in_a_swap_group(self) -> "IdleSleep":
        if self.min_awake is not None and self.swap_group is None:
            raise ValueError("min_awake is how long a swap group's member stays awake against "
                             "its partners: give the service a swap_group, or remove min_awake")
        return self


class Service(StrictModel):
    name: Annotated[str, Field(pattern=SERVICE_NAME), AfterValidator(_yaml_safe_key)]
    model: Annotated[str, Field(pattern=MODEL_REF, max_length=200)]
    revision: Annotated[str, Field(pattern=REVISION)] | None = None  # pinned: docs/weights.md
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
    adapters: Annotated[list[Adapter], Field(max_length=256)] = []
    idle_sleep: IdleSleep | None = None
    # vLLM's API-server processes (--api-server-count), each on a core of its own: auto (kit
    # chooses from the host's `cpus:`, docs/capacity.md) or a count
    api_servers: Annotated[int, AfterValidator(_api_server_count)] | Literal["auto"] = "auto"

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
    def _revision_of_a_hub_id(self) -> "Service":
        if self.revision is not None and "/" not in self.model:
            raise ValueError(f"revision pins a Hugging Face id (org/name), and {self.model!r} is "
                             "a local folder name; write the Hub id, or drop revision")
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

    @model_validator(mode="after")
    def _one_api_server_where_vllm_needs_it(self) -> "Service":
        """vLLM refuses to start with runtime LoRA updates (how kit adapters add loads an
        adapter) and more than one API-server process; a multi-node service's workers run
        --headless, which takes no API-server count."""
        if self.api_servers == "auto" or self.api_servers == 1:
            return self
        if self.adapters:
            raise ValueError(
                f"api_servers {self.api_servers} with adapters: vLLM refuses to start with "
                "runtime LoRA updates (how kit adapters add loads an adapter) and more than one "
                "API-server process (VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with "
                "api_server_count > 1); write api_servers: auto (1 here) or 1, or serve the "
                "adapters from a service of their own")
        if self.nodes is not None:
            raise ValueError(
                f"api_servers {self.api_servers} with nodes: the worker nodes run vLLM "
                "--headless, which takes no API-server count; write api_servers: auto (1 "
                "here) or 1")
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

    @property
    def task(self) -> str:
        """What it serves (GENERATE, EMBED, …), as its extra_args tell vLLM."""
        return serving_task(self.extra_args)


@overload
def _one_of(value: str, flag: str) -> str: ...
@overload
def _one_of(value: None, flag: str) -> None: ...
@overload
def _one_of(value: str | None, flag: str) -> str | None: ...
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
    usage: Usage = Usage()
    services: Annotated[list[Service], Field(min_length=1)]
    # The Docker engine this site runs on (kit/engine/url.py); unset: DOCKER_HOST or the socket.
    engine: EngineAddress | None = None
    # An air-gapped server: nothing kit starts may reach the Internet (docs/offline.md).
    offline: bool = False
    # The host's CPU cores (`nproc`): kit renders offline, so it never probes them; declared,
    # they let api_servers: auto give vLLM more API-server processes (docs/capacity.md).
    cpus: Annotated[int, AfterValidator(_cpu_count)] | None = None

    def model_names(self) -> list[str]:
        """Every name clients may ask for as `model`: served names and LoRA adapters."""
        return [name for s in self.services for name in (s.api_name, *(a.name for a in s.adapters))]

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
