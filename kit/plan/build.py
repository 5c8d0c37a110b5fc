"""Spec → Plan: what the spec means on this server, decided once and in one place.

The plan holds every decision the templates need (vLLM argv, GPU pinning, IPC mode, health timing,
nginx sizing); templates only lay it out. Pure apart from reading model configs on this host.
"""

import shlex
from dataclasses import dataclass, field
from typing import cast

from kit.engine.desired import NEVER_PULL
from kit.engine.replica_client import VLLM_PORT
from kit.errors import BadInput
from kit.layout import ACME_LAST_RUN, LORA_CONFIG, LORA_MOUNT, NGINX_MOUNT
from kit.plan.adapters import (
    CONFIG_FLAG,
    DERIVED_FLAGS,
    FILE_FLAGS,
    HUB_CACHE,
    MODULES_FLAG,
    RUNTIME_LORA_ENV,
    AdapterInfo,
    flag_values,
    lora_slots,
    service_adapters,
)
from kit.plan.api_servers import ApiServers, api_servers
from kit.plan.multinode import MultiNodePlan, multinode_plan
from kit.plan.observability import (
    MetricsNetwork,
    ObservabilityPlan,
    histogram_args,
    metrics_network,
    observability_plan,
    service_slo,
)
from kit.plan.usage import UsagePlan, usage_plan
from kit.plan.waker import WakerPlan, waker_plan
from kit.spec.model import OFFLINE_ENV, Service, Spec
from kit.spec.replicas import ReplicaPlan, replica_plans
from kit.spec.vllm_flags import DEV_MODE_ENV, SLEEP_MODE_FLAG
from kit.weights.lock import pinned_relative

# What every vLLM container runs: `vllm serve <model> <flags>`, the model as the positional
# argument (vLLM 0.20+ warns that `--model` "will be removed in a future version"). The pinned
# image's ENTRYPOINT is this already; kit sets it explicitly so an image whose ENTRYPOINT is the
# older `python3 -m vllm.entrypoints.openai.api_server` (no positional model) still serves.
VLLM_ENTRYPOINT = ("vllm", "serve")
MODELS_MOUNT = "/models"
# HF_HOME: each service's own writable cache (a volume of its own: Hub downloads, transformers'
# remote-code modules), never another service's — a replica runs a model's code (hostile).
HF_CACHE_MOUNT = "/root/.cache/huggingface"
HF_CACHE_VOLUME = "hf-cache"  # + "-<service>": the compose key of that volume
# The site's `hf_cache` folder (pinned Hub snapshots kit verifies; an offline site's Hub models):
# bound read-only into every replica, so no container can change what kit verified.
SITE_HF_CACHE_MOUNT = "/kit/hf-cache"
DEFAULT_ENGINE_READY_TIMEOUT = 600  # vLLM's VLLM_ENGINE_READY_TIMEOUT_S default
WEIGHT_LOAD_ALLOWANCE = 300  # seconds beyond the engine-ready timeout for download + load
STREAMS_WHEN_UNKNOWN = 256  # vLLM's max_num_seqs default on A100-class GPUs
HEALTHZ_PORT = 8081  # nginx's and the verifier's loopback healthcheck (/kit-healthz)
VERIFIER_PORT = 8081  # the verifier container's /verify, on the private auth network only
BCRYPT_PORT = 8082  # inside the verifier: the auth_basic check, behind the failed-login guard
# Limits set to `auto`: one address may use every stream slot, each starting a request a second.
REQUESTS_PER_SLOT_PER_MINUTE = 60
CONNECTIONS_PER_SLOT = 2  # a stream plus a keep-alive connection waiting for its next request
MAX_CONNECTIONS_PER_IP = 65535  # limit_conn's largest value
# Batch beside interactive (docs/policy.md, measured on the stand-in calibrated on an H100):
# a batch credential's prompts go upstream at most this many bytes a second per engine (about
# one full prefill budget of vLLM's 8,192 tokens a second at 8 bytes a token), while an
# interactive request came in the last BATCH_PACE_WINDOW_MS; a batch request waits at most
# BATCH_PACE_HOLD_MS at the door for its turn, else 429.
BATCH_PROMPT_BYTES_PER_ENGINE_S = 65536
BATCH_PACE_WINDOW_MS = 1000
BATCH_PACE_HOLD_MS = 3000
NGINX_CONF = f"{NGINX_MOUNT}/nginx.conf"
NGINX_TEST = ["nginx", "-c", NGINX_CONF, "-t"]  # how a reload is checked first, in any mode
# A replica that refused a connection (or timed out) is skipped for this long by each worker.
REPLICA_FAIL_TIMEOUT = 10
# A replica's server line while kit up replaces it (kit/converge/rollout.py writes it, the door's
# figures read it: the out-of-rotation alert).
OUT_OF_SERVICE = "# out of service: "
# A replica on this host's private network accepts within milliseconds or is gone (a killed
# container's address answers nothing): after this long nginx gives the request to another one.
REPLICA_CONNECT_TIMEOUT = 2
# Stopping a replica (a rolling update drained it first): vLLM finishes what it still runs for
# up to --shutdown-timeout seconds, and the engine waits a little longer before SIGKILL.
REPLICA_SHUTDOWN_TIMEOUT = 30
# The backend network of kit's own parts the front door reaches (door-figures), no replica on
# it; each service has its own beside it (ServicePlan.network).
BACKEND_NETWORK = "backend"
STOP_GRACE_PERIOD = 30  # a single-replica service (no --shutdown-timeout: vLLM's default, 0)
UNAVAILABLE_RETRY_AFTER = 5  # seconds a client is told to wait when no replica can take it
PREFIX_KEY = "$kit_pick"  # balance.js: the key nginx's hash upstream takes the chosen replica by
ADAPTER_KEY = "$kit_adapter"  # route.js: the LoRA adapter a request names ('' for a base model)


@dataclass(frozen=True)
class ServicePlan:
    name: str
    api_name: str
    image: str
    command: list[str]  # what follows VLLM_ENTRYPOINT: the model first, then the flags
    gpus: list[str]
    env: dict[str, str]
    ipc_host: bool
    model_is_local: bool
    start_period: int  # seconds the healthcheck tolerates failures: the model loads meanwhile
    max_num_seqs: int | None
    max_num_seqs_reason: str
    # vLLM's --max-model-len: no request's prompt + completion passes it (the door's budget
    # reservation of a request that names no max_tokens, docs/policy.md)
    max_model_len: int
    capacity: dict | None = None  # CapacityReport.to_json() when the model could be inspected
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    multinode: MultiNodePlan | None = None  # one vLLM over several servers (kit/plan/multinode.py)
    api_host: str = "127.0.0.1"  # where the healthcheck reaches vLLM inside its network
    # Each replica is its own container on its own tensor-parallel group of `gpus` (see
    # kit/spec/replicas.py). A single-replica service has one, named like the service itself.
    replicas: list[ReplicaPlan] = field(default_factory=list)
    affinity: str = "none"  # routing.affinity: none | header | prefix (multi-replica only)
    affinity_key: str | None = None  # the nginx variable the affinity upstream hashes
    load_bound: float | None = None  # prefix routing's ε: no replica above (1 + ε) × the mean
    adapters: tuple[str, ...] = ()  # LoRA adapters' names: models the door routes here too
    hub_adapters: bool = False  # an adapter vLLM downloads from the Hub (the backend goes out)
    # vLLM's --config file of the adapters (lora/<service>/adapters.yaml: --lora-modules and the
    # slot counts that follow the adapter count), read by a replica at every start; None: none
    lora_config: dict[str, list[str] | str] | None = None
    connect_timeout: int = 10  # nginx's proxy_connect_timeout to it (seconds)
    stop_grace_period: int = STOP_GRACE_PERIOD  # seconds the engine waits after SIGTERM
    swap_group: str | None = None  # idle_sleep.swap_group: started one member at a time
    sleep_level: int = 1  # idle_sleep.level
    # vLLM's API-server processes per replica (--api-server-count), and why (kit plan says it)
    api_servers: ApiServers = ApiServers(1, "vLLM's one")

    @property
    def usage_every_chunk(self) -> bool:
        """Whether the door asks usage on every chunk of every stream (docs/usage.md): where the
        per-chunk work is spread over several API-server processes, so an aborted stream's
        prompt is exact for every credential at a cost vLLM's one process could not carry."""
        return self.api_servers.count >= 2

    @property
    def routed_names(self) -> tuple[str, ...]:
        """Every model name the door routes to this service: its served name, its adapters'."""
        return (self.api_name, *self.adapters)

    @property
    def network(self) -> str | None:
        """The compose key of its own backend network: its replicas, the front door and (with
        idle_sleep) the waker only, so a replica (model code: hostile) reaches no other
        service's vLLM, dev routes included. None for a multi-node service (host network)."""
        return None if self.multinode else f"{BACKEND_NETWORK}-{self.name}"

    @property
    def cache_volume(self) -> str:
        """The compose key of its own Hugging Face cache (HF_HOME): its replicas (and a
        multi-node service's worker nodes) alone write it."""
        return f"{HF_CACHE_VOLUME}-{self.name}"

    @property
    def affinity_hash(self) -> str | None:
        """What the affinity upstream hashes: the key, with the adapter a request names when the
        service has adapters (vLLM's prefix cache is per adapter; route.js's prefix key holds
        it)."""
        if self.affinity_key is None or not self.adapters or self.affinity_key == PREFIX_KEY:
            return self.affinity_key
        return self.affinity_key + ADAPTER_KEY

    @property
    def retry_window(self) -> int:
        """Seconds after which nginx stops passing a request on to another replica: long enough
        to try each one, far shorter than a generation (a begun answer is never resent)."""
        return self.connect_timeout * len(self.replicas)

    @property
    def streams(self) -> int:
        """Requests the whole service runs at once: every replica's max_num_seqs."""
        return (self.max_num_seqs or STREAMS_WHEN_UNKNOWN) * max(1, len(self.replicas))


MAX_WORKER_CONNECTIONS = 65536
# vLLM 0.33: fcfs (its default) or priority. kit renders priority for every service from the
# start: with every request at the same priority it serves in arrival order, as fcfs does, and
# the first batch credential (docs/policy.md) then changes no vLLM command, so restarts nothing.
SCHEDULING_POLICY = "--scheduling-policy"


@dataclass(frozen=True)
class NginxPlan:
    bind: str
    https_port: int
    http_port: int
    max_body: str
    read_timeout: int
    connect_timeout: int
    worker_connections: int
    # Set by nginx.conf alone (a reload applies it, up to the engine's hard limit: checked by
    # kit/front_door/reload.py), never by the container's config: that would recreate the front
    # door, cutting every stream, whenever replicas or max_num_seqs change.
    worker_rlimit_nofile: int
    upstream_keepalive: int
    rate_per_ip: int
    rate_per_credential: int
    failed_logins_per_ip: int
    password_recheck_s: int  # a cached password verdict's life (proxy_cache_valid)
    max_connections_per_ip: int
    api_keys: bool
    # A batch credential's requests in flight (docs/policy.md): half the smallest service's
    # slots, so batch never holds every running slot (vLLM does not preempt running requests).
    batch_in_flight: int
    # ... and while interactive requests come (one in the last batch_pace_window_ms), its
    # requests go upstream at most batch_prompt_bytes_per_s of body a second (held at the door
    # for their turn, refused when it is over batch_pace_hold_ms away): vLLM computes running
    # requests' prompts first, so unpaced batch prompts make interactive's first token wait
    batch_prompt_bytes_per_s: int
    batch_pace_window_ms: int = BATCH_PACE_WINDOW_MS
    batch_pace_hold_ms: int = BATCH_PACE_HOLD_MS
    verifier_port: int = VERIFIER_PORT
    bcrypt_port: int = BCRYPT_PORT
    healthz_port: int = HEALTHZ_PORT

    @property
    def http2_streams_per_connection(self) -> int:
        """A gateway may carry all its address's streams on one HTTP/2 connection: limit_conn
        counts each h2 stream as a connection, so the per-address limit is the only bound
        (nginx's default of 128 streams would queue a 256-stream gateway for no reason)."""
        return self.max_connections_per_ip

    @property
    def retry_after(self) -> int:
        """Seconds until a rate-limited client has a request's worth of budget again."""
        return max(1, -(-60 // min(self.rate_per_ip, self.rate_per_credential)))

    @property
    def published(self) -> list[str]:
        """Compose port mappings: host bind address (bracketed when IPv6) → nginx's 443/80."""
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return [f"{host}:{self.https_port}:443", f"{host}:{self.http_port}:80"]


@dataclass(frozen=True)
class AcmePlan:
    """Certificates from an ACME CA: certbot answers the HTTP-01 challenge through nginx."""

    image: str
    email: str
    domain: str
    server: str | None
    staging: bool
    retry_first: int  # a failed run is retried this soon (tls.acme_retry_s), doubling to retry_max
    renew_every: int = 43200  # seconds between `certbot certonly --keep-until-expiring` runs
    retry_max: int = 3600
    watch_every: int = 5  # nginx checks its certificate file this often and reloads on change
    webroot: str = "/var/www/acme"
    cert_name: str = "kit"
    tls_mount: str = "/kit-tls"  # nginx/tls of the site, writable for certbot only
    certbot_log: str = "/var/log/letsencrypt/letsencrypt.log"  # certbot's log of its last run
    trusts_bundle: bool = False  # tls.ca_bundle: certbot trusts it (only it) for the directory
    trust_mount: str = "/kit-trust"  # nginx/trust of the site, read-only
    trust_file: str = "/kit-trust/ca-bundle.pem"  # REQUESTS_CA_BUNDLE in certbot's container

    @property
    def install(self) -> str:
        """Copy certbot's certificate into nginx/tls unless nginx/tls already holds it: after a
        renewal, and also when certbot had nothing to renew but nginx/tls is new (a re-created
        site with the letsencrypt volume kept). Key first, each by rename, key private."""
        live = f"/etc/letsencrypt/live/{self.cert_name}"
        tls = self.tls_mount
        return (
            f"cmp -s {live}/fullchain.pem {tls}/server.crt || {{ "
            f"install -m 600 {live}/privkey.pem {tls}/.server.key.new && "
            f"install -m 644 {live}/fullchain.pem {tls}/.server.crt.new && "
            f"mv -f {tls}/.server.key.new {tls}/server.key && "
            f"mv -f {tls}/.server.crt.new {tls}/server.crt; }}"
        )

    @property
    def loop(self) -> str:
        """certbot obtains the certificate, then keeps renewing it (a no-op until 30 days left);
        each run's outcome lands in nginx/tls for `kit up`/`kit status` (with the seconds until
        the next run), a failure is retried within minutes (doubling), not at the next 12-hourly
        run. A failed run's outcome ends with the CA's problem from certbot's log: certbot before
        2.2 on Python 3.11+ (Debian 12's 2.1) prints only "AttributeError: can't set attribute"
        for an error the CA answered, a rate limit among them (certbot/certbot#9539)."""
        argv = [
            "certbot", "certonly", "--webroot", "-w", self.webroot, "-d", self.domain,
            "--cert-name", self.cert_name, "--email", self.email, "--agree-tos",
            "--non-interactive", "--keep-until-expiring",
        ]
        if self.staging:
            argv.append("--staging")
        if self.server:
            argv += ["--server", self.server]
        tls, result = self.tls_mount, f"{self.tls_mount}/{ACME_LAST_RUN}"
        return (
            f"trap exit TERM; rm -f {result}; delay={self.retry_first}; while :; do "
            f"{shlex.join(argv)} >{tls}/.acme-run 2>&1 && {{ {self.install}; }} >>{tls}/.acme-run "
            f"2>&1; rc=$?; [ $rc = 0 ] || grep -m 1 -F 'acme.messages.Error: ' "
            f"{self.certbot_log} >>{tls}/.acme-run 2>/dev/null; "
            f"next=$delay; [ $rc = 0 ] && next={self.renew_every}; {self._ca_retry_after}"
            f"{{ echo \"exit=$rc at=$(date +%s) next=$next\"; cat {tls}/.acme-run; }} "
            f">{result}.new && mv -f {result}.new {result}; "
            f"if [ $rc = 0 ]; then delay={self.retry_first}; else delay=$((delay * 2 > "
            f"{self.retry_max} ? {self.retry_max} : delay * 2)); fi; sleep $next & wait; done"
        )

    @property
    def _ca_retry_after(self) -> str:
        """A failed run waits at least until the time the CA named: Let's Encrypt's rate-limit
        problem says "retry after 2026-12-01 09:00:00 UTC", and asking earlier is refused again."""
        return (
            f"[ $rc = 0 ] || {{ ra=$(grep -o 'retry after [0-9-]* [0-9:]* UTC' "
            f"{self.tls_mount}/.acme-run | tail -n 1 | cut -d ' ' -f 3,4); [ -n \"$ra\" ] && "
            "ra=$(date -u -d \"$ra\" +%s 2>/dev/null) && wait_s=$((ra - $(date +%s) + 1)) && "
            "[ $wait_s -gt $next ] && next=$wait_s; }; "
        )

    @property
    def watch(self) -> str:
        """nginx's side: reload in place (new workers, streams finish on the old ones) within
        watch_every seconds of certbot installing a certificate, once it passes `nginx -t`."""
        cert = f"{NGINX_MOUNT}/tls/server.crt"
        return (
            f"old=$(cksum < {cert}); while :; do sleep {self.watch_every}; "
            f"new=$(cksum < {cert}); if [ \"$new\" != \"$old\" ] && "
            f"{shlex.join(NGINX_TEST)} -q; then nginx -c {NGINX_CONF} -s reload && old=$new; fi; "
            "done"
        )


@dataclass(frozen=True)
class Plan:
    site: str
    domain: str
    nginx_image: str
    models_root: str
    hf_cache: str | None
    healthcheck_interval: int
    services: list[ServicePlan]
    nginx: NginxPlan
    tls_mode: str
    # the front door's private network towards Prometheus and Grafana (there even when
    # observability is off, so turning it on reloads the front door instead of recreating it)
    metrics: MetricsNetwork
    acme: AcmePlan | None = None
    warnings: list[str] = field(default_factory=list)
    observability: ObservabilityPlan | None = None  # Prometheus + Grafana when enabled
    usage: UsagePlan | None = None  # the usage ledger (on unless usage.enabled is false)
    offline: bool = False  # `offline: true`: nothing kit starts reaches a registry or the Hub
    waker: WakerPlan | None = None  # wakes and sleeps the services with idle_sleep

    @property
    def pull_policy(self) -> str | None:
        """Compose's `pull_policy` of every container: an offline site's engine never pulls
        (`kit load` brings the images; `kit up` refuses a missing one before any change)."""
        return NEVER_PULL if self.offline else None

    def egress(self, service: ServicePlan) -> bool:
        """Whether the service's own network goes out: only for a service whose vLLM downloads
        (a Hub model or adapter) on a site not offline; a replica of any other service gets no
        route out, whatever its neighbours download (model code: hostile)."""
        return not self.offline and not (service.model_is_local and not service.hub_adapters)

    @property
    def backend_internal(self) -> bool:
        """No vLLM of the site goes out (what a cluster's one egress policy can say)."""
        return not any(self.egress(service) for service in self.services)

    @property
    def url_host(self) -> str:
        """The domain as it stands in a URL or a Host header: an IPv6 address in brackets."""
        return f"[{self.domain}]" if ":" in self.domain else self.domain

    @property
    def nginx_command(self) -> list[str]:
        """nginx in the foreground; with ACME, a watcher reloads it when the certificate changes."""
        run = ["nginx", "-c", NGINX_CONF, "-g", "daemon off;"]
        if self.acme is None:
            return run
        return ["/bin/sh", "-c", f"{self.acme.watch} & exec {shlex.join(run)}"]


def build_plan(spec: Spec) -> Plan:
    servers = api_servers(spec)
    services = [_service_plan(spec, service, servers[service.name]) for service in spec.services]
    streams = sum(s.streams for s in services)
    # Each stream holds a client and an upstream connection; leave room for queued clients.
    worker_connections = min(MAX_WORKER_CONNECTIONS, max(4096, _next_power_of_two(streams * 4)))
    per_minute = streams * REQUESTS_PER_SLOT_PER_MINUTE
    warnings = [w for s in services for w in (s.capacity or {}).get("warnings", [])]
    metrics = metrics_network(spec.site, spec.observability.subnet)
    return Plan(
        site=spec.site,
        domain=spec.domain,
        nginx_image=spec.images.nginx,
        models_root=str(spec.models_root),
        hf_cache=str(spec.hf_cache) if spec.hf_cache else None,
        offline=spec.offline,
        healthcheck_interval=spec.healthcheck_interval,
        services=services,
        nginx=NginxPlan(
            bind=spec.proxy.bind,
            https_port=spec.proxy.https_port,
            http_port=spec.proxy.http_port,
            max_body=spec.proxy.max_body,
            read_timeout=spec.proxy.read_timeout,
            connect_timeout=spec.proxy.connect_timeout,
            worker_connections=worker_connections,
            worker_rlimit_nofile=worker_connections * 2,
            upstream_keepalive=256,  # a burst of streams reuses the last burst's connections
            rate_per_ip=_or_auto(spec.proxy.rate_limit_per_ip, per_minute),
            rate_per_credential=_or_auto(spec.proxy.rate_limit_per_credential, per_minute),
            failed_logins_per_ip=spec.proxy.failed_logins_per_ip,
            password_recheck_s=spec.proxy.password_recheck_s,
            max_connections_per_ip=_or_auto(
                spec.proxy.max_connections_per_ip,
                min(MAX_CONNECTIONS_PER_IP, streams * CONNECTIONS_PER_SLOT),
            ),
            api_keys=spec.auth.api_keys,
            batch_in_flight=max(1, min(s.streams for s in services) // 2),
            batch_prompt_bytes_per_s=BATCH_PROMPT_BYTES_PER_ENGINE_S
            * min(max(1, len(s.replicas)) for s in services),
        ),
        tls_mode=spec.tls.mode,
        metrics=metrics,
        acme=AcmePlan(
            image=spec.images.certbot,
            email=cast(str, spec.tls.email),  # the spec requires one in acme mode
            domain=spec.domain,
            server=spec.tls.acme_server,
            staging=spec.tls.staging,
            retry_first=spec.tls.acme_retry_s,
            trusts_bundle=spec.tls.ca_bundle is not None,
        ) if spec.tls.mode == "acme" else None,
        warnings=warnings,
        observability=observability_plan(spec),
        usage=usage_plan(spec),
        waker=waker_plan(spec, metrics),
    )


def _or_auto(value: int | str, derived: int) -> int:
    """A limit as set in the spec, or derived from the site's stream capacity when `auto`."""
    return derived if value == "auto" else int(value)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def model_is_local(spec: Spec, model: str) -> bool:
    """`org/name` is a Hub id unless that directory exists here; a bare name is always local."""
    return "/" not in model or (spec.models_root / model).is_dir()


def _service_plan(spec: Spec, service, servers: ApiServers) -> ServicePlan:
    pinned = pinned_relative(service)  # a pinned model is served from its pulled folder
    is_local = pinned is not None or model_is_local(spec, service.model)
    # The capacity model covers one tensor-parallel group on one server.
    planned = is_local and service.nodes is None and service.pipeline_parallel == 1
    capacity = _capacity(spec, service) if planned else None
    max_num_seqs, reason = _max_num_seqs(service, capacity)
    command = [
        # The positional model, first: vLLM refuses --served-model-name before it.
        f"{MODELS_MOUNT}/{pinned or service.model}" if is_local else service.model,
        "--served-model-name", service.api_name,
        "--tensor-parallel-size", str(service.tp),
        *(["--pipeline-parallel-size", str(service.pipeline_parallel)]
          if service.pipeline_parallel > 1 else []),
        "--max-model-len", str(service.max_model_len),
        "--gpu-memory-utilization", f"{service.gpu_memory_utilization:g}",
    ]
    if max_num_seqs is not None:
        command += ["--max-num-seqs", str(max_num_seqs)]
    if service.dtype != "auto":
        command += ["--dtype", service.dtype]
    if service.quantization:
        command += ["--quantization", service.quantization]
    if service.kv_cache_dtype != "auto":
        command += ["--kv-cache-dtype", service.kv_cache_dtype]
    if service.trust_remote_code:
        command += ["--trust-remote-code"]
    if service.idle_sleep is not None:  # /sleep and /wake_up, for kit only (docs/sleep.md)
        command += [SLEEP_MODE_FLAG]
    # A multi-node service is one replica here (its head) over all of gpus.
    replicas = replica_plans(service.name, service.gpus,
                             len(service.gpus) // service.replica_count)
    grace = STOP_GRACE_PERIOD
    if len(replicas) > 1:
        command += ["--shutdown-timeout", str(REPLICA_SHUTDOWN_TIMEOUT)]
        grace = REPLICA_SHUTDOWN_TIMEOUT + 10
    if not any(arg.startswith(SCHEDULING_POLICY)
               for arg in service.extra_args):  # the operator's wins
        command += [SCHEDULING_POLICY, "priority"]
    command += servers.args
    lora, lora_config, downloads = _lora_args(spec, service)
    command += ["--port", str(VLLM_PORT), *histogram_args(service_slo(service)), *lora,
                *service.extra_args]
    env = {"HF_HOME": HF_CACHE_MOUNT, **service.env, **(OFFLINE_ENV if spec.offline else {})}
    if spec.offline and spec.hf_cache is not None:  # a Hub id is served from the site's cache
        env.setdefault("HF_HUB_CACHE", f"{SITE_HF_CACHE_MOUNT}/{HUB_CACHE}")
    if service.idle_sleep is not None:
        env[DEV_MODE_ENV] = "1"
    if service.adapters:  # kit adapters add|remove: the runtime routes, kept inside the stack
        env.update(RUNTIME_LORA_ENV)
    affinity = service.routing.affinity if len(replicas) > 1 else "none"
    engine_timeout = service.engine_ready_timeout or DEFAULT_ENGINE_READY_TIMEOUT
    nodes = multinode_plan(service, command, env)
    return ServicePlan(
        name=service.name,
        api_name=service.api_name,
        image=spec.images.vllm,
        # This server runs the head of a multi-node service (the front door is here).
        command=nodes.args(nodes.head) if nodes else command,
        gpus=[str(gpu) for gpu in service.gpus],
        env=nodes.env(nodes.head) if nodes else env,
        ipc_host=service.tp > 1 or nodes is not None,
        model_is_local=is_local,
        start_period=service.startup_timeout or engine_timeout + WEIGHT_LOAD_ALLOWANCE,
        max_num_seqs=max_num_seqs,
        max_num_seqs_reason=reason,
        max_model_len=service.max_model_len,
        capacity=capacity,
        tensor_parallel=service.tp,
        pipeline_parallel=service.pipeline_parallel,
        multinode=nodes,
        api_host=nodes.head.address if nodes else "127.0.0.1",
        replicas=replicas,
        affinity=affinity,
        affinity_key=_affinity_key(affinity, service.routing.header),
        load_bound=service.routing.load_bound() if affinity == "prefix" else None,
        adapters=tuple(adapter.name for adapter in service.adapters),
        hub_adapters=downloads,
        lora_config=lora_config,
        connect_timeout=spec.proxy.connect_timeout if len(replicas) == 1
        else min(spec.proxy.connect_timeout, REPLICA_CONNECT_TIMEOUT),
        stop_grace_period=grace,
        swap_group=service.idle_sleep.swap_group if service.idle_sleep else None,
        sleep_level=service.idle_sleep.level if service.idle_sleep else 1,
        api_servers=servers,
    )


def _lora_args(spec: Spec, service: Service
               ) -> tuple[list[str], dict[str, list[str] | str] | None, bool]:
    """The flags that serve every declared adapter from the start: --enable-lora, the rank,
    slot and CPU-cache sizes (kit/plan/adapters.py; a value extra_args sets wins) and
    --lora-modules name=path; the --config file holding what follows the adapter list (the
    modules and the slot counts: kit adapters changes them without recreating a replica); and
    whether one is downloaded from the Hub. A multi-node service keeps them all in its command
    (its worker nodes have no such file)."""
    if not service.adapters:
        return [], None, False
    infos = service_adapters(service, spec.models_root, spec.hf_cache)
    slots = lora_slots(service, infos)
    if slots is None or not slots.rank:
        unknown = [a.name for a, info in zip(service.adapters, infos, strict=True)
                   if info.rank is None]
        raise BadInput(
            f"service {service.name}: the rank of adapter(s) {', '.join(unknown)} is unknown "
            "on this host (a Hub id, or files kit cannot read here)",
            fix=f"set --max-lora-rank in services[{service.name}].extra_args to a rank that "
                "holds them (or put the adapters under models_root)")
    derived = dict(zip(DERIVED_FLAGS, ("", str(slots.rank), str(slots.slots),
                                       str(max(slots.slots, len(service.adapters)))),
                       strict=True))
    given = flag_values(service)
    modules = [f"{name}={path}" for name, path in adapter_paths(spec, service, infos).items()]
    downloads = any(info.folder is None for info in infos)
    in_file = service.nodes is None
    args = [part for flag, value in derived.items() if flag not in given
            and not (in_file and flag in FILE_FLAGS) for part in (flag, value) if part]
    if not in_file:
        return [*args, MODULES_FLAG, *modules], None, downloads
    # vLLM turns each key into `--key value` (a list: `--key item…`) after the model, before
    # the command's flags: the command (extra_args) wins over the file, as vLLM defines it.
    document: dict[str, list[str] | str] = {
        flag.removeprefix("--"): derived[flag] for flag in FILE_FLAGS if flag not in given}
    document[MODULES_FLAG.removeprefix("--")] = modules
    return [*args, CONFIG_FLAG, f"{LORA_MOUNT}/{LORA_CONFIG}"], document, downloads


def adapter_paths(spec: Spec, service: Service,
                  infos: list[AdapterInfo] | None = None) -> dict[str, str]:
    """{adapter name: the path its replica's vLLM loads it from}: under the models mount, a
    pinned Hub snapshot under the site cache's read-only mount, or (unpinned) the Hub id vLLM
    downloads."""
    if infos is None:
        infos = service_adapters(service, spec.models_root, spec.hf_cache)
    paths = {}
    for adapter, info in zip(service.adapters, infos, strict=True):
        path = adapter.path  # a Hub id: vLLM downloads it
        if info.folder is not None and info.folder.is_relative_to(spec.models_root):
            path = f"{MODELS_MOUNT}/{info.folder.relative_to(spec.models_root)}"
        elif info.folder is not None and spec.hf_cache is not None:
            path = f"{SITE_HF_CACHE_MOUNT}/{info.folder.relative_to(spec.hf_cache)}"
        paths[adapter.name] = path
    return paths


def _affinity_key(affinity: str, header: str | None) -> str | None:
    """What the affinity upstream hashes: the header's nginx variable, or the key of the replica
    balance.js picked by the request's prefix."""
    if affinity == "header" and header is not None:
        return "$http_" + header.lower().replace("-", "_")
    return PREFIX_KEY if affinity == "prefix" else None


def _capacity(spec: Spec, service) -> dict | None:
    """The capacity plan when both the model config and the GPU size are known here."""
    from kit.plan.fit import fit_service  # reads model files: only when rendering

    fit = fit_service(spec, service)
    if fit.failed:
        # no report: unplanned says why (ServiceFit)
        errors = fit.report.errors if fit.report else [cast(str, fit.unplanned)]
        raise BadInput(
            f"service {service.name} cannot start on this hardware:\n  - " + "\n  - ".join(errors),
            fix="see `kit plan` for the capacity table",
        )
    return fit.report.to_json() if fit.report else None


def _max_num_seqs(service, capacity: dict | None) -> tuple[int | None, str]:
    if service.max_num_seqs != "auto":
        return service.max_num_seqs, "set in the spec"
    if capacity is None:
        return None, (
            "auto, but the capacity plan needs the model's config.json and gpu_memory_gib on "
            "this host: vLLM's own default applies"
        )
    return capacity["recommended_max_num_seqs"], capacity.get(
        "recommended_max_num_seqs_reason", "from the capacity plan"
    )
