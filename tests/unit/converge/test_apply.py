"""The executor against the fake engine: actions run in the plan's order, and a stack it built
observes as converged (an empty plan)."""

import inspect
from pathlib import Path

import pytest

from kit.converge.reconcile import up_actions
from kit.engine.docker_api import Engine
from kit.engine.observe import observe, read_proxy_loaded
from kit.errors import KitError
from kit.plan.build import NGINX_TEST
from tests.support.fake_engine import FakeEngine
from tests.support.fake_stack import IMAGES, converge, desired_state, stack_folder


def changes(engine: FakeEngine) -> list[tuple[str, str]]:
    """The calls that change something, in order (reads left out)."""
    reads = {"containers", "inspect", "networks", "volumes", "image_id", "processes", "log_since"}
    return [(method, about) for method, about in engine.calls if method not in reads]


def test_from_nothing_the_engine_is_asked_in_the_plans_order(tmp_path: Path) -> None:
    site = stack_folder(tmp_path)
    engine, desired = FakeEngine(IMAGES), desired_state(site)
    applied = site / ".kit" / "applied.json"
    converge(engine, desired, applied)
    ids = {name: engine.inspect(name)["Id"] for name in ("p-a-1", "p-b-1", "p-nginx-1")}
    assert changes(engine) == [
        ("create_network", "p_backend"), ("create_network", "p_frontend"),
        ("create_volume", "p_cache"),
        ("create_container", "p-a-1"), ("start", ids["p-a-1"]),
        ("create_container", "p-b-1"), ("start", ids["p-b-1"]),
        ("create_container", "p-nginx-1"), ("start", ids["p-nginx-1"]),
    ]
    # the proxy started after both backends were waited for (healthy)
    assert engine.inspect("p-a-1")["State"]["Health"]["Status"] == "healthy"
    assert read_proxy_loaded(applied).container_id == ids["p-nginx-1"]
    engine.set_health("p-nginx-1", "healthy")
    observed = observe(engine, desired.project, tuple(IMAGES), applied)
    assert up_actions(desired, observed) == []


def test_a_changed_backend_is_recreated_and_the_proxy_reloaded_not_restarted(
    tmp_path: Path,
) -> None:
    site = stack_folder(tmp_path)
    engine, applied = FakeEngine(IMAGES), site / ".kit" / "applied.json"
    converge(engine, desired_state(site), applied)
    engine.set_health("p-nginx-1", "healthy")
    old_a, nginx = engine.inspect("p-a-1")["Id"], engine.inspect("p-nginx-1")["Id"]
    engine.calls.clear()
    reported = converge(engine, desired_state(site, seqs=16), applied)
    new_a = engine.inspect("p-a-1")["Id"]
    assert [line.split(":")[0] for line in reported] == [
        "recreate container p-a-1", "wait until healthy a", "reload p-nginx-1",
    ]
    assert changes(engine) == [
        ("stop", old_a), ("remove", old_a), ("create_container", "p-a-1"), ("start", new_a),
        ("exec", " ".join(NGINX_TEST)), ("signal", "SIGHUP"),
    ]
    assert engine.inspect("p-nginx-1")["Id"] == nginx


def test_a_service_added_then_removed_keeps_the_proxy_container(tmp_path: Path) -> None:
    """Each service on its own network: the proxy is connected to a new one and disconnected
    from a removed one in place (the engine refuses to remove a network still in use)."""
    site = stack_folder(tmp_path)
    engine, applied = FakeEngine(IMAGES), site / ".kit" / "applied.json"
    converge(engine, desired_state(site, own_networks=True), applied)
    engine.set_health("p-nginx-1", "healthy")
    nginx = engine.inspect("p-nginx-1")["Id"]
    more = desired_state(site, backends=("a", "b", "c"), own_networks=True)
    converge(engine, more, applied)
    engine.set_health("p-nginx-1", "healthy")
    assert engine.inspect("p-nginx-1")["Id"] == nginx
    assert set(engine.inspect("p-nginx-1")["NetworkSettings"]["Networks"]) == {
        "p_backend", "p_backend-a", "p_backend-b", "p_backend-c", "p_frontend"}
    assert up_actions(more, observe(engine, "p", tuple(IMAGES), applied)) == []
    fewer = desired_state(site, backends=("a",), own_networks=True)
    converge(engine, fewer, applied)
    assert engine.inspect("p-nginx-1")["Id"] == nginx
    assert set(engine.inspect("p-nginx-1")["NetworkSettings"]["Networks"]) == {
        "p_backend", "p_backend-a", "p_frontend"}
    assert {n["Name"] for n in engine.networks([])} == {"p_backend", "p_backend-a", "p_frontend"}
    assert up_actions(fewer, observe(engine, "p", tuple(IMAGES), applied)) == []


def test_a_failed_step_stops_the_run_there(tmp_path: Path) -> None:
    site = stack_folder(tmp_path)
    engine = FakeEngine(IMAGES)
    engine.fail("start", KitError("Docker engine: starting container failed: no space"))
    with pytest.raises(KitError, match="no space"):
        converge(engine, desired_state(site), site / ".kit" / "applied.json")
    assert changes(engine)[-2:] == [("create_container", "p-a-1"), ("start", engine.inspect(
        "p-a-1")["Id"])]
    assert engine.names() == ["p-a-1"]  # nothing after the failed start was attempted


def test_the_fake_engine_has_the_real_engines_interface() -> None:
    """Same public methods with the same parameters: the fake cannot drift from the seam."""
    def interface(cls: type) -> dict[str, list[str]]:
        return {
            name: list(inspect.signature(member).parameters) if callable(member) else []
            for name, member in vars(cls).items() if not name.startswith("_")
        }

    assert interface(FakeEngine).items() >= interface(Engine).items()
    # knock: kit/engine/door_ports.py; archive: kit/usage; save_image, load_images: kit bundle;
    # connect_network, disconnect_network: the front door rewired to a service added or removed;
    # host_cpus: kit up's check of the spec's declared cores
    assert len(interface(Engine)) == 34
