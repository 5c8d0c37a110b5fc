"""Observability as planned: its switches and SLOs from the spec, the metrics network (subnet and
fixed addresses), the vLLM histogram bounds an SLO needs, and the facts (ports, paths, mounts, job
names) the rendered files share. The files themselves: kit/render/prometheus.py.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.plan.alerts import AlertsPlan, alerts_plan

if TYPE_CHECKING:
    from kit.spec.model import Spec

PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
GRAFANA_PATH = "/grafana/"  # at the front door, behind its authentication
DOOR_FIGURES_PORT = 9113  # nginx's own connection figures, on the private networks only
DOOR_FIGURES_PATH = "/kit-figures"
# The door's own state (kit/dataplane/door/figures.js): budgets' shares, the certificate's end,
# the ACME loop's last run, replicas in rotation
DOOR_STATE_PATH = "/kit-door-state"
DOOR_STATE_JOB = "front-door-state"
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
class MetricsNetwork:
    """The metrics network's subnet and the fixed addresses on it: the gateway (first), the
    front door (the one address Grafana's auth proxy trusts), Prometheus, Grafana, the usage
    ledger's collector and the waker of sleeping models (kit/plan/waker.py)."""

    subnet: str
    gateway: str
    door: str
    prometheus: str
    grafana: str
    usage: str
    waker: str


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
    return MetricsNetwork(str(network), *(str(base + offset) for offset in (1, 2, 3, 4, 5, 6)))


@dataclass(frozen=True)
class ObservabilityPlan:
    prometheus_image: str
    grafana_image: str
    scrape_interval: int  # seconds; the rules are evaluated as often
    retention_days: int
    replica_down_after: int  # seconds
    slos: tuple[ServiceSlo, ...]
    alerts: AlertsPlan | None = None  # Alertmanager and its receivers (observability.alerts)

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
        alerts=alerts_plan(spec),
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
