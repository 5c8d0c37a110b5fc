"""Prometheus's API asks for credentials whatever the network lets through: the rendered web
config (checked by the real promtool), the secret's files and modes, who is handed it
(Prometheus's healthcheck, kit status's queries, Grafana's data source) and that it appears in
no file anyone may read."""

import os
import stat
import subprocess
from pathlib import Path

import bcrypt
import yaml

from kit.credentials.material import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_USER
from kit.engine.desired import GRAFANA_SERVICE, PROMETHEUS_SERVICE, load_desired
from kit.engine.envfile import parse_env_file
from kit.layout import SiteLayout
from kit.views.live_figures import api_argv
from tests.support.cli import run_kit
from tests.support.sites import enable

SECRET_FILES = (".kit/prometheus.password", "compose/prometheus-auth.env")


def secret(site: Path) -> str:
    return (site / ".kit" / "prometheus.password").read_text().strip()


def web_hash(site: Path) -> str:
    config = yaml.safe_load((site / "observability/prometheus/web.yml").read_text())
    assert set(config) == {"basic_auth_users"}
    assert list(config["basic_auth_users"]) == [PROMETHEUS_USER]
    return config["basic_auth_users"][PROMETHEUS_USER]


def rendered(site: Path) -> Path:
    result = run_kit("render", enable(site))
    assert result.exit_code == 0, result.output
    return site


def test_the_web_config_holds_the_secret_s_hash_only(site: Path, promtool: str) -> None:
    site = rendered(site)
    password = secret(site)
    assert len(password) >= 24
    hashed = web_hash(site)
    assert bcrypt.checkpw(password.encode(), hashed.encode())
    assert password not in (site / "observability/prometheus/web.yml").read_text()
    check = subprocess.run([promtool, "check", "web-config",
                            str(site / "observability/prometheus/web.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS" in check.stdout + check.stderr, (
        check.stdout + check.stderr)


def test_promtool_refuses_a_web_config_without_a_hash(site: Path, promtool: str,
                                                      tmp_path: Path) -> None:
    """The check above can fail: a plain password where the hash belongs is refused."""
    broken = tmp_path / "web.yml"
    broken.write_text(f"basic_auth_users:\n  {PROMETHEUS_USER}: not-a-hash\n")
    check = subprocess.run([promtool, "check", "web-config", str(broken)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode != 0


def test_the_secret_is_0600_and_in_no_file_anyone_may_read(site: Path) -> None:
    site = rendered(site)
    password = secret(site)
    for name in SECRET_FILES:
        assert stat.S_IMODE((site / name).stat().st_mode) == 0o600, name
    env, bad_line = parse_env_file((site / "compose/prometheus-auth.env").read_text())
    assert bad_line is None and env == {PROMETHEUS_PASSWORD_ENV: password}
    web = (site / "observability/prometheus/web.yml").stat()
    if os.geteuid() == 0:  # Prometheus runs as nobody:nogroup and reads it
        assert (stat.S_IMODE(web.st_mode), web.st_gid) == (0o640, 65534)
    else:
        assert stat.S_IMODE(web.st_mode) == 0o644
    holders = {str(path.relative_to(site)) for path in site.rglob("*")
               if path.is_file() and password in path.read_text(errors="replace")}
    assert holders == set(SECRET_FILES)


def test_every_client_is_handed_the_secret_by_its_environment(site: Path) -> None:
    site = rendered(site)
    compose = yaml.safe_load((site / "compose/docker-compose.yml").read_text())
    prometheus, grafana = (compose["services"][name]
                           for name in (PROMETHEUS_SERVICE, GRAFANA_SERVICE))
    assert "--web.config.file=/etc/kit-prometheus/web.yml" in prometheus["command"]
    assert prometheus["env_file"] == grafana["env_file"] == ["prometheus-auth.env"]
    # the healthcheck reads the password from the container's environment ($$: compose's `$`)
    desired = load_desired(SiteLayout(site), "test01")
    health = desired.service(PROMETHEUS_SERVICE).config.healthcheck
    assert health is not None and health.test[0] == "CMD-SHELL"
    assert f'"{PROMETHEUS_USER}:${PROMETHEUS_PASSWORD_ENV}"' in health.test[1]
    assert "/-/ready" in health.test[1]
    for name in (PROMETHEUS_SERVICE, GRAFANA_SERVICE):
        environment = dict(desired.service(name).config.environment)
        assert environment[PROMETHEUS_PASSWORD_ENV] == secret(site), name
    # kit status's queries: the same, nothing secret in kit's own exec request
    argv = api_argv("/api/v1/query", {"query": 'up{job="vllm"}'})
    assert f"${PROMETHEUS_PASSWORD_ENV}" in argv[2] and secret(site) not in argv[2]
    # Grafana's data source: Basic auth, the password expanded from Grafana's environment
    sources = yaml.safe_load(
        (site / "observability/grafana/provisioning/datasources/kit.yml").read_text())
    source = sources["datasources"][0]
    assert (source["basicAuth"], source["basicAuthUser"]) == (True, PROMETHEUS_USER)
    assert source["secureJsonData"] == {"basicAuthPassword": f"${{{PROMETHEUS_PASSWORD_ENV}}}"}
    assert "basicAuthPassword" not in source and "password" not in source


def test_a_second_render_keeps_the_secret_and_a_deleted_one_is_replaced(site: Path) -> None:
    site = rendered(site)
    password, hashed = secret(site), web_hash(site)
    again = run_kit("render", site / "site.yaml")
    assert again.exit_code == 0 and "no change" in again.output, again.output
    assert (secret(site), web_hash(site)) == (password, hashed)
    (site / ".kit" / "prometheus.password").unlink()
    renewed = run_kit("render", site / "site.yaml")
    assert renewed.exit_code == 0, renewed.output
    assert secret(site) != password and web_hash(site) != hashed
    assert bcrypt.checkpw(secret(site).encode(), web_hash(site).encode())
    assert secret(site) in (site / "compose/prometheus-auth.env").read_text()
    assert "prometheus-auth.env" in renewed.output and "web.yml" in renewed.output


def test_a_web_config_edited_to_another_hash_is_put_back(site: Path) -> None:
    """web.yml must match the secret the clients hold: a foreign hash is replaced."""
    site = rendered(site)
    web = site / "observability/prometheus/web.yml"
    foreign = bcrypt.hashpw(b"someone else's", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  {PROMETHEUS_USER}: '{foreign}'\n")
    assert run_kit("render", site / "site.yaml").exit_code == 0
    assert bcrypt.checkpw(secret(site).encode(), web_hash(site).encode())


def test_the_in_container_get_passes_the_secret_whole_to_wget_or_curl(tmp_path: Path) -> None:
    """kit status's query, run by a shell as in the container: the password from the
    environment reaches wget's URL (busybox) or curl's -u (when wget fails) whole, and the
    query stays one URL-encoded argument."""
    log = tmp_path / "argv"
    for tool, code in (("wget", 1), ("curl", 0)):
        fake = tmp_path / tool
        fake.write_text(f'#!/bin/sh\nprintf "{tool}" >> {log}\n'
                        f'for a in "$@"; do printf " [%s]" "$a" >> {log}; done\n'
                        f'echo >> {log}\nexit {code}\n')
        fake.chmod(0o755)
    password = "a-B_9" * 5
    argv = api_argv("/api/v1/query", {"query": 'up{job="vllm"} == 0'})
    subprocess.run(argv, env={"PATH": f"{tmp_path}:/usr/bin:/bin",
                              PROMETHEUS_PASSWORD_ENV: password}, check=True, timeout=30)
    url = "127.0.0.1:9090/api/v1/query?query=up%7Bjob%3D%22vllm%22%7D+%3D%3D+0"
    assert log.read_text().splitlines() == [
        f"wget [-q] [-O] [-] [http://kit:{password}@{url}]",
        f"curl [-fsS] [-o] [-] [-u] [kit:{password}] [http://{url}]",
    ]
