"""Desired vs observed → plan, without an engine: every decision of kit up/down, as text."""

import io
import socket
from dataclasses import replace
from pathlib import Path

import docker.errors
import pytest
import requests
import yaml

from kit.converge.preflight import check_cpus, check_ports
from kit.converge.reconcile import Action, changes, down_actions, up_actions
from kit.engine.desired import DesiredState, parse_compose
from kit.engine.docker_api import explain, show_pull
from kit.engine.observe import (
    ContainerState,
    NetworkFound,
    ObservedState,
    ProxyLoaded,
    container_state,
    parse_time,
)
from kit.errors import KitError
from kit.plan.build import MODELS_MOUNT, VLLM_ENTRYPOINT
from kit.plan.host import model_below
from kit.spec.load import parse_spec
from kit.spec.model import Spec
from tests.support.fake_engine import FakeEngine
from tests.support.fake_stack import desired_state, rendered
from tests.support.sites import write_site


def describe(plan: list[Action]) -> str:
    """The plan as kit prints it, one action a line."""
    return "\n".join(str(action) for action in plan)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "nginx").mkdir()
    (tmp_path / "nginx" / "nginx.conf").write_text("events {}\n")
    return tmp_path


def running(desired: DesiredState) -> ObservedState:
    """The stack exactly as `desired` says, healthy, with the proxy's config recorded."""
    containers = tuple(
        ContainerState(
            id=f"id-{s.name}", name=s.container_name, service=s.name, number=1,
            config_hash=s.config_hash, state="running", health="healthy", restart_count=0,
            exit_code=0, started_at=None, image=s.config.image, image_id=f"img-{s.config.image}",
            gpu_ids=s.gpu_ids, host_ports=tuple((p.host_ip, p.host_port) for p in s.config.ports),
            depends_on=tuple(dep for dep, _ in s.depends_on), networks=s.config.networks,
        )
        for s in desired.services
    )
    proxy = desired.service("nginx")
    return ObservedState(
        containers=containers,
        networks=tuple(NetworkFound(n.name, n.key, n.internal, (n.subnet or "172.18.0.0/16",))
                       for n in desired.networks),
        volumes=tuple(v.name for v in desired.volumes),
        image_ids={s.config.image: f"img-{s.config.image}" for s in desired.services},
        proxy_loaded=ProxyLoaded("id-nginx", proxy.site_files_digest or ""),
    )


def with_container(observed: ObservedState, service: str, **changed) -> ObservedState:
    containers = tuple(
        replace(c, **changed) if c.service == service else c for c in observed.containers
    )
    return replace(observed, containers=containers)


def test_from_nothing_creates_backends_waits_then_creates_the_proxy(site: Path) -> None:
    empty = ObservedState((), (), (), {}, None)
    assert describe(up_actions(desired_state(site), empty)) == (
        "create network p_backend (new)\n"
        "create network p_frontend (new)\n"
        "create volume p_cache (new)\n"
        "create container p-a-1 (new)\n"
        "create container p-b-1 (new)\n"
        "wait until healthy a, b: nginx depends on them; just started\n"
        "create container p-nginx-1 (new)\n"
        "wait until healthy nginx: just started"
    )


def test_a_service_depending_on_the_proxy_waits_for_it(site: Path) -> None:
    empty = ObservedState((), (), (), {}, None)
    plan = describe(up_actions(desired_state(site, certbot=True), empty)).splitlines()
    assert plan[-3:] == [
        "create container p-nginx-1 (new)",
        "wait until healthy nginx: certbot depends on it; just started",
        "create container p-certbot-1 (new)",
    ]
    down = describe(down_actions(running(desired_state(site, certbot=True)), volumes=False))
    assert down.splitlines()[:2] == [
        "remove container p-certbot-1: kit down",
        "remove container p-nginx-1: kit down",
    ]


def test_an_unchanged_healthy_stack_gives_an_empty_plan(site: Path) -> None:
    desired = desired_state(site)
    assert up_actions(desired, running(desired)) == []


def test_the_rendered_site_unchanged_gives_an_empty_plan(tmp_path: Path) -> None:
    desired = rendered(write_site(tmp_path))
    assert up_actions(desired, running(desired)) == []


ON = """\
create volume unit01_prometheus-data (new)
create volume unit01_grafana-data (new)
reload unit01-nginx-1: its mounted config files changed
create container unit01-prometheus-1 (new)
wait until healthy prometheus: grafana depends on it; just started
create container unit01-grafana-1 (new)
create container unit01-door-figures-1 (new)
wait until healthy grafana, door-figures: just started"""
OFF = """\
remove container unit01-prometheus-1: service no longer in the compose file
remove container unit01-grafana-1: service no longer in the compose file
remove container unit01-door-figures-1: service no longer in the compose file
reload unit01-nginx-1: its mounted config files changed"""


@pytest.mark.parametrize("turn", ["on", "off"])
def test_turning_observability_on_or_off_reloads_the_front_door(tmp_path: Path,
                                                                turn: str) -> None:
    """The front door's container does not depend on observability (metrics network and the
    door-figures volume are always there): the toggle reloads nginx, the streams it carries go
    on, and only Prometheus, Grafana and door-figures come or go (their data volumes stay). No
    replica is touched."""
    spec = write_site(tmp_path)
    plain = spec.read_text()
    with_observability = plain.replace("services:\n", "observability: {enabled: true}\nservices:\n")
    spec.write_text(with_observability if turn == "off" else plain)
    before = rendered(spec)
    spec.write_text(plain if turn == "off" else with_observability)
    plan = describe(up_actions(rendered(spec), running(before)))
    assert plan == (ON if turn == "on" else OFF)


def test_a_new_metrics_subnet_rebuilds_the_network_and_recreates_its_members(
        tmp_path: Path) -> None:
    """The engine cannot change a network's subnet in place: the network is rebuilt, and the
    front door and the usage ledger on it recreated (the one change of observability that cuts
    streams)."""
    spec = write_site(tmp_path)
    before = rendered(spec)
    old = before.networks[-1].subnet
    spec.write_text(spec.read_text().replace(
        "services:\n", "observability: {subnet: 10.89.7.0/28}\nservices:\n"))
    plan = describe(up_actions(rendered(spec), running(before))).splitlines()
    assert plan[:4] == [
        "remove container unit01-nginx-1: its network is recreated",
        "remove container unit01-usage-ledger-1: its network is recreated",
        f"remove network unit01_metrics: subnet {old} -> 10.89.7.0/28",
        f"create network unit01_metrics (subnet {old} -> 10.89.7.0/28)",
    ]
    assert "create container unit01-nginx-1 (network unit01_metrics recreated)" in plan
    assert "create container unit01-usage-ledger-1 (network unit01_metrics recreated)" in plan


def test_one_changed_backend_is_recreated_and_the_proxy_reloaded_after_it(site: Path) -> None:
    observed = running(desired_state(site))
    plan = up_actions(desired_state(site, seqs=16), observed)
    old, new = observed.of("a")[0].config_hash or "", desired_state(site, seqs=16).service("a")
    assert describe(plan) == (
        f"recreate container p-a-1: config changed (hash {old[:12]} -> {new.config_hash[:12]})\n"
        "wait until healthy a: nginx depends on it; just started\n"
        "reload p-nginx-1: re-resolve a (restarted)"
    )


def test_a_vllm_an_older_kit_started_with_model_is_drift_and_recreated(tmp_path: Path) -> None:
    """An older kit rendered `--model X` for the image's own entrypoint: that container's
    config hash is not the positional form's, so kit status shows drift and kit up recreates
    it (the front door re-resolves it); nothing else changes and nothing fails."""
    spec = write_site(tmp_path)
    new = rendered(spec)
    compose_file = spec.parent / "compose" / "docker-compose.yml"
    document = yaml.safe_load(compose_file.read_text())
    for body in document["services"].values():
        if body.get("entrypoint") == list(VLLM_ENTRYPOINT):
            del body["entrypoint"]
            body["command"] = ["--model", *body["command"]]
    old = parse_compose(document, new.project, compose_file.resolve(), spec.parent.resolve())
    vllm = [s for s in new.services if s.config.entrypoint == VLLM_ENTRYPOINT]
    assert [s.name for s in vllm] == ["alpha", "beta"]
    for service in vllm:
        assert model_below(old.service(service.name), MODELS_MOUNT) == "qwen"
        assert model_below(service, MODELS_MOUNT) == "qwen"
    plan = [str(action) for action in changes(up_actions(new, running(old)))]
    recreated = [line.split(":")[0] for line in plan if line.startswith("recreate")]
    assert recreated == [f"recreate container {s.container_name}" for s in vllm]
    assert all("config changed" in line for line in plan if line.startswith("recreate"))
    assert [line for line in plan if not line.startswith("recreate")] == [
        "reload unit01-nginx-1: re-resolve alpha, beta (restarted)"]


def test_a_proxy_config_change_is_a_reload_not_a_recreate(site: Path) -> None:
    observed = running(desired_state(site))
    (site / "nginx" / "nginx.conf").write_text("events { worker_connections 512; }\n")
    assert describe(up_actions(desired_state(site), observed)) == (
        "reload p-nginx-1: its mounted config files changed"
    )


def test_a_proxy_whose_loaded_config_is_not_recorded_is_reloaded(site: Path) -> None:
    desired = desired_state(site)
    observed = replace(running(desired), proxy_loaded=ProxyLoaded("id-other", "x"))
    assert describe(up_actions(desired, observed)) == (
        "reload p-nginx-1: kit has no record of the config it loaded (a reload makes sure)"
    )


def test_a_removed_service_is_removed_and_the_rest_kept(site: Path) -> None:
    observed = running(desired_state(site))
    plan = up_actions(desired_state(site, backends=("a",)), observed)
    assert describe(plan).splitlines()[0] == (
        "remove container p-b-1: service no longer in the compose file"
    )
    assert not any("p-a-1" in line for line in describe(plan).splitlines())


def test_a_service_added_rewires_and_reloads_the_proxy_without_recreating_it(
        site: Path) -> None:
    """Each service on its own network: the proxy's networks are not in its config hash; kit
    connects it to the new service's network in place, then reloads it."""
    observed = running(desired_state(site, own_networks=True))
    plan = up_actions(desired_state(site, backends=("a", "b", "c"), own_networks=True), observed)
    assert describe(plan) == (
        "create network p_backend-c (new)\n"
        "create container p-c-1 (new)\n"
        "rewire p-nginx-1: connect p_backend-c\n"
        "wait until healthy c: nginx depends on it; just started\n"
        "reload p-nginx-1: re-resolve c (restarted)"
    )


def test_a_service_removed_disconnects_the_proxy_before_its_network_goes(site: Path) -> None:
    observed = running(desired_state(site, own_networks=True))
    plan = describe(up_actions(desired_state(site, backends=("a",), own_networks=True),
                               observed)).splitlines()
    assert plan == [
        "remove container p-b-1: service no longer in the compose file",
        "rewire p-nginx-1: disconnect p_backend-b",
        "remove network p_backend-b: no longer in the compose file",
    ]


def test_an_exited_backend_is_started_and_waited_for(site: Path) -> None:
    desired = desired_state(site)
    observed = with_container(running(desired), "b", state="exited", exit_code=1, health=None)
    assert describe(up_actions(desired, observed)) == (
        "start container p-b-1: exited (exit code 1)\n"
        "wait until healthy b: nginx depends on it; just started\n"
        "reload p-nginx-1: re-resolve b (restarted)"
    )


def test_an_unhealthy_but_unchanged_backend_is_waited_for_without_changes(site: Path) -> None:
    desired = desired_state(site)
    observed = with_container(running(desired), "a", health="starting")
    plan = up_actions(desired, observed)
    assert describe(plan) == "wait until healthy a: health starting"
    assert changes(plan) == []


def test_an_updated_image_recreates_its_containers(site: Path) -> None:
    desired = desired_state(site)
    observed = replace(running(desired), image_ids={"vllm:1": "img-new", "nginx:1": "img-nginx:1"})
    lines = describe(up_actions(desired, observed)).splitlines()
    assert lines[:2] == [
        "recreate container p-a-1: image vllm:1 was updated",
        "recreate container p-b-1: image vllm:1 was updated",
    ]


def test_extra_containers_of_a_service_are_removed(site: Path) -> None:
    desired = desired_state(site)
    observed = running(desired)
    extra = replace(observed.of("a")[0], id="id-a2", name="p_a_2", number=2)
    observed = replace(observed, containers=(*observed.containers, extra))
    assert describe(up_actions(desired, observed)) == "remove container p_a_2: extra container of a"


def test_a_network_whose_config_changed_is_recreated_with_its_containers(site: Path) -> None:
    observed = running(desired_state(site))
    plan = up_actions(desired_state(site, internal=False), observed)
    assert describe(plan) == (
        "remove container p-a-1: its network is recreated\n"
        "remove container p-b-1: its network is recreated\n"
        "remove container p-nginx-1: its network is recreated\n"
        "remove network p_backend: internal true -> false\n"
        "create network p_backend (internal true -> false)\n"
        "create container p-a-1 (network p_backend recreated)\n"
        "create container p-b-1 (network p_backend recreated)\n"
        "wait until healthy a, b: nginx depends on them; just started\n"
        "create container p-nginx-1 (network p_backend recreated)\n"
        "wait until healthy nginx: just started"
    )


def test_down_removes_dependents_first_then_networks_and_volumes_only_when_asked(
    site: Path,
) -> None:
    observed = running(desired_state(site))
    assert describe(down_actions(observed, volumes=False)) == (
        "remove container p-nginx-1: kit down\n"
        "remove container p-a-1: kit down\n"
        "remove container p-b-1: kit down\n"
        "remove network p_backend: kit down\n"
        "remove network p_frontend: kit down"
    )
    assert describe(down_actions(observed, volumes=True)).endswith(
        "remove volume p_cache: kit down --volumes"
    )


INSPECT = {
    "Id": "c" * 64,
    "Name": "/p-a-1",
    "Image": "sha256:abc",
    "RestartCount": 2,
    "Config": {
        "Image": "vllm:1",
        "Labels": {"com.docker.compose.service": "a", "com.docker.compose.container-number": "1",
                   "com.docker.compose.config-hash": "f00",
                   "com.docker.compose.depends_on": "b:service_healthy:false,c::false"},
    },
    "State": {"Status": "running", "ExitCode": 0, "StartedAt": "2026-11-29T19:13:08.123456789Z",
              "Health": {"Status": "starting"}},
    "HostConfig": {
        "DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["1", "2"]}],
        "PortBindings": {"443/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8443"}]},
    },
}


def test_inspect_data_becomes_container_state() -> None:
    state = container_state(INSPECT)
    assert (state.name, state.service, state.number, state.config_hash) == ("p-a-1", "a", 1, "f00")
    assert (state.state, state.health, state.restart_count) == ("running", "starting", 2)
    assert state.gpu_ids == ("1", "2")
    assert state.depends_on == ("b", "c")
    assert state.host_ports == (("127.0.0.1", 8443),)
    assert state.started_at == parse_time("2026-11-29T19:13:08.123456Z")
    assert parse_time("0001-01-01T00:00:00Z") is None


# --------------------------------------------------------------------------- preflight, engine


def spec_with_ports(https: int, http: int) -> Spec:
    return parse_spec(
        "site: p\ndomain: llm.test\nmodels_root: /nonexistent\n"
        f"proxy: {{bind: 127.0.0.1, https_port: {https}, http_port: {http}}}\n"
        "services: [{name: a, model: m, gpus: [0]}]\n",
        Path("site.yaml"),
    )


def test_a_port_held_elsewhere_is_named_with_its_spec_key(site: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # a port the OS picks: held here, published by nginx
        holder.listen()
        port = holder.getsockname()[1]
        desired = desired_state(site, https_port=port)  # nginx publishes 127.0.0.1:port
        elsewhere = FakeEngine()
        elsewhere.other_publishers[port] = ["other-nginx-1"]
        with pytest.raises(KitError) as raised:
            check_ports(elsewhere, spec_with_ports(port, 8080),
                        [desired.service("nginx")], ObservedState((), (), (), {}, None))
        assert str(raised.value) == (
            f"127.0.0.1:{port} (proxy.https_port) is already in use by container other-nginx-1\n"
            "  fix: stop container other-nginx-1, or set proxy.https_port in the spec to a "
            "free port"
        )
        # the port the proxy's own running container holds is freed when it is replaced
        check_ports(FakeEngine(), spec_with_ports(port, 8080), [desired.service("nginx")],
                    running(desired))


def test_more_cores_declared_than_the_engines_host_has_is_refused_before_anything_starts() -> None:
    def spec(cpus: str) -> Spec:
        return parse_spec("site: p\ndomain: llm.test\nmodels_root: /nonexistent\n" + cpus
                          + "services: [{name: a, model: m, gpus: [0]}]\n", Path("site.yaml"))

    engine = FakeEngine()
    engine.cpus = 8
    with pytest.raises(KitError) as raised:
        check_cpus(engine, spec("cpus: 16\n"))
    assert raised.value.exit_code == 2
    assert str(raised.value) == (
        "cpus: 16 in the spec, but the engine's host (unix:///fake.sock) has 8 CPUs\n"
        "  fix: write cpus: 8 (what nproc counts there), or remove cpus: so every service runs "
        "one API-server process")
    check_cpus(engine, spec("cpus: 8\n"))  # the host's own count passes
    asked = len(engine.calls)
    check_cpus(engine, spec(""))  # nothing declared: the engine is not even asked
    assert len(engine.calls) == asked


@pytest.mark.parametrize(
    ("explanation", "cause", "fix"),
    [
        ('could not select device driver "nvidia" with capabilities: [[gpu]]',
         "has no NVIDIA runtime", "install nvidia-container-toolkit"),
        ("nvidia-container-cli: device error: 3: unknown device: unknown",
         "GPU index the spec requests does not exist", "nvidia-smi -L"),
        ("driver failed programming external connectivity: port is already allocated",
         "published port is already in use", "proxy.https_port"),
    ],
)
def test_engine_refusals_become_cause_and_fix(explanation: str, cause: str, fix: str) -> None:
    error = docker.errors.APIError("500 Server Error", explanation=explanation)
    mapped = explain(error, "starting container p-a-1")
    assert cause in mapped.message and explanation in mapped.message
    assert fix in str(mapped.fix)


def test_an_unreachable_engine_names_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.9:2375")
    mapped = explain(requests.exceptions.ConnectionError("refused"), "connecting")
    assert mapped.message.startswith("cannot reach the Docker engine at tcp://10.0.0.9:2375")
    assert "is dockerd running?" in str(mapped.fix)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_pull_progress_sums_layers_on_one_redrawn_line() -> None:
    events = [
        {"status": "Pulling from vllm/vllm-openai", "id": "v0.33.0"},
        {"status": "Downloading", "id": "l1",
         "progressDetail": {"current": 5_000_000, "total": 10_000_000}},
        {"status": "Downloading", "id": "l2",
         "progressDetail": {"current": 1_000_000, "total": 30_000_000}},
        {"status": "Downloading", "id": "l1",
         "progressDetail": {"current": 10_000_000, "total": 10_000_000}},
        {"status": "Pull complete", "id": "l1"},
    ]
    shown = Terminal()
    show_pull("vllm/vllm-openai:v0.33.0", iter(events), shown)
    frames = shown.getvalue().split("\r\x1b[2K")
    assert len(frames) == 1 + len(events)  # one redraw per event, nothing scrolls
    assert frames[-1] == "  pulling vllm/vllm-openai:v0.33.0: 1 layer(s) done, 11/40 MB\n"
