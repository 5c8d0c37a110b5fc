"""The front door's reload against the fake engine: `nginx -t` before any signal, and a reload
nginx did not apply is an error that leaves the record of what it loaded untouched."""

from pathlib import Path

import pytest

from kit.engine.observe import read_proxy_loaded
from kit.errors import KitError
from kit.front_door.reload import reload, running_proxy
from kit.plan.build import NGINX_TEST
from tests.support.fake_engine import FakeEngine
from tests.support.fake_stack import IMAGES, converge, desired_state, stack_folder


def reload_site(tmp_path: Path) -> tuple[FakeEngine, Path, dict]:
    """The stack on the fake; what kit recorded of the proxy; (service, container) to reload."""
    site = stack_folder(tmp_path)
    engine, desired = FakeEngine(IMAGES), desired_state(site)
    applied = site / ".kit" / "applied.json"
    converge(engine, desired, applied)
    (site / "nginx" / "nginx.conf").write_text("events { worker_connections 64; }\n")
    target = {"service": desired_state(site).service("nginx"),
              "container": running_proxy(engine, "p")}
    engine.calls.clear()
    return engine, applied, target


def test_a_config_nginx_rejects_is_never_signalled(tmp_path: Path) -> None:
    engine, applied, target = reload_site(tmp_path)
    recorded = read_proxy_loaded(applied)
    engine.exec_results[tuple(NGINX_TEST)] = [(1, 'nginx: [emerg] unknown directive "x"')]
    with pytest.raises(KitError, match="(?s)p-nginx-1 rejected the new config.*unknown directive"):
        reload(engine, applied=applied, **target)
    assert [method for method, _ in engine.calls] == ["exec"]
    assert read_proxy_loaded(applied) == recorded


def test_a_reload_nginx_did_not_apply_is_reported_with_its_log(tmp_path: Path) -> None:
    engine, applied, target = reload_site(tmp_path)
    recorded = read_proxy_loaded(applied)
    engine.reload_errors.append("[emerg] bind() to 0.0.0.0:443 failed (98: in use)")
    with pytest.raises(KitError) as failed:
        reload(engine, applied=applied, **target)
    assert "did not apply the new config and keeps the old one" in failed.value.message
    assert "bind() to 0.0.0.0:443 failed" in failed.value.message
    assert "docker restart p-nginx-1" in failed.value.fix
    assert read_proxy_loaded(applied) == recorded


def test_a_reload_that_took_is_recorded(tmp_path: Path) -> None:
    engine, applied, target = reload_site(tmp_path)
    reload(engine, applied=applied, **target)
    assert read_proxy_loaded(applied).files_digest == target["service"].site_files_digest
    assert [method for method, _ in engine.calls if method in ("exec", "signal")] == [
        "exec", "signal"]


def test_only_a_running_proxy_is_found(tmp_path: Path) -> None:
    engine, _, target = reload_site(tmp_path)
    assert running_proxy(engine, "p") == target["container"]
    engine.stop("p-nginx-1")
    assert running_proxy(engine, "p") is None
    assert running_proxy(engine, "other") is None
