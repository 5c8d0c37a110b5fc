"""idle_sleep with observability on (issue 26): a real Prometheus 3.5 (as in
test_observability.py) scrapes the waker through the front door's metrics listener (job
`sleep`), with one stand-in service in sleep mode (the stand-in is NOT vLLM:
tests/standin/vllm_standin/sleep.py).

After a sleep by hand and a wake by a request through the door, every PromQL expression of
every dashboard panel and alert rule returns data, and the "Sleep mode" panel's and the sleep
alerts' with the values the waker holds (awake 1 / asleep 0, the wake and the sleep counted,
none held); a wake told to fail fires KitWakeFailed, which Alertmanager delivers to a webhook
and an SMTP sink (tests/support/alert_sinks.py).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from kit.plan.waker import SLEEP_JOB
from tests.support.alert_sinks import Sinks, delivered, receivers, site_sinks
from tests.support.live_stack import (
    SERVICE,
    LiveSite,
    checked,
    observed,
    promql_expressions,
    query,
    query_results,
    wait_for,
)

pytestmark = pytest.mark.e2e

SCRAPE_S = 1
FAIL_FILE = "/tmp/kit-test-fail-wake"
PANEL = "Sleep mode: awake, wakes, held requests"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, docker_client, test_images) -> Iterator[tuple[LiveSite, Sinks]]:
    """The site, its alerts delivered to a webhook and an SMTP sink (a failed wake's too)."""
    root = tmp_path_factory.mktemp("sleepobs") / "site"
    sink = f"kit-alert-sink-{secrets.token_hex(3)}"
    with observed(root, docker_client,
                  {"scrape_interval": SCRAPE_S, "replica_down_after": 3,
                   "alerts": receivers(root, sink)}, prefix="sob",
                  env={"STANDIN_WAKE_SECONDS": "0.2", "STANDIN_WAKE_FAIL_FILE": FAIL_FILE},
                  overrides={SERVICE: {"idle_sleep": {"after": "15m"}}}) as live, \
            site_sinks(live, sink) as sinks:
        yield live, sinks


@pytest.fixture(scope="module")
def site(stack) -> LiveSite:
    return stack[0]


def value(site: LiveSite, expr: str) -> float:
    """The one sample `expr` returns now."""
    (sample,) = query(site, "/api/v1/query", query=expr)["result"]
    return float(sample["value"][1])


def sleep_panel(site: LiveSite) -> dict[str, str]:
    """The sleep panel's expressions by the metric they read (`$__rate_interval` walked)."""
    walked = promql_expressions(site)
    panel = [expr for where, expr in walked if where == f"kit-svc-{SERVICE}.json: {PANEL}"]
    assert len(panel) == 6, walked
    return {next(word for word in expr.replace("(", " ").replace("{", " ").split()
                 if word.startswith("kit_sleep_")): expr for expr in panel}


def scraped(site: LiveSite, expr: str, expected: float) -> float:
    """Seconds until Prometheus's `expr` is `expected` (it lags the waker by a scrape)."""
    return wait_for(f"{expr} == {expected}", lambda: value(site, expr) == expected, 30)


def test_the_sleep_panel_and_alerts_return_the_waker_s_figures(site: LiveSite) -> None:
    checked(site.kit("keys add", "budgeted", "--tokens-per-day", "100000"))  # budget alerts
    wait_for("every target up", lambda: all(
        t["health"] == "up" for t in query(site, "/api/v1/targets")["activeTargets"]), 60)
    jobs = {t["labels"]["job"] for t in query(site, "/api/v1/targets")["activeTargets"]}
    assert SLEEP_JOB in jobs, jobs
    panel = sleep_panel(site)
    awake = panel["kit_sleep_awake"]
    assert awake == f'kit_sleep_awake{{job="{SLEEP_JOB}",service="{SERVICE}"}}'
    scraped(site, awake, 1)  # started awake
    slept = site.kit("sleep", SERVICE)
    assert slept.returncode == 0, slept.stdout + slept.stderr
    asleep_after = scraped(site, awake, 0)
    key = f"Bearer {site.add_key('sleeper')}"
    assert site.completion(key) == 200  # held at the door while the waker wakes it
    awake_after = scraped(site, awake, 1)
    figures: dict[str, float] = {}

    def counted() -> bool:
        """increase() over the window sees both counts' steps (a scrape or two after the
        wake), every panel figure asked in one exec."""
        for metric, result in zip(panel, query_results(site, list(panel.values())), strict=True):
            (sample,) = result
            figures[metric] = float(sample["value"][1])
        return figures["kit_sleep_wakes_total"] >= 1 and figures["kit_sleep_sleeps_total"] >= 1

    deadline = time.monotonic() + 30  # then the figures are asserted below
    while not counted() and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"Prometheus saw the sleep in {asleep_after:.1f} s and the wake in "
          f"{awake_after:.1f} s; the panel: " + ", ".join(f"{m} {v:g}" for m, v in
                                                          figures.items()))
    assert figures["kit_sleep_awake"] == 1
    assert figures["kit_sleep_held_requests"] == 0
    # increase() extrapolates over the window: at least the one step, never a made-up one
    assert figures["kit_sleep_wakes_total"] >= 1 and figures["kit_sleep_sleeps_total"] >= 1
    assert figures["kit_sleep_failed_wakes_total"] == 0
    assert 0.2 <= figures["kit_sleep_last_wake_seconds"] < 30  # the programmed wake, and more
    walked = promql_expressions(site)
    empty = [(where, expr) for (where, expr), result in zip(
        walked, query_results(site, [expr for _, expr in walked]), strict=True) if not result]
    assert not empty, "queries without data:\n" + "\n".join(f"{w}: {e}" for w, e in empty)
    rules = {where: expr for where, expr in walked if where.startswith("rule KitWake")}
    assert value(site, rules["rule KitWakerDown"]) == 1  # up
    assert value(site, rules["rule KitWakeFailed"]) == 0
    print(f"{len(walked)} PromQL expressions walked, every one returned data")


def test_a_failed_wake_fires_kit_wake_failed_and_is_delivered(stack) -> None:
    site, sinks = stack
    slept = site.kit("sleep", SERVICE)
    assert slept.returncode == 0, slept.stdout + slept.stderr
    container = site.container(SERVICE)
    container.exec_run(["touch", FAIL_FILE])
    try:
        key = f"Bearer {site.add_key('failing')}"
        since = time.time()
        assert site.completion(key) == 503
        panel = sleep_panel(site)
        scraped(site, f'kit_sleep_failed_wakes_total{{job="{SLEEP_JOB}",service="{SERVICE}"}}',
                1)
        assert value(site, panel["kit_sleep_awake"]) == 0

        def firing() -> bool:
            alerts = query(site, "/api/v1/alerts")["alerts"]
            return any(a["labels"]["alertname"] == "KitWakeFailed" and a["state"] == "firing"
                       and a["labels"].get("service") == SERVICE for a in alerts)

        print(f"KitWakeFailed firing {wait_for('KitWakeFailed firing', firing, 30):.1f} s "
              "after the failed wake was scraped")
        hooks, _ = delivered(site, sinks, "KitWakeFailed", since)  # webhook and mail
        assert any(a["labels"].get("service") == SERVICE for a in hooks[0]["body"]["alerts"])
    finally:
        container.exec_run(["rm", "-f", FAIL_FILE])
