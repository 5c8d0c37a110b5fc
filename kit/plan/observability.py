"""Observability: what Prometheus scrapes, the alert rules, and the vLLM histogram bounds an SLO
needs. Pure: the plan in, file text out (Grafana's side is kit/render/dashboards.py).

Networks by need (docs/observability.md): Prometheus and Grafana sit on the private `metrics`
network with the front door alone, at fixed addresses. No vLLM replica is on it: Prometheus
scrapes the replicas through a listener of the front door bound to its metrics address, so a
replica (whose model code may be hostile) reaches neither Prometheus's API nor Grafana, and
Grafana trusts its user header from the front door's address only. The front door is on the
network whether observability is on or not, so turning it on or off reloads nginx in place.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.credentials.material import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_USER
from kit.engine.desired import DOOR_FIGURES_SERVICE, GRAFANA_SERVICE, PROMETHEUS_SERVICE
from kit.files import generated_yaml
from kit.layout import PROMETHEUS_AUTH_ENV_FILE, PROMETHEUS_WEB_CONFIG

if TYPE_CHECKING:
    from kit.plan.build import Plan, ServicePlan
    from kit.spec.model import Spec

PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
GRAFANA_PATH = "/grafana/"  # at the front door, behind its authentication
DOOR_FIGURES_PORT = 9113  # nginx's own connection figures, on the private networks only
DOOR_FIGURES_PATH = "/kit-figures"
SCRAPE_PATH = "/kit-scrape/"  # + a replica's host: its /metrics, through the door's listener
METRICS_NETWORK = "metrics"  # the compose file's key of the network above
DEFAULT_SUBNETS = ipaddress.IPv4Network("198.18.0.0/15")  # benchmarking space: not on LANs
DEFAULT_PREFIX = 28
DOOR_LOG_PORT = 9114  # door-figures: nginx's access log counted (requests by status, times)
DOOR_LOG_MOUNT = "/var/kit-figures"  # the volume nginx and door-figures share (unix socket)
DOOR_LOG_SOCKET = f"{DOOR_LOG_MOUNT}/access.sock"
DOOR_SCRIPT_MOUNT = "/kit-figures"  # observability/door-figures/ inside door-figures
DOOR_SCRIPT = "door-figures.py"
PROMETHEUS_MOUNT = "/etc/kit-prometheus"  # observability/prometheus/ inside Prometheus
GRAFANA_PROVISIONING_MOUNT = "/etc/grafana/provisioning"
GRAFANA_DASHBOARDS_MOUNT = "/var/lib/kit-dashboards"
GRAFANA_USER_HEADER = "X-Kit-User"  # who the front door let in: Grafana's auth-proxy identity
VLLM_JOB = "vllm"
DOOR_JOB = "front-door"
DOOR_LOG_JOB = "front-door-requests"
DOOR_STATES = ("active", "reading", "writing", "waiting")  # nginx's connection figures
RATE_WINDOW = "5m"  # the rules' rate() window

# vLLM's default bounds of the two SLO histograms (as vLLM exports them; see
# tests/standin/reference/http-trace.json). `--custom-histogram-buckets` replaces a family's
# whole list, so kit passes these plus the SLO bound: the other quantiles keep their resolution.
TTFT_DEFAULT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_DEFAULT_BOUNDS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
HISTOGRAMS_FLAG = "--custom-histogram-buckets"


@dataclass(frozen=True)
class ServiceSlo:
    """A service's p95 objectives in seconds (None: not set)."""

    service: str
    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True)
class Target:
    """One scrape target: a replica of a service, read through the front door's listener."""

    service: str
    replica: int
    host: str  # the replica's compose host (the door's scrape listener forwards to it)


@dataclass(frozen=True)
class MetricsNetwork:
    """The metrics network's subnet and the fixed addresses on it: the gateway (first), the
    front door (the one address Grafana's auth proxy trusts), Prometheus and Grafana."""

    subnet: str
    gateway: str
    door: str
    prometheus: str
    grafana: str


def metrics_network(site: str, subnet: str | None) -> MetricsNetwork:
    """`observability.subnet` (already allow-listed), else one /28 of DEFAULT_SUBNETS picked by
    the site's name, so sites sharing an engine rarely pick the same one."""
    if subnet is None:
        blocks = 2 ** (DEFAULT_PREFIX - DEFAULT_SUBNETS.prefixlen)
        index = int.from_bytes(hashlib.sha256(site.encode()).digest()[:4], "big") % blocks
        first = int(DEFAULT_SUBNETS.network_address) + index * 2 ** (32 - DEFAULT_PREFIX)
        network = ipaddress.IPv4Network((first, DEFAULT_PREFIX))
    else:
        network = ipaddress.IPv4Network(subnet)
    base = network.network_address
    return MetricsNetwork(str(network), *(str(base + offset) for offset in (1, 2, 3, 4)))


@dataclass(frozen=True)
class ObservabilityPlan:
    prometheus_image: str
    grafana_image: str
    scrape_interval: int  # seconds; the rules are evaluated as often
    retention_days: int
    replica_down_after: int  # seconds
    slos: tuple[ServiceSlo, ...]

    def slo(self, service: str) -> ServiceSlo | None:
        return next((slo for slo in self.slos if slo.service == service), None)


def service_slo(spec_service) -> ServiceSlo | None:
    """The spec's `slo:` of one service in seconds, or None."""
    slo = spec_service.slo
    if slo is None:
        return None
    return ServiceSlo(
        spec_service.name,
        slo.ttft_p95_ms / 1000 if slo.ttft_p95_ms else None,
        slo.tpot_p95_ms / 1000 if slo.tpot_p95_ms else None,
    )


def observability_plan(spec: Spec) -> ObservabilityPlan | None:
    """What `observability:` asks for, None when it is off (nothing of it is rendered then)."""
    obs = spec.observability
    if not obs.enabled:
        return None
    slos = tuple(slo for service in spec.services if (slo := service_slo(service)))
    return ObservabilityPlan(
        prometheus_image=spec.images.prometheus,
        grafana_image=spec.images.grafana,
        scrape_interval=obs.scrape_interval,
        retention_days=obs.retention_days,
        replica_down_after=obs.replica_down_after,
        slos=slos,
    )


def histogram_args(slo: ServiceSlo | None) -> list[str]:
    """vLLM's `--custom-histogram-buckets` for a service's SLO: the default bounds plus the SLO
    itself, so "share of requests within the SLO" is a bucket ratio, not an interpolation."""
    if slo is None:
        return []
    families = {}
    if slo.ttft_s is not None:
        families["time_to_first_token"] = _with_bound(TTFT_DEFAULT_BOUNDS, slo.ttft_s)
    if slo.tpot_s is not None:  # the family also holds vllm:request_time_per_output_token_seconds
        families["inter_token_latency"] = _with_bound(ITL_DEFAULT_BOUNDS, slo.tpot_s)
    return [HISTOGRAMS_FLAG, json.dumps(families, separators=(",", ":"))]


def _with_bound(defaults: tuple[float, ...], bound: float) -> list[float]:
    return sorted({*defaults, bound})


def replica_hosts(service: ServicePlan) -> list[tuple[int, str]]:
    """(replica index, compose host) of each replica of a service: the one place that says
    which containers serve it."""
    return [(replica.index, replica.host) for replica in service.replicas]


def scrape_targets(plan: Plan) -> list[Target]:
    """Every replica, by the host the front door's scrape listener forwards its path to."""
    return [Target(service.name, index, host)
            for service in plan.services for index, host in replica_hosts(service)]


def prometheus_config(plan: Plan) -> str:
    """prometheus.yml: every replica's /metrics and the front door's figures, all read from the
    front door's listener on the metrics network (Prometheus reaches nothing else), with
    `service` and `replica` labels that the dashboards and rules group by. No self-scrape: its
    API needs the secret, which would have to lie in a file Prometheus's user can read."""
    obs = plan.observability
    assert obs is not None
    interval = f"{obs.scrape_interval}s"
    door = f"{plan.metrics.door}:{DOOR_FIGURES_PORT}"
    config = {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "external_labels": {"site": plan.site},
        },
        "rule_files": [f"{PROMETHEUS_MOUNT}/rules.yml"],
        "scrape_configs": [
            {
                "job_name": VLLM_JOB,
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [door],
                     "labels": {"service": target.service, "replica": str(target.replica),
                                "instance": target.host,
                                "__metrics_path__": SCRAPE_PATH + target.host}}
                    for target in scrape_targets(plan)
                ],
            },
            {
                "job_name": DOOR_JOB,
                "metrics_path": DOOR_FIGURES_PATH,
                "static_configs": [{"targets": [door]}],
            },
            {
                "job_name": DOOR_LOG_JOB,
                "metrics_path": SCRAPE_PATH + DOOR_FIGURES_SERVICE,
                "static_configs": [{"targets": [door], "labels": {
                    "instance": DOOR_FIGURES_SERVICE}}],
            },
        ],
    }
    return generated_yaml(config)


@dataclass(frozen=True)
class AlertRule:
    """An alert as a signal compared with a threshold: the signal alone is what a test queries
    to prove the rule reads metrics that exist."""

    name: str
    signal: str
    op: str
    threshold: float
    for_s: int
    severity: str
    summary: str

    @property
    def expr(self) -> str:
        return f"{self.signal} {self.op} {self.threshold:g}"


def quantile(q: float, histogram: str, selector: str, by: str, window: str) -> str:
    """`histogram_quantile` of a vLLM histogram's rate, grouped `by` (plus le)."""
    group = f"{by}, le" if by else "le"
    return (f"histogram_quantile({q:g}, sum by ({group}) "
            f"(rate({histogram}_bucket{{{selector}}}[{window}])))")


def alert_rules(plan: Plan) -> list[AlertRule]:
    obs = plan.observability
    assert obs is not None
    job = f'job="{VLLM_JOB}"'
    down = obs.replica_down_after
    rules = [
        AlertRule("KitReplicaDown", f"up{{{job}}}", "==", 0, down, "critical",
                  "{{ $labels.service }} replica {{ $labels.replica }} does not answer /metrics"),
        AlertRule("KitServiceDown", f"sum by (service) (up{{{job}}})", "==", 0, down, "critical",
                  "no replica of {{ $labels.service }} answers"),
        AlertRule("KitNoServiceReady", f"sum(up{{{job}}})", "==", 0, down, "critical",
                  "no vLLM service of the site answers"),
        AlertRule("KitKVCacheFull",
                  f"max by (service, replica) (vllm:kv_cache_usage_perc{{{job}}})", ">", 0.95,
                  300, "warning",
                  "{{ $labels.service }} replica {{ $labels.replica }}: KV cache above 95 %"),
        AlertRule("KitRequestsWaiting",
                  f"min by (service, replica) (vllm:num_requests_waiting{{{job}}})", ">", 0, 60,
                  "warning",
                  "{{ $labels.service }} replica {{ $labels.replica }}: requests waiting for "
                  "more than a minute"),
        AlertRule("KitServerErrors", _error_ratio(), ">", 0.01, 300, "warning",
                  "{{ $labels.service }}: more than 1 % of responses are 5xx"),
    ]
    for slo in obs.slos:
        selector = f'{job},service="{slo.service}"'
        if slo.ttft_s is not None:
            rules.append(AlertRule(
                "KitTTFTAboveSLO",
                quantile(0.95, "vllm:time_to_first_token_seconds", selector, "service",
                         RATE_WINDOW),
                ">", slo.ttft_s, 600, "warning",
                f"{slo.service}: TTFT p95 above the SLO ({slo.ttft_s * 1000:g} ms)"))
        if slo.tpot_s is not None:
            rules.append(AlertRule(
                "KitTPOTAboveSLO",
                quantile(0.95, "vllm:request_time_per_output_token_seconds", selector,
                         "service", RATE_WINDOW),
                ">", slo.tpot_s, 600, "warning",
                f"{slo.service}: TPOT p95 above the SLO ({slo.tpot_s * 1000:g} ms)"))
    return rules


def _error_ratio() -> str:
    """5xx share of the front door's answers per service (a 502 from a replica that is gone
    counts too); `or 0 * …` keeps a service without any 5xx yet at 0 rather than absent."""
    door = f'job="{DOOR_LOG_JOB}",service!=""'
    total = f"rate(kit_door_requests_total{{{door}}}[{RATE_WINDOW}])"
    errors = f'rate(kit_door_requests_total{{{door},status=~"5.."}}[{RATE_WINDOW}])'
    return f"sum by (service) ({errors} or 0 * {total}) / sum by (service) ({total})"


def rules_file(plan: Plan) -> str:
    """rules.yml: kit's alerts, one group evaluated at the scrape interval."""
    rules = [
        {
            "alert": rule.name,
            "expr": rule.expr,
            "for": f"{rule.for_s}s",
            "labels": {"severity": rule.severity},
            "annotations": {"summary": rule.summary},
        }
        for rule in alert_rules(plan)
    ]
    return generated_yaml({"groups": [{"name": "kit", "rules": rules}]})


def prometheus_get(path: str, output: str = "-") -> str:
    """A shell command that GETs `path` (URL-encoded) of Prometheus's API from inside its
    container, with the password from the container's own environment (never in kit's request
    nor in the compose file): busybox wget in the official image, curl in Debian-based ones."""
    where = shlex.quote(f"127.0.0.1:{PROMETHEUS_PORT}{path}")
    secret = f'"{PROMETHEUS_USER}:${PROMETHEUS_PASSWORD_ENV}"'
    return (f'wget -q -O {output} "http://"{secret}"@"{where} 2>/dev/null || '
            f'curl -fsS -o {output} -u {secret} "http://"{where}')


def template_facts(plan: Plan) -> dict:
    """What the compose and nginx templates lay out for observability (`o` in them)."""
    obs = plan.observability
    https = plan.nginx.https_port
    root_url = f"https://{plan.url_host}{'' if https == 443 else f':{https}'}{GRAFANA_PATH}"
    return {
        "prometheus_service": PROMETHEUS_SERVICE,
        "grafana_service": GRAFANA_SERVICE,
        "grafana_path": GRAFANA_PATH,
        "grafana_port": GRAFANA_PORT,
        "grafana_user_header": GRAFANA_USER_HEADER,
        "prometheus_mount": PROMETHEUS_MOUNT,
        "grafana_provisioning_mount": GRAFANA_PROVISIONING_MOUNT,
        "grafana_dashboards_mount": GRAFANA_DASHBOARDS_MOUNT,
        "prometheus_health": ["CMD-SHELL", prometheus_get("/-/ready", "/dev/null")],
        "prometheus_auth_env_file": PROMETHEUS_AUTH_ENV_FILE,
        "grafana_health": f"http://127.0.0.1:{GRAFANA_PORT}{GRAFANA_PATH}api/health",
        "door_figures_port": DOOR_FIGURES_PORT,
        "scrape_path": SCRAPE_PATH,
        "door_figures_path": DOOR_FIGURES_PATH,
        "door_states": DOOR_STATES,
        "door_figures_service": DOOR_FIGURES_SERVICE,
        "door_log_port": DOOR_LOG_PORT,
        "door_log_mount": DOOR_LOG_MOUNT,
        "door_log_socket": DOOR_LOG_SOCKET,
        "door_script_mount": DOOR_SCRIPT_MOUNT,
        "door_figures_command": [
            f"{DOOR_SCRIPT_MOUNT}/{DOOR_SCRIPT}", "--socket", DOOR_LOG_SOCKET,
            "--port", str(DOOR_LOG_PORT), "--upstreams", json.dumps(upstreams(plan)),
        ],
        "door_figures_health": [
            "CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen("
            f"'http://127.0.0.1:{DOOR_LOG_PORT}/metrics', timeout=4)"],
        "prometheus_command": [
            f"--config.file={PROMETHEUS_MOUNT}/prometheus.yml",
            "--storage.tsdb.path=/prometheus",
            f"--storage.tsdb.retention.time={obs.retention_days}d",
            f"--web.listen-address=:{PROMETHEUS_PORT}",
            f"--web.config.file={PROMETHEUS_MOUNT}/{PROMETHEUS_WEB_CONFIG}",
        ] if obs else [],
        # Grafana behind the door: served under /grafana/, every user the door let in signed in
        # as a Viewer by name (auth proxy), no login form, no calls home.
        "grafana_env": {
            "GF_SERVER_ROOT_URL": root_url,
            "GF_SERVER_SERVE_FROM_SUB_PATH": "true",
            "GF_AUTH_PROXY_ENABLED": "true",
            "GF_AUTH_PROXY_HEADER_NAME": GRAFANA_USER_HEADER,
            "GF_AUTH_PROXY_HEADER_PROPERTY": "username",
            "GF_AUTH_PROXY_WHITELIST": plan.metrics.door,  # no one else may send the header
            "GF_AUTH_PROXY_AUTO_SIGN_UP": "true",
            "GF_AUTH_DISABLE_LOGIN_FORM": "true",
            "GF_AUTH_BASIC_ENABLED": "false",
            "GF_USERS_AUTO_ASSIGN_ORG_ROLE": "Viewer",
            "GF_ANALYTICS_REPORTING_ENABLED": "false",
            "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
            "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
        },
    }


def upstreams(plan: Plan) -> dict[str, str]:
    """nginx upstream name (`$proxy_host` in its log) → service: the door's figures by service.
    The same rule as the nginx template's `upstream` filter."""
    return {"kit_" + service.name.replace("-", "_"): service.name for service in plan.services}
