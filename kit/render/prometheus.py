"""Prometheus's files from the plan: what it scrapes (each replica through the front door's
metrics listener), the alert rules, its one shell GET with credentials, and what the compose and
nginx templates lay out for observability. Pure: the plan in, file text out (Grafana's side is
kit/render/dashboards.py; the facts they share: kit/plan/observability.py).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.credentials.material import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_USER
from kit.engine.desired import (
    ALERTMANAGER_SERVICE,
    DOOR_FIGURES_SERVICE,
    GRAFANA_SERVICE,
    PROMETHEUS_SERVICE,
    WAKER_SERVICE,
)
from kit.files import generated_yaml
from kit.layout import (
    ALERTMANAGER_SECRET,
    NGINX_MOUNT,
    PROMETHEUS_AUTH_ENV_FILE,
    PROMETHEUS_WEB_CONFIG,
    SiteLayout,
)
from kit.plan.alerts import ALERTMANAGER_PORT
from kit.plan.build import OUT_OF_SERVICE
from kit.plan.observability import (
    DOOR_FIGURES_PATH,
    DOOR_FIGURES_PORT,
    DOOR_JOB,
    DOOR_LOG_JOB,
    DOOR_LOG_MOUNT,
    DOOR_LOG_PORT,
    DOOR_LOG_SOCKET,
    DOOR_SCRIPT,
    DOOR_SCRIPT_MOUNT,
    DOOR_STATE_JOB,
    DOOR_STATE_PATH,
    DOOR_STATES,
    GRAFANA_DASHBOARDS_MOUNT,
    GRAFANA_PATH,
    GRAFANA_PORT,
    GRAFANA_PROVISIONING_MOUNT,
    GRAFANA_USER_HEADER,
    PROMETHEUS_MOUNT,
    PROMETHEUS_PORT,
    RATE_WINDOW,
    SCRAPE_PATH,
    VLLM_JOB,
)
from kit.plan.usage import USAGE_JOB, USAGE_SERVICE
from kit.plan.waker import SLEEP_JOB

if TYPE_CHECKING:
    from kit.plan.build import Plan, ServicePlan

# A prune of credentials' records by the disk bound stays an alert this long (it happens once).
PRUNE_ALERT_WINDOW = "1d"
# The usage ledger this far behind the door (the collector stalled, or spooled lines it cannot
# read keep it waiting) is not recording: budgets seeded after a restart and kit usage lag.
USAGE_LAG_ALERT_S = 120
BUDGET_WARNING = 0.8  # a credential's share of a budget window that warns before it is spent
CERT_ALERT_DAYS = 14  # certbot renews at 30 days left: at 14 it has failed for two weeks
ACME_FAILING_ALERT_S = 900  # certbot retries from acme_retry_s on: failing this long is no blip
# A replica out of its server list this long: a rolling update takes one out while it replaces
# it (drain, start, gate); longer, one stopped half-way (kit up puts it back).
OUT_OF_ROTATION_ALERT_S = 900


@dataclass(frozen=True)
class ScrapeTarget:
    """One scrape target: a replica of a service, read through the front door's listener."""

    service: str
    replica: int
    host: str  # the replica's compose host (the door's scrape listener forwards to it)


def replica_hosts(service: ServicePlan) -> list[tuple[int, str]]:
    """(replica index, compose host) of each replica of a service: the one place that says
    which containers serve it."""
    return [(replica.index, replica.host) for replica in service.replicas]


def scrape_targets(plan: Plan) -> list[ScrapeTarget]:
    """Every replica, by the host the front door's scrape listener forwards its path to."""
    return [ScrapeTarget(service.name, index, host)
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
        **({"alerting": alerting_config()} if obs.alerts else {}),
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
                "job_name": DOOR_STATE_JOB,
                "metrics_path": DOOR_STATE_PATH,
                "static_configs": [{"targets": [door]}],
            },
            {
                "job_name": DOOR_LOG_JOB,
                "metrics_path": SCRAPE_PATH + DOOR_FIGURES_SERVICE,
                "static_configs": [{"targets": [door], "labels": {
                    "instance": DOOR_FIGURES_SERVICE}}],
            },
            *([{
                "job_name": USAGE_JOB,
                "metrics_path": SCRAPE_PATH + USAGE_SERVICE,
                "static_configs": [{"targets": [door], "labels": {"instance": USAGE_SERVICE}}],
            }] if plan.usage else []),
            *([{
                "job_name": SLEEP_JOB,
                "metrics_path": SCRAPE_PATH + WAKER_SERVICE,
                "static_configs": [{"targets": [door], "labels": {"instance": WAKER_SERVICE}}],
            }] if plan.waker else []),
        ],
    }
    return generated_yaml(config)


def alerting_config() -> dict:
    """Where Prometheus posts firing alerts: Alertmanager by its name on the alerting network,
    as kit's account (the secret from a file its user's group alone reads)."""
    return {"alertmanagers": [{
        "static_configs": [{"targets": [f"{ALERTMANAGER_SERVICE}:{ALERTMANAGER_PORT}"]}],
        "basic_auth": {"username": PROMETHEUS_USER,
                       "password_file": f"{PROMETHEUS_MOUNT}/{ALERTMANAGER_SECRET}"},
    }]}


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
    rules += door_state_rules(plan)
    if plan.waker is not None:  # idle_sleep (docs/sleep.md): a model that cannot wake is down
        sleep = f'job="{SLEEP_JOB}"'
        rules += [
            AlertRule("KitWakerDown", f"up{{{sleep}}}", "==", 0, down, "critical",
                      "the waker does not answer: requests for services with idle_sleep get "
                      "a 503"),
            AlertRule("KitWakeFailed",
                      f"max by (service) (increase(kit_sleep_failed_wakes_total{{{sleep}}}"
                      f"[{RATE_WINDOW}]))", ">", 0, 0, "critical",
                      "{{ $labels.service }}: a wake failed (kit status shows vLLM's cause); "
                      "it stays asleep and its requests get a 503"),
        ]
    if plan.usage is not None:  # docs/usage.md
        usage = f'job="{USAGE_JOB}"'
        rules += [
            AlertRule("KitUsagePrunedForSpace",
                      f"increase(kit_usage_credential_requests_pruned_total{{{usage}}}"
                      f"[{PRUNE_ALERT_WINDOW}])", ">", 0, 0, "warning",
                      "the usage ledger pruned records of credentials to stay under "
                      "usage.max_disk: raise it (kit status and kit audit verify name the "
                      "ranges)"),
            AlertRule("KitUsageCollectorDown", f"up{{{usage}}}", "==", 0, down, "critical",
                      "the usage ledger's collector does not answer: requests wait in the "
                      "spool unrecorded (kit status, kit logs usage-ledger)"),
            AlertRule("KitUsageNotRecording", f"kit_usage_lag_seconds{{{usage}}}", ">",
                      USAGE_LAG_ALERT_S, 60, "critical",
                      "the usage ledger is {{ $value | humanizeDuration }} behind the door "
                      "(kit status shows why)"),
            AlertRule("KitUsageDiskFull", f"kit_usage_disk_full{{{usage}}}", "==", 1, 0,
                      "critical",
                      "the usage ledger's disk is full: records wait in the spool; free space "
                      "or lower usage.retention_days"),
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


def door_state_rules(plan: Plan) -> list[AlertRule]:
    """Alerts on the door's own state (kit/dataplane/door/figures.js): a credential's budget
    80 % and wholly used (the usage ledger on), the certificate it serves within
    CERT_ALERT_DAYS of its end, certbot failing (acme), a replica out of its server list."""
    state = f'job="{DOOR_STATE_JOB}"'
    ratio = f"kit_budget_used_ratio{{{state}}}"
    budget = "{{ $labels.credential }} used {{ $value | humanizePercentage }} of its " \
        "{{ $labels.window }} token budget"
    rules = [
        AlertRule("KitBudgetNearlySpent", f"{ratio} < 1", ">=", BUDGET_WARNING, 0, "warning",
                  budget + " (kit usage shows its requests)"),
        AlertRule("KitBudgetSpent", ratio, ">=", 1, 0, "warning",
                  budget + ": its requests get 429 until the window resets"),
    ] if plan.usage is not None else []
    rules += [
        AlertRule("KitCertificateExpiresSoon",
                  f"(kit_tls_certificate_not_after_seconds{{{state}}} - time()) / 86400", "<=",
                  CERT_ALERT_DAYS, 0, "critical",
                  "the front door's certificate ends in {{ $value | printf \"%.1f\" }} days"
                  + (": certbot has not renewed it (kit status shows its last run)"
                     if plan.acme else ": install a new one (tls.cert, kit up)")),
        AlertRule("KitReplicaOutOfRotation", f"kit_door_replica_in_rotation{{{state}}}", "==", 0,
                  OUT_OF_ROTATION_ALERT_S, "warning",
                  "{{ $labels.service }}: {{ $labels.host }} is out of the front door's server "
                  "list (a rolling update that stopped): kit up puts it back"),
    ]
    if plan.acme is not None:
        rules.append(AlertRule(
            "KitAcmeRenewalFailing", f"kit_acme_last_run_exit_code{{{state}}}", ">", 0,
            ACME_FAILING_ALERT_S, "critical",
            "certbot's runs keep failing (exit {{ $value }}): kit status names the cause"))
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


def prometheus_get(path: str, output: str = "-", port: int = PROMETHEUS_PORT) -> str:
    """A shell command that GETs `path` (URL-encoded) of Prometheus's API (or Alertmanager's, on
    its `port`) from inside its container, with the password from the container's own
    environment (never in kit's request nor in the compose file): busybox wget in the official
    images, curl in Debian-based ones."""
    where = shlex.quote(f"127.0.0.1:{port}{path}")
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
        "state_path": DOOR_STATE_PATH,
        "tls_dir": in_nginx(SITE.tls_dir),
        # a multi-replica service's server list (a file kit up edits), a lone replica's host
        "replica_pools": json.dumps(
            {service.name: {"pool": in_nginx(SITE.replica_pool(service.name))}
             if len(service.replicas) > 1 else {"host": service.replicas[0].host}
             for service in plan.services}, sort_keys=True),
        "out_of_service": OUT_OF_SERVICE,
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


SITE = SiteLayout(Path("."))


def in_nginx(path: Path) -> str:
    """A path of the site's nginx folder as the front door's container sees it."""
    return f"{NGINX_MOUNT}/{path.relative_to(SITE.nginx_dir).as_posix()}"


def upstreams(plan: Plan) -> dict[str, str]:
    """nginx upstream name (`$proxy_host` in its log) → service: the door's figures by service.
    The same rule as the nginx template's `upstream` filter."""
    return {"kit_" + service.name.replace("-", "_"): service.name for service in plan.services}
