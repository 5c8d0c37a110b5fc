"""kit's Grafana dashboards and provisioning, generated from the plan with Grafana's own
dashboards-as-code library (grafana-foundation-sdk), from the metric names vLLM 0.33 exports.

One dashboard per service (per replica: load, KV cache, preemptions, tokens/s, TTFT / TPOT /
ITL / E2E p50 and p95, prefix-cache hit rate, responses by status class; with an `slo:`, the
share of requests within it, exact because the SLO is a bucket bound) and one for the front
door. Every query goes to the provisioned Prometheus data source.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

from kit.credentials.material import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_USER
from kit.files import generated_yaml
from kit.plan.observability import (
    DOOR_JOB,
    DOOR_LOG_JOB,
    DOOR_STATES,
    GRAFANA_DASHBOARDS_MOUNT,
    PROMETHEUS_PORT,
    VLLM_JOB,
    ServiceSlo,
)
from kit.plan.usage import USAGE_JOB
from kit.plan.waker import SLEEP_JOB
from kit.render.prometheus import quantile

if TYPE_CHECKING:
    from kit.plan.build import Plan, ServicePlan

DATASOURCE_UID = "kit-prometheus"
RATE = "$__rate_interval"  # Grafana's rate window: at least four scrape intervals
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
LATENCIES = (
    ("TTFT", "vllm:time_to_first_token_seconds", "time to first token"),
    ("TPOT", "vllm:request_time_per_output_token_seconds", "time per output token, per request"),
    ("ITL", "vllm:inter_token_latency_seconds", "time between two tokens of a stream"),
    ("E2E latency", "vllm:e2e_request_latency_seconds", "arrival to last token"),
)


def _panel(title: str, unit: str, targets: list[tuple[str, str]], description: str,
           line_at: float | None = None) -> timeseries.Panel:
    """A time series of PromQL `targets` (expression, legend); `line_at` draws a threshold."""
    panel = (timeseries.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).height(8).span(12))
    for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
        panel = panel.with_target(
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
            .datasource(DATASOURCE)
        )
    if line_at is not None:
        panel = panel.thresholds(_threshold_line(line_at))
    return panel


def _threshold_line(value: float) -> dashboard.ThresholdsConfig:
    return (dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(color="green", value=None), Threshold(color="red", value=value)]))


def le_matcher(bound: float) -> str:
    """A label matcher for the bucket whose upper bound is `bound`. Prometheus 3 stores every
    `le` value in one float spelling whatever the exporter wrote ("1" and "1.0" are both stored
    as "1.0"): Go's shortest form plus ".0" for a whole number, which is Python's repr (what vLLM
    writes) for every bound an SLO can have (0.001 s to 3600 s, below Go's 1e+06 exponent form)."""
    return f'le="{float(bound)!r}"'


def slo_share(histogram: str, selector: str, bound: float) -> str:
    """The share of requests at or under `bound` (a bucket bound, so exact)."""
    return (f"sum(rate({histogram}_bucket{{{selector},{le_matcher(bound)}}}[{RATE}])) / "
            f"sum(rate({histogram}_count{{{selector}}}[{RATE}]))")


def service_dashboard(service: ServicePlan, slo: ServiceSlo | None,
                      sleeps: bool = False) -> dashboard.Dashboard:
    """A service's dashboard; `sleeps`: it has idle_sleep, and a panel shows its sleep mode."""
    sel = f'job="{VLLM_JOB}",service="{service.name}"'
    door = f'job="{DOOR_LOG_JOB}",service="{service.name}"'
    by = "replica {{replica}}"

    def per_replica(metric: str, how: str = "sum") -> tuple[str, str]:
        return f"{how} by (replica) ({metric}{{{sel}}})", by

    def rate_of(counter: str) -> str:
        return f"sum by (replica) (rate({counter}{{{sel}}}[{RATE}]))"

    panels = [
        _panel("Replica up", "none", [(f"up{{{sel}}}", by)],
               "1 while Prometheus can scrape the replica's /metrics"),
        _panel("Requests running", "none", [per_replica("vllm:num_requests_running")],
               "requests in the running batch"),
        _panel("Requests waiting", "none", [per_replica("vllm:num_requests_waiting")],
               "requests queued for a batch slot or KV-cache space"),
        _panel("KV-cache usage", "percentunit",
               [per_replica("vllm:kv_cache_usage_perc", "max")],
               "share of the KV cache in use (the alert fires above 95 % for 5 minutes)",
               line_at=0.95),
        _panel("Preemptions", "ops", [(rate_of("vllm:num_preemptions_total"), by)],
               "requests preempted per second (KV cache exhausted)"),
        _panel("Tokens per second", "short",
               [(rate_of("vllm:prompt_tokens_total"), "prompt, " + by),
                (rate_of("vllm:generation_tokens_total"), "generation, " + by)],
               "prompt (prefill) and generated tokens per second"),
    ]
    slo_bounds = {"TTFT": slo.ttft_s if slo else None, "TPOT": slo.tpot_s if slo else None}
    for name, histogram, meaning in LATENCIES:
        panels.append(_panel(
            f"{name} p50 / p95", "s",
            [(quantile(q, histogram, sel, "replica", RATE), f"p{round(q * 100)}, {by}")
             for q in (0.5, 0.95)],
            f"{meaning} (from vLLM's histogram)", line_at=slo_bounds.get(name),
        ))
    panels += [
        _panel("Prefix-cache hit rate", "percentunit",
               [(f"{rate_of('vllm:prefix_cache_hits_total')} / "
                 f"{rate_of('vllm:prefix_cache_queries_total')}", by)],
               "share of prompt tokens found in the prefix cache"),
        _panel("Responses by status class", "reqps",
               [(f"sum by (status) (rate(http_requests_total{{{sel}}}[{RATE}]))", "{{status}}")],
               "vLLM's own responses per second (2xx, 4xx, 5xx)"),
        _panel("Front door: answers for this service by status", "reqps",
               [(f"sum by (status) (rate(kit_door_requests_total{{{door}}}[{RATE}]))",
                 "{{status}}")],
               "what clients got from the front door for requests routed to this service "
               "(a 502 here: no replica answered)"),
        _panel("Front door: upstream response time p50 / p95", "s",
               [(quantile(q, "kit_door_upstream_response_seconds", door, "", RATE),
                 f"p{round(q * 100)}") for q in (0.5, 0.95)],
               "nginx's $upstream_response_time: the whole answer, a stream's included"),
    ]
    for name, histogram, bound in (
        ("TTFT", "vllm:time_to_first_token_seconds", slo_bounds["TTFT"]),
        ("TPOT", "vllm:request_time_per_output_token_seconds", slo_bounds["TPOT"]),
    ):
        if bound is not None:
            panels.append(_panel(
                f"Requests within the {name} SLO ({bound * 1000:g} ms)", "percentunit",
                [(slo_share(histogram, sel, bound), "within SLO")],
                f"share of requests whose {name} is at most the SLO: exact, the SLO is a "
                "bucket bound (--custom-histogram-buckets)",
            ))
    if sleeps:
        panels.append(sleep_panel(service.name))
    return _dashboard(f"kit-svc-{service.name}", f"kit · {service.name}", panels)


def sleep_panel(service: str) -> timeseries.Panel:
    """idle_sleep (docs/sleep.md), from the waker: awake or not, wakes and sleeps, requests held
    at the door for a wake, how long the last wake took."""
    sel = f'job="{SLEEP_JOB}",service="{service}"'
    return _panel("Sleep mode: awake, wakes, held requests", "short",
                  [(f"kit_sleep_awake{{{sel}}}", "awake (1) / asleep (0)"),
                   (f"increase(kit_sleep_wakes_total{{{sel}}}[{RATE}])", f"wakes in {RATE}"),
                   (f"increase(kit_sleep_failed_wakes_total{{{sel}}}[{RATE}])",
                    f"failed wakes in {RATE}"),
                   (f"increase(kit_sleep_sleeps_total{{{sel}}}[{RATE}])", f"sleeps in {RATE}"),
                   (f"kit_sleep_held_requests{{{sel}}}", "held at the door"),
                   (f"kit_sleep_last_wake_seconds{{{sel}}}", "last wake (s)")],
                  "the waker's account: a request for a sleeping model is held at the door "
                  "while it wakes")


def door_dashboard(plan: Plan) -> dashboard.Dashboard:
    door = f'job="{DOOR_JOB}"'
    door_log = f'job="{DOOR_LOG_JOB}"'
    vllm = f'job="{VLLM_JOB}"'
    panels = [
        _panel("Front door up", "none", [(f"up{{{door}}}", "nginx")],
               "1 while Prometheus can read the front door's figures"),
        _panel("Connections", "none",
               [(f'kit_door_connections{{{door},state="{state}"}}', state)
                for state in DOOR_STATES],
               "nginx's client connections: open, reading a request, writing a response, idle"),
        _panel("Requests by status", "reqps",
               [(f"sum by (status) (rate(kit_door_requests_total{{{door_log}}}[{RATE}]))",
                 "{{status}}")],
               "every answer of the front door per second, by HTTP status"),
        _panel("Refused: 401, 413, 429", "reqps",
               [(f'sum by (status) (rate(kit_door_requests_total{{{door_log},'
                 f'status=~"401|413|429"}}[{RATE}]))', "{{status}}")],
               "no or wrong credentials, body too large, rate or connection limit"),
        _panel("Request time p50 / p95", "s",
               [(quantile(q, "kit_door_request_duration_seconds", door_log, "", RATE),
                 f"p{round(q * 100)}") for q in (0.5, 0.95)],
               "nginx's $request_time of every answer (streams: until the last byte)"),
        _panel("Upstream response time p95 by service", "s",
               [(quantile(0.95, "kit_door_upstream_response_seconds", door_log, "service",
                          RATE), "{{service}}")],
               "nginx's $upstream_response_time"),
        _panel("Responses by service and status class", "reqps",
               [(f"sum by (service, status) (rate(http_requests_total{{{vllm}}}[{RATE}]))",
                 "{{service}} {{status}}")],
               "what each service answered per second"),
        _panel("Requests running and waiting", "none",
               [(f"sum by (service) (vllm:num_requests_running{{{vllm}}})",
                 "running, {{service}}"),
                (f"sum by (service) (vllm:num_requests_waiting{{{vllm}}})",
                 "waiting, {{service}}")],
               "load of every service of the site"),
    ]
    return _dashboard("kit-front-door", f"kit · {plan.site} · front door", panels)


def usage_dashboard(plan: Plan) -> dashboard.Dashboard:
    """Who used what, from the usage ledger's collector (the same records `kit usage` reads):
    per credential and model, tokens and requests, and the ledger's own health."""
    usage = f'job="{USAGE_JOB}"'
    panels = [
        _panel("Tokens per second by credential", "short",
               [(f"sum by (who) (rate(kit_usage_prompt_tokens_total{{{usage}}}[{RATE}]))",
                 "prompt, {{who}}"),
                (f"sum by (who) (rate(kit_usage_completion_tokens_total{{{usage}}}[{RATE}]))",
                 "completion, {{who}}")],
               "prompt and completion tokens as the engine counted them, per key or user"),
        _panel("Tokens per second by model", "short",
               [(f"sum by (model) (rate(kit_usage_completion_tokens_total{{{usage}}}[{RATE}]))",
                 "{{model}}")],
               "completion tokens per served model"),
        _panel("Requests by credential and ending", "reqps",
               [(f"sum by (who, ended) (rate(kit_usage_requests_total{{{usage}}}[{RATE}]))",
                 "{{who}} {{ended}}")],
               "completed, client aborts, upstream errors and refusals, per credential"),
        _panel("Tokens in the last 24 hours by credential", "short",
               [(f"sum by (who) (increase(kit_usage_prompt_tokens_total{{{usage}}}[1d])"
                 f" + increase(kit_usage_completion_tokens_total{{{usage}}}[1d]))", "{{who}}")],
               "prompt + completion tokens over the last day"),
        _panel("Ledger: records per second and lag", "short",
               [(f"rate(kit_usage_records_total{{{usage}}}[{RATE}])", "records/s"),
                (f"kit_usage_lag_seconds{{{usage}}}", "lag (s)")],
               "records appended to the ledger, and how far the ledger is behind the door"),
        _panel("Ledger: lost and unreadable", "none",
               [(f"kit_usage_lost_records_total{{{usage}}}", "lost"),
                (f"kit_usage_unreadable_lines_total{{{usage}}}", "unreadable")],
               "requests the door counted that never reached the ledger; lines it could not read"),
    ]
    return _dashboard("kit-usage", f"kit · {plan.site} · usage", panels)


def _dashboard(uid: str, title: str, panels: list[timeseries.Panel]) -> dashboard.Dashboard:
    board = (dashboard.Dashboard(title).uid(uid).tags(["kit"]).refresh("30s")
             .time("now-1h", "now").editable())
    for panel in panels:
        board = board.with_panel(panel)
    return board


def dashboard_files(plan: Plan) -> dict[str, str]:
    """File name → dashboard JSON for Grafana's file provider."""
    boards = {"kit-front-door.json": door_dashboard(plan)}
    if plan.usage is not None:
        boards["kit-usage.json"] = usage_dashboard(plan)
    for service in plan.services:
        slo = plan.observability.slo(service.name) if plan.observability else None
        sleeps = plan.waker is not None and service.name in plan.waker.names()
        boards[f"kit-svc-{service.name}.json"] = service_dashboard(service, slo, sleeps)
    return {name: json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
            for name, board in boards.items()}


def datasource_provisioning(prometheus_host: str) -> str:
    """The Prometheus data source, signed in with Basic auth: the password is Grafana's
    environment variable (set from the 0600 compose/prometheus-auth.env), which Grafana
    expands in provisioning files, so this file holds no secret."""
    return generated_yaml({
        "apiVersion": 1,
        "datasources": [{
            "name": "Prometheus",
            "uid": DATASOURCE_UID,
            "type": "prometheus",
            "access": "proxy",
            "url": f"http://{prometheus_host}:{PROMETHEUS_PORT}",
            "basicAuth": True,
            "basicAuthUser": PROMETHEUS_USER,
            "secureJsonData": {"basicAuthPassword": f"${{{PROMETHEUS_PASSWORD_ENV}}}"},
            "isDefault": True,
            "editable": False,
        }],
    })


def dashboard_provisioning() -> str:
    return generated_yaml({
        "apiVersion": 1,
        "providers": [{
            "name": "kit",
            "folder": "kit",
            "type": "file",
            "disableDeletion": True,
            "allowUiUpdates": False,
            "options": {"path": GRAFANA_DASHBOARDS_MOUNT},
        }],
    })

