"""observability: a real Prometheus 3.5 (Debian's build, as prom/prometheus) scrapes the
stand-in stack that `kit up` started; Grafana's side runs a labelled STAND-IN
(tests/images/grafana-standin, NOT Grafana) so the front door's routing and authentication are
proven, not Grafana itself.

One site for the module, checked in order: every target up; after a short load every PromQL
expression of every dashboard panel and every alert rule's signal returns data; promtool
accepts the files in the container; from outside only Grafana answers, behind authentication;
from inside a replica (hostile model code) neither Grafana nor Prometheus can be reached, and
Grafana takes the user header from the front door only; a stopped replica fires KitReplicaDown
within its short `for:`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
import yaml

from kit.engine.desired import (
    DOOR_FIGURES_SERVICE,
    GRAFANA_SERVICE,
    PROMETHEUS_SERVICE,
    VERIFIER_SERVICE,
)
from kit.plan.build import VERIFIER_PORT
from kit.render.dashboards import le_matcher
from tests.support.live_stack import (
    NAME_CONNECT_S,
    SERVICE,
    UNREACHABLE,
    LiveSite,
    checked,
    curl,
    observed,
    promql_expressions,
    query,
    query_results,
    read_in,
    wait_for,
)

pytestmark = pytest.mark.e2e

SCRAPE_S = 1
# observability.replica_down_after: the alert's `for:`; 5 s, well above what a rule without it
# takes to fire (the first scrape and evaluation after the stop: at most 2 s at 1 s each)
DOWN_AFTER_S = 5


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with observed(tmp_path_factory.mktemp("obs") / "site", docker_client,
                  {"scrape_interval": SCRAPE_S, "replica_down_after": DOWN_AFTER_S},
                  slo={"ttft_p95_ms": 200, "tpot_p95_ms": 30}, prefix="obs") as live:
        yield live


def wait_every_target_up(site: LiveSite) -> None:
    """Prometheus has scraped each of its five targets successfully (a new Prometheus has no
    sample until its first scrape; `kit status` shows that as `not scraped yet`)."""

    def all_up() -> bool:
        targets = query(site, "/api/v1/targets")["activeTargets"]
        return len(targets) == 5 and all(t["health"] == "up" for t in targets)

    wait_for("every target up", all_up, 30)


def test_every_target_is_up(site: LiveSite) -> None:
    wait_every_target_up(site)
    jobs = sorted((t["labels"]["job"], t["labels"].get("service", "-"))
                  for t in query(site, "/api/v1/targets")["activeTargets"])
    assert jobs == [("front-door", "-"), ("front-door-requests", "-"),
                    ("front-door-state", "-"), ("usage", "-"), ("vllm", SERVICE)]


def test_every_panel_and_rule_queries_metrics_that_exist(site: LiveSite) -> None:
    checked(site.kit("keys add", "budgeted", "--tokens-per-day", "100000"))  # budget alerts
    ops = site.basic("ops")
    for _ in range(12):  # a short load: every histogram gets observations
        assert site.completion(ops, tokens=6) == 200
    assert site.status("/v1/models") == 401
    big = {"model": "x", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    assert site.status("/v1/chat/completions", ops, "POST", big) == 413
    walked = promql_expressions(site)
    # the SLO share is a real ratio over the exact bucket (the stand-in is well within 200 ms)
    share = next(at for at, (where, _) in enumerate(walked) if "within the TTFT SLO" in where)
    door_by_status = f'sum by (status) (kit_door_requests_total{{service="{SERVICE}"}})'
    refusals = 'kit_door_requests_total{service=""}'
    found: dict = {}

    def scraped() -> bool:
        """Prometheus has the load: the door's answers counted, every expression with data and
        the SLO share above 0 (all asked in one exec)."""
        door, refused, *results = query_results(
            site, [door_by_status, refusals, *(expr for _, expr in walked)])
        found.update(door={s["metric"]["status"]: float(s["value"][1]) for s in door},
                     refused={s["metric"]["status"] for s in refused},
                     empty=[where_expr for where_expr, result in zip(walked, results,
                                                                     strict=True) if not result],
                     share=float(results[share][0]["value"][1]) if results[share] else None)
        return (found["door"].get("200", 0) >= 12 and {"401", "413"} <= found["refused"]
                and not found["empty"] and 0 < (found["share"] or 0) <= 1)

    deadline = time.monotonic() + 30  # then what is still missing is asserted below
    while not scraped() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert found["door"].get("200", 0) >= 12, found  # the completions, as the door answered them
    assert {"401", "413"} <= found["refused"], found
    empty = found["empty"]
    assert not empty, "queries without data:\n" + "\n".join(f"{w}: {e}" for w, e in empty)
    sources = {where.split(":")[0] for where, _ in walked}
    assert {"kit-front-door.json", f"kit-svc-{SERVICE}.json"} <= sources
    # seven alerts, two SLO ones, three of the usage ledger, two of budgets, the certificate's
    # and the replicas' rotation
    assert len([s for s in sources if s.startswith("rule ")]) == 16
    print(f"{len(walked)} PromQL expressions walked, every one returned data")
    assert 0 < (found["share"] or 0) <= 1, found


def test_prometheus_3_stores_one_spelling_of_each_bucket_bound(site: LiveSite) -> None:
    """The stack runs Prometheus 3.5, which stores every `le` value in one float spelling (a
    whole number keeps its ".0"; Go's exponent form from 1e+06 on): no bound is stored twice,
    and each is Python's repr of the bound, the one spelling the dashboards' exact-bucket
    matchers use (kit.render.dashboards.le_matcher)."""
    version = query(site, "/api/v1/status/buildinfo")["version"]
    assert version.startswith("3.5."), version
    stored = query(site, "/api/v1/label/le/values")
    bounds = [float(value) for value in stored]
    assert len(set(bounds)) == len(bounds), stored  # "1" and "1.0" would be two
    assert "1.0" in stored and "0.2" in stored, stored  # whole and not; 0.2: the TTFT SLO's
    respelt = [value for value, bound in zip(stored, bounds, strict=True)
               if value != "+Inf" and bound < 1e6 and value != le_matcher(bound)[4:-1]]
    assert not respelt, respelt
    print(f"Prometheus {version}: {len(stored)} le values, each in one spelling")


def test_a_second_up_changes_nothing_and_a_new_secret_recreates_only_its_holders(
        site: LiveSite) -> None:
    """The secret and its hash are kept: a second `kit up` changes nothing (the env file and
    the healthcheck read back as the engine has them). A deleted secret is a new one at the
    next `kit up`: Prometheus and Grafana are recreated with it, the door and the replicas
    are not, and every client gets in with the new one."""
    said = checked(site.kit("up", "--no-probe")).stdout
    assert "no change" in said, said
    old = (site.root / ".kit" / "prometheus.password").read_text()
    (site.root / ".kit" / "prometheus.password").unlink()
    said = checked(site.kit("up")).stdout
    assert (site.root / ".kit" / "prometheus.password").read_text() != old
    recreated = sorted(line.split()[2].removesuffix(":") for line in said.splitlines()
                       if line.startswith("recreate container"))
    assert recreated == sorted(site.container(name).name for name in
                               (PROMETHEUS_SERVICE, GRAFANA_SERVICE)), said
    assert query(site, "/api/v1/query", query="up")["result"]  # kit up waited for its health
    reply = site.gate().fetch("GET", "/grafana/", credentials=site.basic("ops"))
    assert reply.json()["datasource_answers"] == {"Prometheus": 200}, reply.body
    # the tests after this one read the new Prometheus: its first scrapes and rule evaluations
    wait_every_target_up(site)
    alerts: list[dict] = []

    def quiet() -> bool:
        """None firing; a pending one may be fair (under CI load, the gate's first token can
        take longer than the site's 200 ms TTFT SLO: pending for its 600 s `for:`)."""
        alerts[:] = query(site, "/api/v1/alerts")["alerts"]
        return all(alert["state"] != "firing" for alert in alerts)

    try:
        wait_for("no alert firing", quiet, 30)
    except AssertionError as error:  # which alert, in which state, with what value
        named = [(alert["labels"], alert["state"], alert.get("value")) for alert in alerts]
        raise AssertionError(f"{error}: {named}") from None


def test_status_shows_live_figures(site: LiveSite) -> None:
    shown = checked(site.kit("status")).stdout
    assert f"{SERVICE} replica 0: up, running 0, waiting 0, KV cache 0 %, prefix cache hits " \
        in shown, shown
    assert "no alert firing" in shown
    seen = json.loads(checked(site.kit("status", "--json")).stdout)["observability"]
    hits = seen["replicas"][0]["prefix_cache_hit_rate"]  # the stand-in's cache is off: 0 or none
    assert hits in (0.0, None), seen
    assert seen["replicas"] == [{"service": SERVICE, "replica": "0", "up": True, "running": 0.0,
                                 "waiting": 0.0, "kv_cache_usage": 0.0, "lagging": False,
                                 "prefix_cache_hit_rate": hits}]
    assert seen["firing"] == [] and seen["problem"] is None


def test_promtool_accepts_the_mounted_files(site: LiveSite) -> None:
    prometheus = site.container(PROMETHEUS_SERVICE)
    for command in (["promtool", "check", "config", "/etc/kit-prometheus/prometheus.yml"],
                    ["promtool", "check", "rules", "/etc/kit-prometheus/rules.yml"]):
        assert "SUCCESS" in read_in(prometheus, command)


def test_from_outside_only_grafana_answers_and_only_with_credentials(site: LiveSite) -> None:
    gate = site.gate()
    assert gate.fetch("GET", "/grafana/").status == 401
    assert gate.fetch("GET", "/grafana/", credentials="Basic b3BzOndyb25n").status == 401
    reply = gate.fetch("GET", "/grafana/d/kit-front-door", credentials=site.basic("ops"))
    assert reply.status == 200, reply.body
    seen = reply.json()
    assert "NOT Grafana" in seen["standin"] and seen["user"] == "user:ops"
    assert seen["authorization_received"] is False  # the door strips the password
    assert seen["datasources"] == ["Prometheus"]
    # the stand-in asked Prometheus `up` as Grafana's data source would, with its Basic auth
    assert seen["datasource_answers"] == {"Prometheus": 200}, seen["datasource_answers"]
    assert {board["uid"] for board in seen["dashboards"]} == {"kit-front-door",
                                                             f"kit-svc-{SERVICE}", "kit-usage"}
    key = site.add_key("dash")
    reply = gate.fetch("GET", "/grafana/", credentials=f"Bearer {key}")
    assert reply.status == 200 and reply.json()["user"] == "key:dash"
    for path in ("/metrics", "/prometheus/", "/api/v1/query", "/kit-figures"):
        assert gate.fetch("GET", path, credentials=site.basic("ops")).status == 404, path
    assert gate.fetch("GET", f"/metrics/{SERVICE}").status == 401
    # nothing but nginx publishes a port, and nothing listens where Prometheus or Grafana would
    for service in (PROMETHEUS_SERVICE, GRAFANA_SERVICE):
        container = site.container(service)
        assert not container.attrs["HostConfig"]["PortBindings"], service
    for port in (9090, 3000, 9113):
        with socket.socket() as probe:
            probe.settimeout(1)
            assert probe.connect_ex(("127.0.0.1", port)) != 0, port


def metrics_addresses(site: LiveSite) -> dict[str, str]:
    """service → its fixed address on the metrics network, as the rendered compose file says."""
    compose = yaml.safe_load((site.root / "compose" / "docker-compose.yml").read_text())
    return {name: body["networks"]["metrics"]["ipv4_address"]
            for name, body in compose["services"].items()
            if isinstance(body.get("networks"), dict) and "metrics" in body["networks"]}


def addresses(site: LiveSite, service: str) -> list[str]:
    """Every address the engine gave a service's container, on any network."""
    networks = site.container(service).attrs["NetworkSettings"]["Networks"]
    return [n["IPAddress"] for n in networks.values() if n["IPAddress"]]


def test_a_replica_cannot_sign_in_to_grafana_nor_find_prometheus(site: LiveSite) -> None:
    """The attack of issue 22: code in a model folder runs in the replica's container and asks
    Grafana for its admin account with the header the front door would send, or Prometheus's
    API. By name neither exists on any network a replica (or door-figures, the same image) is
    on; at any of Grafana's addresses the header is not taken (the whitelist holds the door's
    only). Meanwhile the door still serves Grafana to a signed-in user and Prometheus still
    scrapes every replica."""
    admin = "X-Kit-User: admin"
    by_name = [(f"http://{GRAFANA_SERVICE}:3000/grafana/api/user", admin),
               (f"http://{PROMETHEUS_SERVICE}:9090/api/v1/query?query=up", None),
               (f"http://{PROMETHEUS_SERVICE}:9090/api/v1/targets", None),
               (f"http://nginx:9113/kit-scrape/{SERVICE}", None)]  # the door's listener
    for inside in (SERVICE, DOOR_FIGURES_SERVICE):
        container = site.container(inside)
        for url, header in by_name:
            code, said = curl(container, url, *([header] if header else []),
                              connect_s=NAME_CONNECT_S)
            assert code in UNREACHABLE, f"from {inside}: {url} answered {said} (curl {code})"
            print(f"from {inside}: {url}: {UNREACHABLE[code]}")
        for address in addresses(site, GRAFANA_SERVICE):
            url = f"http://{address}:3000/grafana/api/user"
            code, said = curl(container, url, admin)
            assert code in UNREACHABLE or said == "401", f"from {inside}: {url} answered {said}"
            print(f"from {inside}: {url}: {UNREACHABLE.get(code, said)}")
    reply = site.gate().fetch("GET", "/grafana/api/user", credentials=site.basic("ops"))
    assert reply.status == 200 and reply.json()["user"] == "user:ops", reply.body
    targets = query(site, "/api/v1/targets")["activeTargets"]
    replicas = [t for t in targets if t["labels"]["job"] == "vllm"]
    assert replicas and all(t["health"] == "up" for t in targets), targets


# Every kind of path Prometheus's API has: queries, targets, federation, lifecycle, admin
PROMETHEUS_API = (("GET", "/api/v1/query?query=up"), ("GET", "/api/v1/targets"),
                  ("GET", "/federate?match%5B%5D=up"), ("GET", "/api/v1/status/config"),
                  ("POST", "/-/reload"), ("POST", "/-/quit"),
                  ("POST", "/api/v1/admin/tsdb/snapshot"),
                  ("POST", "/api/v1/admin/tsdb/delete_series?match%5B%5D=up"),
                  ("GET", "/-/ready"), ("GET", "/graph"))


def test_a_replica_gets_nothing_from_prometheus_s_api_at_any_address(site: LiveSite) -> None:
    """By address, whatever the engine: Docker isolates networks (and keeps internal ones
    internal) with its iptables rules, and there no connection is made; an engine run with
    `--iptables=false` (this suite's own engines) forwards between all its bridges, and there
    every path of Prometheus's API answers 401 (its web config's Basic auth, also to a guessed
    password) and the door's scrape listener 403 (it allows Prometheus's address only)."""
    replica = site.container(SERVICE)
    verifier = addresses(site, VERIFIER_SERVICE)[0]
    isolated = curl(replica, f"http://{verifier}:{VERIFIER_PORT}/")[0] in UNREACHABLE
    print("this engine isolates its networks" if isolated else
          f"this engine forwards between its networks: a replica reaches {verifier}")
    answers = []
    guess = "Authorization: Basic a2l0OmtpdA=="  # kit:kit
    for address in addresses(site, PROMETHEUS_SERVICE):
        for method, path in PROMETHEUS_API:
            url = f"http://{address}:9090{path}"
            for headers in ((), (guess,)):
                code, said = curl(replica, url, *headers, method=method)
                assert code in UNREACHABLE or said == "401", f"{method} {url}: {said}"
                answers.append(UNREACHABLE.get(code, said))
                if code in UNREACHABLE:
                    break  # no connection: a password would get no further
    for address in addresses(site, "nginx"):
        url = f"http://{address}:9113/kit-scrape/{SERVICE}"
        code, said = curl(replica, url)
        assert code in UNREACHABLE or said == "403", f"{url} answered {said} (curl {code})"
        answers.append(UNREACHABLE.get(code, said))
    print("from the replica:", {answer: answers.count(answer) for answer in set(answers)})
    if isolated:
        assert not {"401", "403"} & set(answers), answers
    else:  # the connections were made: the refusals above were the credentials' doing
        assert "401" in answers and "403" in answers, answers
    # Prometheus itself, asked without its credentials from inside its own container: 401
    out = read_in(site.container(PROMETHEUS_SERVICE),
                  ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                   "http://127.0.0.1:9090/api/v1/query?query=up"])
    assert out == "401", out
    assert query(site, "/api/v1/query", query="up")["result"]  # with them: answers


def test_grafana_takes_the_user_header_from_the_front_door_only(site: LiveSite) -> None:
    """Prometheus shares the metrics network with Grafana (its data source): the header sent
    from there is not taken (the whitelist holds the door's address alone)."""
    code, said = curl(site.container(PROMETHEUS_SERVICE),
                      f"http://{GRAFANA_SERVICE}:3000/grafana/api/user", "X-Kit-User: admin")
    assert code == 0 and said == "401", (code, said)
    grafana = site.container(GRAFANA_SERVICE).attrs["Config"]["Env"]
    assert f"GF_AUTH_PROXY_WHITELIST={metrics_addresses(site)['nginx']}" in grafana


def test_a_stopped_replica_fires_replica_down(site: LiveSite) -> None:
    """Not before its `for:` window, counted from before the stop was asked: the replica was
    alive until then, so a load that delays the stop or the polling only makes the alert look
    later, never sooner (run beside other tests: docs/testing.md)."""
    asked = time.monotonic()
    site.container(SERVICE).stop(timeout=0)  # SIGKILL; a stopped container is not restarted

    def firing() -> bool:
        alerts = query(site, "/api/v1/alerts")["alerts"]
        return any(a["labels"]["alertname"] == "KitReplicaDown" and a["state"] == "firing"
                   and a["labels"]["service"] == SERVICE for a in alerts)

    # `for:` plus one scrape to see the failure and one evaluation to start the clock
    wait_for("KitReplicaDown firing", firing, DOWN_AFTER_S + 4 * SCRAPE_S + 5)
    elapsed = time.monotonic() - asked
    print(f"KitReplicaDown fired {elapsed:.1f} s after the replica's stop was asked "
          f"(for: {DOWN_AFTER_S} s, scrape/evaluation every {SCRAPE_S} s)")
    assert elapsed >= DOWN_AFTER_S  # not before its `for:` window
    shown = site.kit("status").stdout  # exits 1: the stack is not what the spec says
    assert f"{SERVICE} replica 0: DOWN" in shown, shown
    assert f"FIRING KitReplicaDown: {SERVICE} replica 0 does not answer /metrics" in shown


def test_a_healthy_replica_prometheus_has_not_scraped_up_is_not_shown_down(
        site: LiveSite, docker_client) -> None:
    """Prometheus lags the containers: its last scrape of a replica says down while the
    replica's container reports healthy (here made to last: Prometheus is cut off from every
    network, so each scrape fails). kit status says "not scraped yet", never DOWN."""
    replica, prometheus = site.container(SERVICE), site.container(PROMETHEUS_SERVICE)
    attached = prometheus.attrs["NetworkSettings"]["Networks"]
    for name in attached:
        docker_client.networks.get(name).disconnect(prometheus)
    try:
        if replica.status != "running":  # the previous test stopped it
            replica.start()
        wait_for("the replica healthy", lambda: site.container(SERVICE).attrs["State"]
                 ["Health"]["Status"] == "healthy", 60)

        def scraped_down() -> bool:
            result = query(site, "/api/v1/query", query=f'up{{service="{SERVICE}"}}')["result"]
            return bool(result) and result[0]["value"][1] == "0"

        wait_for("Prometheus's last scrape of the replica failing", scraped_down, 10)
        shown = site.kit("status").stdout
        assert f"{SERVICE} replica 0: not scraped yet (its container is healthy)" in shown, shown
        assert f"{SERVICE} replica 0: DOWN" not in shown, shown
        seen = json.loads(site.kit("status", "--json").stdout)["observability"]["replicas"]
        assert [(r["up"], r["lagging"]) for r in seen] == [(False, True)], seen
    finally:
        for name, settings in attached.items():
            docker_client.networks.get(name).connect(prometheus,
                                                     aliases=settings.get("Aliases") or None)
    wait_for("the replica scraped up again",
             lambda: f"{SERVICE} replica 0: up" in site.kit("status").stdout, 30)
