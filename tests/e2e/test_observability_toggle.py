"""Turning observability on and off is a reload of the running front door, not a recreate of
its container: `kit up` under batches of 64 streams each way drops none, nginx keeps its
container, and once on, Prometheus scrapes both replicas (through the door's metrics
listener) while no replica reaches Prometheus or Grafana.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from kit.engine.desired import GRAFANA_SERVICE, PROMETHEUS_SERVICE
from kit.spec.replicas import compose_names
from tests.support import live_stack
from tests.support.live_stack import SERVICE, LiveSite

pytestmark = pytest.mark.e2e

STREAMS = 64
REPLICAS = compose_names(SERVICE, 2)


@pytest.fixture(scope="module")
def site(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    with live_stack.running(
        tmp_path_factory.mktemp("toggle") / "site", docker_client, prefix="tog",
        proxy={"rate_limit_per_ip": 100000, "rate_limit_per_credential": 100000},
        overrides={SERVICE: {"gpus": [0, 1], "tensor_parallel": 1,
                             "gpu_memory_utilization": 0.9}},
    ) as site:
        yield site


def turn(site: LiveSite, enabled: bool) -> None:
    spec = yaml.safe_load(site.spec_path.read_text())
    spec["observability"] = {"enabled": enabled, "scrape_interval": 1}
    live_stack.write_spec(site.spec_path, spec)


def test_observability_on_and_off_under_64_streams_drops_none(site: LiveSite) -> None:
    door = site.nginx.id
    for enabled in (True, False):
        turn(site, enabled)
        result, requests, failed = site.up_under_load(STREAMS)
        live_stack.checked(result)
        said = result.stdout
        print(f"observability {'on' if enabled else 'off'}: {requests} streams, "
              f"failed {failed or 0}")
        assert f"reload {site.name}-nginx-1" in said, said
        assert "nginx-1: config changed" not in said and site.nginx.id == door, said
        assert failed == {} and requests >= STREAMS, (requests, failed)
        actions = [line for line in said.splitlines()
                   if line.startswith(("create container", "recreate", "remove", "roll"))]
        for replica in REPLICAS:  # no replica was touched either way
            assert not [line for line in actions if replica in line], said
        if enabled:
            def every_target_up() -> bool:
                targets = live_stack.query(site, "/api/v1/targets")["activeTargets"]
                # the door three times (nginx's figures, its requests, its own state), the
                # usage ledger, the replicas
                return len(targets) == 4 + len(REPLICAS) and all(
                    t["health"] == "up" for t in targets)

            live_stack.wait_for("every target up", every_target_up, 30)
            scraped = sorted(t["labels"]["instance"] for t in live_stack.query(
                site, "/api/v1/targets")["activeTargets"] if t["labels"]["job"] == "vllm")
            assert scraped == sorted(REPLICAS)
            for replica in REPLICAS:
                for url in (f"http://{GRAFANA_SERVICE}:3000/grafana/api/user",
                            f"http://{PROMETHEUS_SERVICE}:9090/api/v1/targets"):
                    code, answered = live_stack.curl(site.container(replica), url,
                                                     "X-Kit-User: admin",
                                                     connect_s=live_stack.NAME_CONNECT_S)
                    assert code in live_stack.UNREACHABLE, f"{replica}: {url} answered {answered}"
        else:
            services = {c.labels.get("com.docker.compose.service") for c in
                        site.client.containers.list(all=True, filters={
                            "label": f"com.docker.compose.project={site.name}"})}
            assert not services & {PROMETHEUS_SERVICE, GRAFANA_SERVICE}, services
