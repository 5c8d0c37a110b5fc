"""Multi-node services: the spec's rules, and what each node runs (vLLM 0.33's native
multi-node flags, host networking, the node's address and interface), accepted by compose and
nginx; every flag kit renders is one `vllm serve` 0.33.0 has."""

import hashlib
import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from kit.engine.desired import CONFIG_HASH_LABEL, load_desired
from kit.layout import SiteLayout
from kit.spec.vllm_flags import flag_table
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries
from tests.support.sites import MULTI_NODE, tree


@pytest.fixture
def multi(site: Path) -> Path:
    """The base site with a second service: llama-8b over two nodes of two GPUs."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE)
    return site


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_node_runs_vllm_native_multi_node_mode(multi: Path) -> None:
    result = run_kit("render", multi / "site.yaml")
    assert result.exit_code == 0, result.output
    compose = yaml.safe_load((multi / "compose" / "docker-compose.yml").read_text())
    head = compose["services"]["big"]
    worker = yaml.safe_load((multi / "compose" / "node-gpu02.yml").read_text())
    [(name, worker)] = worker["services"].items()
    assert name == "big"
    table = flag_table()
    for argv, rank in ((head["command"], "0"), (worker["command"], "1")):
        assert [a for a in argv if a.startswith("-") and table.lookup(a) is None] == []
        assert _arg(argv, "--nnodes") == "2" and _arg(argv, "--node-rank") == rank
        assert _arg(argv, "--master-addr") == "10.213.0.1"
        assert _arg(argv, "--master-port") == "29600"
        assert _arg(argv, "--tensor-parallel-size") == "2"
        assert _arg(argv, "--pipeline-parallel-size") == "2"
        assert _arg(argv, "--distributed-executor-backend") == "mp"
    assert "--headless" in worker["command"] and "--headless" not in head["command"]
    # The API on the head's own address only, never on every interface of the host.
    assert _arg(head["command"], "--host") == "10.213.0.1" and "--host" not in worker["command"]
    for body in (head, worker):
        assert body["network_mode"] == "host" and body["ipc"] == "host"
        assert "networks" not in body
    assert head["healthcheck"]["test"][-1] == "http://10.213.0.1:8000/health"
    assert compose["services"]["nginx"]["extra_hosts"] == ["big:10.213.0.1"]
    assert compose["services"]["llama8b"]["networks"] == ["backend-llama8b"]  # others unchanged
    assert "backend-big" not in compose["networks"]  # the head is on the host's network
    assert "nodes" not in (multi / "compose" / "llama8b.env").read_text()


def test_each_node_gets_its_address_and_the_interface(multi: Path) -> None:
    assert run_kit("render", multi / "site.yaml").exit_code == 0
    for name, address in (("big.env", "10.213.0.1"), ("node-gpu02.env", "10.213.0.2")):
        path = multi / "compose" / name
        text = path.read_text()
        assert f'VLLM_HOST_IP="{address}"' in text
        assert 'NCCL_SOCKET_IFNAME="veth-kit0"' in text and 'GLOO_SOCKET_IFNAME="veth-kit0"' in text
        assert path.stat().st_mode & 0o777 == 0o600


def test_compose_and_nginx_accept_the_multi_node_files(multi: Path) -> None:
    assert run_kit("render", multi / "site.yaml").exit_code == 0
    for binary in compose_binaries():
        for name in ("docker-compose.yml", "node-gpu02.yml"):
            result = subprocess.run([*binary, "-p", "kit-mn", "-f", f"compose/{name}", "config",
                                     "-q"], cwd=multi, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"{binary} {name}: {result.stderr}"
    if nginx_ns.available() is None:
        checked = nginx_ns.nginx_t(multi / "nginx", ["llama8b", "big"])
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(("edit", "fragments"), [
    (lambda t: t.replace("pipeline_parallel: 2", "pipeline_parallel: 4"),
     ["services[1]", "tensor_parallel 2 x pipeline_parallel 4 must equal the 4 GPUs",
      "on each of 2 nodes"]),
    (lambda t: t.replace("{name: test01, address: 10.213.0.1}",
                         "{name: gpu03, address: 10.213.0.1}"),
     ["services[1].nodes[0].name", "the first node is the head", "list test01 first"]),
    (lambda t: t.replace("address: 10.213.0.2", "address: 10.213.0.1"),
     ["nodes list the address 10.213.0.1 twice"]),
    (lambda t: t.replace("address: 10.213.0.2", "address: gpu02.lan"),
     ["services[1].nodes[1].address", "not an IP address"]),
    (lambda t: t.replace("network_interface: veth-kit0", "network_interface: eth0;rm"),
     ["services[1].network_interface"]),
    (lambda t: t.replace("master_port: 29600", 'extra_args: ["--pipeline-parallel-size", "2"]'),
     ["services[1].extra_args[0]", "repeats the service's pipeline_parallel"]),
    (lambda t: t.replace("master_port: 29600", 'extra_args: ["--node-rank", "1"]'),
     ["--node-rank is set by kit from the spec: use nodes"]),
    (lambda t: t.replace("gpus: [4]", "gpus: [4]\n    network_interface: eth0"),
     ["services[0]", "network_interface is only read for a service with nodes"]),
    (lambda t: t + MULTI_NODE.replace("name: big", "name: big2"),
     ["services[2].nodes", "a second multi-node service"]),
])
def test_bad_multi_node_specs_exit_2_and_write_nothing(multi: Path, edit, fragments) -> None:
    spec = multi / "site.yaml"
    spec.write_text(edit(spec.read_text()))
    before = tree(multi)
    result = run_kit("render", spec)
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output
    assert tree(multi) == before


def test_kit_up_refuses_a_worker_whose_engine_is_unknown_before_writing(multi: Path) -> None:
    """kit up reaches each worker on its node's engine: with neither the node's engine nor a
    sibling spec it cannot tell which one, so it stops before rendering anything."""
    before = tree(multi)
    result = run_kit("up", multi / "site.yaml")
    assert result.exit_code == 2
    assert "services[1].nodes[1] (gpu02): kit cannot tell which Docker engine" in result.output
    assert "set services[1].nodes[1].engine" in result.output
    assert tree(multi) == before


def test_the_head_runs_on_host_networking_and_nginx_reaches_it_by_extra_hosts(
        multi: Path) -> None:
    """The engine path applies what the rendered head asks (kit/engine/desired.py → docker_api)."""
    assert run_kit("render", multi / "site.yaml").exit_code == 0
    desired = load_desired(SiteLayout(multi), "test01")
    head = desired.service("big").config
    assert (head.network_mode, head.ipc_mode, head.networks) == ("host", "host", ())
    assert desired.service("nginx").config.extra_hosts == ("big:10.213.0.1",)
    other = desired.service("llama8b").config
    assert other.network_mode is None and other.extra_hosts == ()
    # Unset, the new keys leave the hash as before them (no recreate on upgrade).
    plain = asdict(other)
    del plain["network_mode"], plain["extra_hosts"], plain["addresses"]
    labels = {k: v for k, v in desired.service("llama8b").labels.items()
              if k != CONFIG_HASH_LABEL}
    canonical = json.dumps({"config": plain, "labels": labels,
                            "site_files": desired.service("llama8b").site_files_digest},
                           sort_keys=True, separators=(",", ":"))
    assert desired.service("llama8b").config_hash == hashlib.sha256(canonical.encode()).hexdigest()


def test_with_observability_the_head_is_scraped_through_the_front_door(multi: Path) -> None:
    """The head runs on the host's network, on no compose network: Prometheus reads its
    /metrics through the door's listener, which reaches it as nginx does (extra_hosts)."""
    spec = multi / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "services:\n", "observability: {enabled: true}\nservices:\n"))
    assert run_kit("render", spec).exit_code == 0
    conf = (multi / "nginx" / "nginx.conf").read_text()
    assert ("location = /kit-scrape/big {\n            proxy_pass http://kit_big/metrics;"
            in conf)
    prometheus = yaml.safe_load(
        (multi / "observability" / "prometheus" / "prometheus.yml").read_text())
    vllm = next(job for job in prometheus["scrape_configs"] if job["job_name"] == "vllm")
    assert {c["labels"]["__metrics_path__"] for c in vllm["static_configs"]} == {
        "/kit-scrape/llama8b", "/kit-scrape/big"}
    if nginx_ns.available() is None:
        checked = nginx_ns.nginx_t(multi / "nginx", ["llama8b", "big"])
        assert checked.returncode == 0, checked.stderr
