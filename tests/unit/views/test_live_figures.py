"""kit status's live figures: Prometheus's answers, read through the engine's exec (scripted
here: live_figures uses nothing else of the engine)."""

import json

from kit.views.live_figures import FIGURES, api_argv, live_figures
from tests.support.fake_engine import ExecOnlyEngine

PROMETHEUS = "prom1"


def answer(data: dict) -> tuple[int, str]:
    return 0, json.dumps({"status": "success", "data": data})


def sample(value: str, service: str = "tiny", replica: str = "0") -> dict:
    return {"metric": {"service": service, "replica": replica}, "value": [0, value]}


def scripted(up: str = "1", alerts: list | None = None,
             hit_rate: str = "0.613") -> ExecOnlyEngine:
    engine = ExecOnlyEngine(PROMETHEUS)
    values = {"up": up, "running": "3", "waiting": "1", "kv_cache_usage": "0.42",
              "prefix_cache_hit_rate": hit_rate}
    for figure, expr in FIGURES.items():
        engine.exec_results[tuple(api_argv("/api/v1/query", {"query": expr}))] = [
            answer({"resultType": "vector", "result": [sample(values[figure])]})]
    engine.exec_results[tuple(api_argv("/api/v1/alerts"))] = [answer({"alerts": alerts or []})]
    return engine


def test_figures_per_replica_and_no_alert() -> None:
    figures = live_figures(scripted(), PROMETHEUS)
    assert figures.lines() == ["live figures (Prometheus):",
                               "  tiny replica 0: up, running 3, waiting 1, KV cache 42 %, "
                               "prefix cache hits 61 %",
                               "  no alert firing"]


def test_a_firing_alert_is_shown() -> None:
    alerts = [{"labels": {"alertname": "KitReplicaDown"}, "state": "firing",
               "annotations": {"summary": "tiny replica 0 does not answer /metrics"}},
              {"labels": {"alertname": "KitKVCacheFull"}, "state": "pending",
               "annotations": {"summary": "not yet"}}]
    figures = live_figures(scripted(up="0", alerts=alerts), PROMETHEUS)
    assert figures.firing == ("KitReplicaDown: tiny replica 0 does not answer /metrics",)
    assert ("  tiny replica 0: DOWN, running 3, waiting 1, KV cache 42 %, prefix cache hits 61 %"
            in figures.lines())


def test_prometheus_down_or_unreadable_is_said() -> None:
    assert live_figures(ExecOnlyEngine(), None).problem == "the prometheus container is not running"
    engine = scripted()
    engine.exec_results[tuple(api_argv("/api/v1/alerts"))] = [(1, "connection refused")]
    problem = live_figures(engine, PROMETHEUS).problem
    assert problem and "did not answer /api/v1/alerts (exit 1): connection refused" in problem
    engine = scripted()
    engine.exec_results[tuple(api_argv("/api/v1/alerts"))] = [(0, "<html>")]
    assert "unreadable" in live_figures(engine, PROMETHEUS).problem


def test_a_healthy_replica_prometheus_has_not_scraped_up_yet_is_not_down() -> None:
    """Prometheus lags a scrape: a replica whose container reports healthy is "not scraped
    yet" (down in Prometheus, or no sample at all), one that is not healthy stays DOWN."""
    figures = live_figures(scripted(up="0"), PROMETHEUS,
                           healthy=frozenset({("tiny", "0"), ("tiny", "1")}))
    assert figures.lines()[1:3] == [
        "  tiny replica 0: not scraped yet (its container is healthy), running 3, waiting 1, "
        "KV cache 42 %, prefix cache hits 61 %",
        "  tiny replica 1: not scraped yet (its container is healthy), running -, waiting -, "
        "KV cache -, prefix cache hits -"]
    assert all(r.lagging and not r.up for r in figures.replicas)
    down = "  tiny replica 0: DOWN, running 3, waiting 1, KV cache 42 %, prefix cache hits 61 %"
    assert down in live_figures(
        scripted(up="0"), PROMETHEUS, healthy=frozenset({("tiny", "1")})).lines()


def test_the_prefix_cache_hit_rate_is_vllms_counters_and_none_before_a_prompt() -> None:
    """vLLM counts prompt tokens asked of its prefix cache and found there
    (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total): their ratio per replica;
    Prometheus's NaN while both are 0 is no figure, and JSON never carries a NaN."""
    assert FIGURES["prefix_cache_hit_rate"] == (
        'vllm:prefix_cache_hits_total{job="vllm"} / vllm:prefix_cache_queries_total{job="vllm"}')
    (replica,) = live_figures(scripted(hit_rate="NaN"), PROMETHEUS).replicas
    assert replica.prefix_cache_hit_rate is None
    assert json.dumps(live_figures(scripted(hit_rate="NaN"), PROMETHEUS).to_json(),
                      allow_nan=False)
    (replica,) = live_figures(scripted(), PROMETHEUS).replicas
    assert replica.prefix_cache_hit_rate == 0.613
