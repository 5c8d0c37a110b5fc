"""`kit status` with observability on: each replica's live figures and the firing alerts, asked
of the site's Prometheus from inside its container (it publishes no port)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from urllib.parse import urlencode

from kit.engine.docker_api import Engine
from kit.errors import KitError
from kit.plan.observability import VLLM_JOB
from kit.render.prometheus import prometheus_get

# figure → the PromQL that gives it per (service, replica)
FIGURES = {
    "up": f'up{{job="{VLLM_JOB}"}}',
    "running": f'vllm:num_requests_running{{job="{VLLM_JOB}"}}',
    "waiting": f'vllm:num_requests_waiting{{job="{VLLM_JOB}"}}',
    "kv_cache_usage": f'vllm:kv_cache_usage_perc{{job="{VLLM_JOB}"}}',
    # prompt tokens found in vLLM's prefix cache since the replica started (NaN before any)
    "prefix_cache_hit_rate": f'vllm:prefix_cache_hits_total{{job="{VLLM_JOB}"}} / '
                             f'vllm:prefix_cache_queries_total{{job="{VLLM_JOB}"}}',
}


@dataclass(frozen=True)
class ReplicaFigures:
    service: str
    replica: str
    up: bool
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0..1
    # not up in Prometheus, but its container reports healthy: the scrape lags (a replica that
    # just started, or Prometheus that did), not a replica that is down
    lagging: bool = False
    prefix_cache_hit_rate: float | None = None  # 0..1; None before its first prompt

    @property
    def verdict(self) -> str:
        if self.up:
            return "up"
        return "not scraped yet (its container is healthy)" if self.lagging else "DOWN"


@dataclass(frozen=True)
class LiveFigures:
    replicas: tuple[ReplicaFigures, ...] = ()
    firing: tuple[str, ...] = ()  # "AlertName: summary"
    problem: str | None = None  # why there are no figures

    def to_json(self) -> dict:
        return {"replicas": [asdict(r) for r in self.replicas], "firing": list(self.firing),
                "problem": self.problem}

    def lines(self) -> list[str]:
        if self.problem:
            return [f"live figures: none ({self.problem})"]
        lines = ["live figures (Prometheus):"]
        for r in self.replicas:
            kv = "-" if r.kv_cache_usage is None else f"{100 * r.kv_cache_usage:.0f} %"
            hits = "-" if r.prefix_cache_hit_rate is None else \
                f"{100 * r.prefix_cache_hit_rate:.0f} %"
            lines.append(f"  {r.service} replica {r.replica}: {r.verdict}, "
                         f"running {_count(r.running)}, waiting {_count(r.waiting)}, "
                         f"KV cache {kv}, prefix cache hits {hits}")
        lines += [f"  FIRING {alert}" for alert in self.firing] or ["  no alert firing"]
        return lines


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def api_argv(path: str, params: dict[str, str] | None = None) -> list[str]:
    """A GET of Prometheus's API from inside its container, with the credentials of its
    environment (kit's own request carries no secret)."""
    return ["sh", "-c", prometheus_get(path + ("?" + urlencode(params) if params else ""))]


def _api(engine: Engine, container_id: str, path: str, params: dict[str, str] | None = None):
    code, output = engine.exec(container_id, api_argv(path, params))
    if code != 0:
        raise KitError(f"Prometheus did not answer {path} (exit {code}): {output.strip()}")
    try:
        answer = json.loads(output)
        if answer["status"] != "success":
            raise ValueError(answer.get("error"))
        return answer["data"]
    except (ValueError, KeyError, TypeError) as error:
        raise KitError(f"Prometheus answered {path} with something unreadable: {error}") from None


def live_figures(engine: Engine, prometheus_id: str | None,
                 healthy: frozenset[tuple[str, str]] = frozenset()) -> LiveFigures:
    """Per-replica figures and firing alerts; a Prometheus that is down or does not answer
    is said in `problem` (status still shows everything else). `healthy`: the (service,
    replica) whose containers report healthy now; Prometheus lags them by up to a scrape, so
    one it has not scraped up yet is "not scraped yet", never DOWN."""
    if prometheus_id is None:
        return LiveFigures(problem="the prometheus container is not running")
    try:
        values: dict[tuple[str, str], dict[str, float]] = {}
        for figure, expr in FIGURES.items():
            for sample in _api(engine, prometheus_id, "/api/v1/query", {"query": expr})["result"]:
                labels = sample["metric"]
                key = (labels.get("service", "?"), labels.get("replica", "?"))
                value = float(sample["value"][1])
                if not math.isnan(value):  # a ratio of counters still at 0
                    values.setdefault(key, {})[figure] = value
        alerts = _api(engine, prometheus_id, "/api/v1/alerts")["alerts"]
        firing = tuple(sorted(
            f"{alert['labels']['alertname']}: {alert['annotations'].get('summary', '')}"
            for alert in alerts if alert["state"] == "firing"
        ))
    except KitError as error:
        return LiveFigures(problem=error.message)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        return LiveFigures(problem=f"Prometheus answered in an unexpected shape ({error!r})")
    for key in healthy:
        values.setdefault(key, {})  # healthy, and not one sample yet
    replicas = tuple(
        ReplicaFigures(service, replica, figures.get("up") == 1, figures.get("running"),
                       figures.get("waiting"), figures.get("kv_cache_usage"),
                       lagging=figures.get("up") != 1 and (service, replica) in healthy,
                       prefix_cache_hit_rate=figures.get("prefix_cache_hit_rate"))
        for (service, replica), figures in sorted(values.items())
    )
    return LiveFigures(replicas, firing)
