"""observability: and slo: — the rendered Prometheus config, rules, Grafana provisioning and
dashboards, checked by the real tools (promtool, nginx -t, docker-compose) and the dashboard
library's own model."""

import ipaddress
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from kit.engine.desired import (
    DOOR_FIGURES_SERVICE,
    GRAFANA_SERVICE,
    PROMETHEUS_SERVICE,
    WAKER_SERVICE,
    load_desired,
)
from kit.layout import SiteLayout
from kit.plan.observability import (
    HISTOGRAMS_FLAG,
    TTFT_DEFAULT_BOUNDS,
    ServiceSlo,
    histogram_args,
    metrics_network,
)
from kit.plan.usage import USAGE_JOB, USAGE_PORT, USAGE_SERVICE
from kit.plan.waker import SLEEP_JOB, WAKER_PORT
from kit.render.dashboards import DATASOURCE_UID, le_matcher
from tests.standin.vllm_standin import buckets
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries
from tests.support.sites import OBSERVABILITY, enable, tree


def door_address(site: Path) -> str:
    """The front door's fixed address on the metrics network, as the compose file sets it."""
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    return compose["services"]["nginx"]["networks"]["metrics"]["ipv4_address"]


@pytest.fixture
def observed(site: Path) -> Path:
    """The base site with observability on and a second service that has an SLO, rendered."""
    result = run_kit("render", enable(site))
    assert result.exit_code == 0, result.output
    return site


def test_off_by_default_renders_nothing_of_it(site: Path) -> None:
    assert run_kit("render", site / "site.yaml").exit_code == 0
    assert not (site / "observability").exists()
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert PROMETHEUS_SERVICE not in compose["services"]
    # the front door (and the usage ledger's collector, on by default) alone on the metrics
    # network, ready for observability to be turned on
    assert [name for name, body in compose["services"].items()
            if "metrics" in (body.get("networks") or [])] == ["nginx", USAGE_SERVICE]
    conf = (site / "nginx" / "nginx.conf").read_text()
    assert "/grafana/" not in conf and "/kit-scrape/" not in conf


def test_prometheus_scrapes_every_service_and_the_door(observed: Path) -> None:
    config = yaml.safe_load((observed / "observability/prometheus/prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    door = door_address(observed) + ":9113"  # Prometheus reads everything from the door
    targets = [(c["targets"], c["labels"]) for c in jobs["vllm"]["static_configs"]]
    assert targets == [
        ([door], {"service": "llama8b", "replica": "0", "instance": "llama8b",
                  "__metrics_path__": "/kit-scrape/llama8b"}),
        ([door], {"service": "small", "replica": "0", "instance": "small",
                  "__metrics_path__": "/kit-scrape/small"})]
    assert jobs["front-door"]["static_configs"] == [{"targets": [door]}]
    assert jobs["front-door"]["metrics_path"] == "/kit-figures"
    assert jobs["front-door-requests"]["static_configs"] == [
        {"targets": [door], "labels": {"instance": "door-figures"}}]
    assert jobs["front-door-requests"]["metrics_path"] == "/kit-scrape/door-figures"


def test_promtool_accepts_the_config_and_rules(observed: Path, promtool: str,
                                               tmp_path: Path) -> None:
    prometheus = observed / "observability" / "prometheus"
    # the config names the rules where the container mounts them: point it at this copy
    config = (prometheus / "prometheus.yml").read_text().replace(
        "/etc/kit-prometheus/", f"{prometheus}/")
    (tmp_path / "prometheus.yml").write_text(config)
    for args in (["check", "config", str(tmp_path / "prometheus.yml")],
                 ["check", "rules", str(prometheus / "rules.yml")]):
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_is_prometheus_3(promtool: str) -> None:
    """The checks run the LTS line of the pinned prom/prometheus:v3.5.0, not an older one."""
    result = subprocess.run([promtool, "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("promtool, version 3.5."), result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule(observed: Path, promtool: str) -> None:
    """The check itself can fail: a rule with a PromQL syntax error is refused."""
    rules = observed / "observability" / "prometheus" / "rules.yml"
    rules.write_text(rules.read_text().replace("up{job=", "up{{job=", 1))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0


def test_alert_rules(observed: Path) -> None:
    groups = yaml.safe_load((observed / "observability/prometheus/rules.yml").read_text())
    rules = {rule["alert"]: rule for rule in groups["groups"][0]["rules"]}
    assert set(rules) == {"KitReplicaDown", "KitServiceDown", "KitNoServiceReady",
                          "KitKVCacheFull", "KitRequestsWaiting", "KitServerErrors",
                          "KitTTFTAboveSLO", "KitTPOTAboveSLO", "KitUsagePrunedForSpace",
                          "KitUsageCollectorDown", "KitUsageNotRecording", "KitUsageDiskFull",
                          "KitBudgetNearlySpent", "KitBudgetSpent", "KitCertificateExpiresSoon",
                          "KitReplicaOutOfRotation"}
    assert rules["KitReplicaDown"]["expr"] == 'up{job="vllm"} == 0'
    # issue 42 item 6: the disk bound pruning records of credentials is an alert for a day
    assert rules["KitUsagePrunedForSpace"]["expr"] == (
        'increase(kit_usage_credential_requests_pruned_total{job="usage"}[1d]) > 0')
    assert rules["KitReplicaDown"]["for"] == "20s"  # observability.replica_down_after
    assert rules["KitKVCacheFull"]["expr"].endswith("> 0.95") and rules["KitKVCacheFull"][
        "for"] == "300s"
    assert rules["KitRequestsWaiting"]["for"] == "60s"
    assert rules["KitServerErrors"]["expr"].endswith("> 0.01")
    ttft = rules["KitTTFTAboveSLO"]
    assert 'service="small"' in ttft["expr"] and ttft["expr"].endswith("> 0.2")
    assert ttft["for"] == "600s" and rules["KitTPOTAboveSLO"]["expr"].endswith("> 0.03")


def test_slo_becomes_exact_bucket_bounds(observed: Path) -> None:
    compose = yaml.safe_load((observed / "compose" / "docker-compose.yml").read_text())
    command = compose["services"]["small"]["command"]
    value = command[command.index(HISTOGRAMS_FLAG) + 1]
    families = json.loads(value)
    assert 0.2 in families["time_to_first_token"] and 0.03 in families["inter_token_latency"]
    assert set(TTFT_DEFAULT_BOUNDS) < set(families["time_to_first_token"])
    # the stand-in's check (vLLM's family keys and rules) accepts what kit passes
    parsed = buckets.parse(value)
    assert 0.03 in parsed["vllm:request_time_per_output_token_seconds"]
    assert HISTOGRAMS_FLAG not in compose["services"]["llama8b"]["command"]  # no slo: no flag


def test_histogram_args_per_objective() -> None:
    assert histogram_args(None) == []
    only_ttft = json.loads(histogram_args(ServiceSlo("s", 0.25, None))[1])
    assert list(only_ttft) == ["time_to_first_token"]
    assert only_ttft["time_to_first_token"].count(0.25) == 1  # already a default bound


def test_le_matcher_spells_the_bound_as_prometheus_3_stores_it() -> None:
    """One spelling, the one Prometheus 3 normalises every `le` value to (a whole number keeps
    its ".0"); tests/e2e/test_observability.py reads the stored values back."""
    assert le_matcher(0.2) == 'le="0.2"'
    assert le_matcher(1) == 'le="1.0"'
    assert le_matcher(0.001) == 'le="0.001"'  # the smallest SLO bound (1 ms)
    assert le_matcher(3600) == 'le="3600.0"'  # the largest (ttft_p95_ms: 3600000)


def test_dashboards_round_trip_through_the_library(observed: Path) -> None:
    folder = observed / "observability" / "grafana" / "dashboards"
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["kit-front-door.json", "kit-svc-llama8b.json", "kit-svc-small.json",
                     "kit-usage.json"]
    for path in folder.iterdir():
        raw = json.loads(path.read_text())
        board = Dashboard.from_json(raw)
        assert board.uid == path.stem and board.title.startswith("kit ·")
        for panel in raw["panels"]:
            assert panel["datasource"]["uid"] == DATASOURCE_UID
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    small = json.loads((folder / "kit-svc-small.json").read_text())
    titles = [panel["title"] for panel in small["panels"]]
    assert "Requests within the TTFT SLO (200 ms)" in titles
    assert "Requests within the TPOT SLO (30 ms)" in titles
    share = next(p for p in small["panels"] if p["title"].startswith("Requests within the TTFT"))
    assert 'le="0.2"' in share["targets"][0]["expr"]
    llama = json.loads((folder / "kit-svc-llama8b.json").read_text())
    assert not any("SLO" in panel["title"] for panel in llama["panels"])
    usage = json.loads((folder / "kit-usage.json").read_text())
    assert all('job="usage"' in target["expr"] for panel in usage["panels"]
               for target in panel["targets"])


def test_the_usage_dashboard_and_scrape_go_with_the_ledger(observed: Path) -> None:
    """Prometheus reads the ledger's figures through the door's listener like every other
    target; with `usage: {enabled: false}` there is neither the job nor the dashboard."""
    config = yaml.safe_load((observed / "observability/prometheus/prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == USAGE_JOB)
    assert job["metrics_path"] == f"/kit-scrape/{USAGE_SERVICE}"
    conf = (observed / "nginx" / "nginx.conf").read_text()
    assert f"set $kit_scrape {USAGE_SERVICE}:{USAGE_PORT};" in conf
    spec = observed / "site.yaml"
    spec.write_text(spec.read_text().replace("services:\n", "usage: {enabled: false}\nservices:\n",
                                             1))
    shutil.rmtree(observed / "observability")  # a render leaves files it no longer makes
    assert run_kit("render", spec).exit_code == 0
    config = yaml.safe_load((observed / "observability/prometheus/prometheus.yml").read_text())
    assert USAGE_JOB not in [job["job_name"] for job in config["scrape_configs"]]
    assert not (observed / "observability/grafana/dashboards/kit-usage.json").exists()
    assert USAGE_SERVICE not in (observed / "nginx" / "nginx.conf").read_text()


def test_grafana_provisioning(observed: Path) -> None:
    provisioning = observed / "observability" / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "kit.yml").read_text())
    assert sources["datasources"] == [{
        "name": "Prometheus", "uid": DATASOURCE_UID, "type": "prometheus", "access": "proxy",
        "url": "http://prometheus:9090", "basicAuth": True, "basicAuthUser": "kit",
        "secureJsonData": {"basicAuthPassword": "${KIT_PROMETHEUS_PASSWORD}"},
        "isDefault": True, "editable": False}]
    providers = yaml.safe_load((provisioning / "dashboards" / "kit.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/kit-dashboards"


def test_compose_keeps_both_private(observed: Path) -> None:
    compose = yaml.safe_load((observed / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in (PROMETHEUS_SERVICE, GRAFANA_SERVICE, DOOR_FIGURES_SERVICE):
        assert "ports" not in services[name] and "deploy" not in services[name]  # no GPU
    assert list(services[PROMETHEUS_SERVICE]["networks"]) == ["metrics"]
    assert list(services[GRAFANA_SERVICE]["networks"]) == ["metrics"]
    assert services[DOOR_FIGURES_SERVICE]["networks"] == ["backend"]
    assert compose["networks"]["metrics"]["internal"] is True
    assert "--storage.tsdb.retention.time=7d" in services[PROMETHEUS_SERVICE]["command"]
    grafana = services[GRAFANA_SERVICE]["environment"]
    assert grafana["GF_SERVER_ROOT_URL"] == "https://llm.test.internal:8443/grafana/"
    assert grafana["GF_AUTH_PROXY_HEADER_NAME"] == "X-Kit-User"
    assert grafana["GF_AUTH_PROXY_WHITELIST"] == door_address(observed)
    figures = services[DOOR_FIGURES_SERVICE]
    assert figures["image"] == services["small"]["image"]  # the vLLM image's python3
    upstreams = json.loads(figures["command"][figures["command"].index("--upstreams") + 1])
    assert upstreams == {"kit_llama8b": "llama8b", "kit_small": "small"}
    shared = {"type": "volume", "source": "door-figures", "target": "/var/kit-figures"}
    assert shared in services["nginx"]["volumes"] and shared in figures["volumes"]
    desired = load_desired(SiteLayout(observed), "kit-obs-test")
    assert {PROMETHEUS_SERVICE, GRAFANA_SERVICE, DOOR_FIGURES_SERVICE} <= {
        s.name for s in desired.services}


def test_real_tools_accept_the_files(observed: Path) -> None:
    reason = nginx_ns.available()
    if reason:
        pytest.skip(reason)
    result = nginx_ns.nginx_t(observed / "nginx", ["llama8b", "small"])
    assert result.returncode == 0, result.stderr
    for binary in compose_binaries():
        result = subprocess.run(
            [*binary, "-p", "kit-obs-test", "-f", "compose/docker-compose.yml", "config", "-q"],
            cwd=observed, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{binary}: {result.stderr}"


def test_networks_by_need(observed: Path) -> None:
    """Who shares a network with whom, read from the rendered compose file: no replica (nor
    door-figures, the same image) with Prometheus or Grafana; those two with the front door
    alone; fixed, distinct addresses inside the subnet; Grafana trusts the door's only, and
    Prometheus reads nothing but the door's listener, which is bound to that address."""
    compose = yaml.safe_load((observed / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    member = {name: set(body.get("networks") or []) for name, body in services.items()}
    reach = {name: {other for other in services if other != name and nets & member[other]}
             for name, nets in member.items()}
    # the usage ledger's collector: kit's own, holding no secret and running no model code
    assert reach[GRAFANA_SERVICE] == {"nginx", PROMETHEUS_SERVICE, USAGE_SERVICE}
    assert reach[PROMETHEUS_SERVICE] == {"nginx", GRAFANA_SERVICE, USAGE_SERVICE}
    assert reach[USAGE_SERVICE] == {"nginx", GRAFANA_SERVICE, PROMETHEUS_SERVICE}
    for contained, network in (("llama8b", "backend-llama8b"), ("small", "backend-small"),
                               (DOOR_FIGURES_SERVICE, "backend")):
        assert member[contained] == {network}, contained
        # a replica reaches the front door alone: no other service's replica, no door-figures
        assert reach[contained] == {"nginx"}, contained
    metrics = compose["networks"]["metrics"]
    pool = metrics["ipam"]["config"][0]
    subnet = ipaddress.ip_network(pool["subnet"])
    fixed = {name: body["networks"]["metrics"]["ipv4_address"] for name, body in services.items()
             if "metrics" in member[name]}
    assert set(fixed) == {"nginx", PROMETHEUS_SERVICE, GRAFANA_SERVICE, USAGE_SERVICE}
    assert len({*fixed.values(), pool["gateway"]}) == 5
    assert all(ipaddress.ip_address(a) in subnet for a in (*fixed.values(), pool["gateway"]))
    assert metrics["internal"] is True
    door = fixed["nginx"]
    assert services[GRAFANA_SERVICE]["environment"]["GF_AUTH_PROXY_WHITELIST"] == door
    config = yaml.safe_load((observed / "observability/prometheus/prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"]
               for c in job["static_configs"] for t in c["targets"]}
    assert targets == {f"{door}:9113"}
    conf = (observed / "nginx" / "nginx.conf").read_text()
    assert re.findall(r"listen (\S+?);", conf).count(f"{door}:9113") == 1
    assert ":9113" not in conf.replace(f"listen {door}:9113;", "")
    for host in ("llama8b", "small"):
        assert (f"location = /kit-scrape/{host} {{\n            set $kit_scrape {host}:8000;"
                in conf), host


def test_the_subnet_is_the_spec_s_or_one_picked_by_the_site_name(site: Path) -> None:
    spec = enable(site, OBSERVABILITY.replace("}", ", subnet: 10.89.7.0/29}"))
    assert run_kit("render", spec).exit_code == 0
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert compose["networks"]["metrics"]["ipam"]["config"] == [
        {"subnet": "10.89.7.0/29", "gateway": "10.89.7.1"}]
    assert compose["services"]["nginx"]["networks"]["metrics"] == {"ipv4_address": "10.89.7.2"}
    picked = {metrics_network(name, None).subnet for name in ("a", "b", "c", "d")}
    assert len(picked) == 4 and all(
        ipaddress.ip_network(s).subnet_of(ipaddress.ip_network("198.18.0.0/15")) for s in picked)


def test_nginx_grafana_route_is_authenticated(observed: Path) -> None:
    conf = (observed / "nginx" / "nginx.conf").read_text()
    block = conf[conf.index("location ^~ /grafana/"):]
    block = block[:block.index("}")]
    assert "auth_request /_kit/auth;" in block
    assert 'proxy_set_header Authorization "";' in block
    assert "proxy_set_header X-Kit-User $kit_principal;" in block
    assert "location = /metrics " not in conf  # /metrics itself stays 404 at the door
    assert ("access_log syslog:server=unix:/var/kit-figures/access.sock,nohostname,tag=kit "
            "kit_figures;") in conf
    listen = f"listen {door_address(observed)}:9113;"  # the metrics address only
    figures = conf[conf.index(listen) - 40:]
    assert "ssl" not in figures[:figures.index("}")]
    assert "listen 9113" not in conf


@pytest.mark.parametrize(("extra", "services", "message"), [
    ("", "    slo: {}\n", "slo sets ttft_p95_ms, tpot_p95_ms or both"),
    ("", "    slo: {ttft_p95_ms: 0}\n", "greater than or equal to 1"),
    ("", "    slo: {ttft_p95_ms: 100}\n    extra_args: [\"--custom-histogram-buckets={}\"]\n",
     "--custom-histogram-buckets conflicts with slo"),
    (OBSERVABILITY, "    extra_args: [\"--disable-log-stats\"]\n",
     "--disable-log-stats conflicts with observability.enabled"),
    ("observability: {enabled: true, scrape_interval: 0}\n", "", "observability.scrape_interval"),
    ("observability: {enable: true}\n", "", "did you mean 'enabled'?"),
    ("observability: {subnet: 8.8.8.0/28}\n", "", "8.8.8.0/28 is not a private network"),
    ("observability: {subnet: 10.0.0.1/28}\n", "", "is not an IPv4 network with zero host"),
    ("observability: {subnet: 10.0.0.0/30}\n", "", "the prefix must be /16 to /29"),
    ("observability: {subnet: 10.0.0.0/8}\n", "", "the prefix must be /16 to /29"),
    ("observability: {subnet: 127.0.0.0/28}\n", "", "is not a private network"),
    ("observability: {subnet: 'fd00::/64'}\n", "", "is not an IPv4 network"),
])
def test_bad_observability_input_is_refused(site: Path, extra: str, services: str,
                                            message: str) -> None:
    spec = site / "site.yaml"
    text = spec.read_text().replace("services:\n", extra + "services:\n")
    text = text.replace('    extra_args: ["--enable-prefix-caching"]\n', services)
    spec.write_text(text)
    before = tree(site)
    result = run_kit("render", spec)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert tree(site) == before


def test_the_sleep_panel_and_scrape_go_with_idle_sleep(observed: Path, promtool: str) -> None:
    """With idle_sleep, Prometheus reads the waker's figures through the door's listener (the
    waker answers the door's address only) and the service's dashboard has a sleep panel;
    promtool, nginx -t and compose accept the files."""
    spec = observed / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "    max_num_seqs: 64\n", "    max_num_seqs: 64\n    idle_sleep: {after: 15m}\n", 1))
    assert run_kit("render", spec).exit_code == 0
    config = yaml.safe_load((observed / "observability/prometheus/prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == SLEEP_JOB)
    assert job["metrics_path"] == f"/kit-scrape/{WAKER_SERVICE}"
    waker = yaml.safe_load((observed / "compose" / "docker-compose.yml").read_text())[
        "services"][WAKER_SERVICE]
    address = waker["networks"]["metrics"]["ipv4_address"]
    # it reaches the replicas of the service with idle_sleep on their network, no other's
    assert set(waker["networks"]) == {"backend-llama8b", "metrics"}
    conf = (observed / "nginx" / "nginx.conf").read_text()
    assert f"proxy_pass http://{address}:{WAKER_PORT}/metrics;" in conf
    board = json.loads((observed / "observability/grafana/dashboards/kit-svc-llama8b.json")
                       .read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    assert f'kit_sleep_awake{{job="{SLEEP_JOB}",service="llama8b"}}' in exprs
    rules = {rule["alert"]: rule for rule in yaml.safe_load(
        (observed / "observability/prometheus/rules.yml").read_text())["groups"][0]["rules"]}
    assert rules["KitWakerDown"]["expr"] == f'up{{job="{SLEEP_JOB}"}} == 0'
    assert rules["KitWakeFailed"]["expr"] == (
        f'max by (service) (increase(kit_sleep_failed_wakes_total{{job="{SLEEP_JOB}"}}[5m])) > 0')
    assert rules["KitWakeFailed"]["for"] == "0s"
    other = json.loads((observed / "observability/grafana/dashboards/kit-svc-small.json")
                       .read_text())
    assert not any("kit_sleep" in target["expr"] for panel in other["panels"]
                   for target in panel["targets"])
    result = subprocess.run([promtool, "check", "config", "--syntax-only",
                             str(observed / "observability/prometheus/prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([promtool, "check", "rules",
                             str(observed / "observability/prometheus/rules.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    if nginx_ns.available() is None:
        nginx = nginx_ns.nginx_t(observed / "nginx", ["llama8b", "small"])
        assert nginx.returncode == 0, nginx.stderr
