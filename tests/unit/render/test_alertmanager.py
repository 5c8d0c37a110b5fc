"""observability.alerts: Alertmanager rendered from the spec — its config checked by the real
amtool (Debian's 0.33 build, as the test image runs), the receivers' secrets kept out of every
world-readable file, the compose file and the environment, and bad receivers refused."""

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from kit.engine.desired import ALERTMANAGER_SERVICE, PROMETHEUS_SERVICE
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries
from tests.support.sites import enable

WEBHOOK_URL = "https://hooks.example.net/kit/T0KEN-webhook-3f9c"
SLACK_URL = "https://hooks.slack.example/services/T000/B000/SL4CK-s3cret"
SMTP_PASSWORD = "smtp-Pa55word-7d1e"
ALERTS = """\
observability:
  enabled: true
  scrape_interval: 5
  replica_down_after: 20
  alerts:
    group_wait: 10
    group_interval: 60
    repeat_interval: 3600
    receivers:
      - webhook: {url_file: secrets/webhook.url}
      - email:
          to: ops@example.com
          from: kit@example.com
          smtp: {host: smtp.example.com, port: 587, username: kit, password_file: secrets/smtp.pw}
      - slack_webhook_file: secrets/slack.url
"""


def write_secrets(site: Path, mode: int = 0o600) -> None:
    folder = site / "secrets"
    folder.mkdir(exist_ok=True)
    for name, value in (("webhook.url", WEBHOOK_URL + "\n"), ("smtp.pw", SMTP_PASSWORD + "\n"),
                        ("slack.url", SLACK_URL)):
        (folder / name).write_text(value)
        (folder / name).chmod(mode)


@pytest.fixture
def alerted(site: Path) -> Path:
    """The base site with observability and alerts on, its secrets in 0600 files, rendered."""
    write_secrets(site)
    result = run_kit("render", enable(site, ALERTS))
    assert result.exit_code == 0, result.output
    return site


def test_alertmanager_routes_every_alert_grouped_to_each_receiver(alerted: Path) -> None:
    config = yaml.safe_load(
        (alerted / "observability/alertmanager/alertmanager.yml").read_text())
    route = config["route"]
    assert route == {"receiver": "kit", "group_by": ["alertname", "service"],
                     "group_wait": "10s", "group_interval": "60s", "repeat_interval": "3600s"}
    (receiver,) = config["receivers"]
    secrets = "/etc/kit-alertmanager/secrets"
    assert receiver["webhook_configs"] == [
        {"url_file": f"{secrets}/0-webhook.url", "send_resolved": True}]
    assert receiver["email_configs"] == [
        {"to": "ops@example.com", "from": "kit@example.com", "smarthost": "smtp.example.com:587",
         "require_tls": True, "send_resolved": True, "auth_username": "kit",
         "auth_password_file": f"{secrets}/1-smtp.password"}]
    assert receiver["slack_configs"] == [
        {"api_url_file": f"{secrets}/2-slack.url", "send_resolved": True}]


def test_amtool_accepts_the_config(alerted: Path, amtool: str, tmp_path: Path) -> None:
    """Debian's amtool 0.33 (the pinned prom/alertmanager:v0.33.1's version) checks the file,
    its secret files read where the config names them."""
    version = subprocess.run([amtool, "--version"], capture_output=True, text=True, timeout=60)
    assert "version 0.33." in version.stdout + version.stderr
    folder = alerted / "observability" / "alertmanager"
    config = (folder / "alertmanager.yml").read_text().replace(
        "/etc/kit-alertmanager/", f"{folder}/")
    (tmp_path / "alertmanager.yml").write_text(config)
    result = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # and the check can fail: a route to a receiver that does not exist
    (tmp_path / "alertmanager.yml").write_text(config.replace("receiver: kit", "receiver: nobody"))
    result = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_prometheus_posts_to_alertmanager_as_kit(alerted: Path) -> None:
    config = yaml.safe_load((alerted / "observability/prometheus/prometheus.yml").read_text())
    assert config["alerting"] == {"alertmanagers": [{
        "static_configs": [{"targets": ["alertmanager:9093"]}],
        "basic_auth": {"username": "kit",
                       "password_file": "/etc/kit-prometheus/alertmanager.secret"}}]}
    password = (alerted / ".kit" / "prometheus.password").read_text().strip()
    assert (alerted / "observability/prometheus/alertmanager.secret").read_text() == password
    # Alertmanager's API asks for the same account as Prometheus's
    assert (alerted / "observability/alertmanager/web.yml").read_text() == (
        alerted / "observability/prometheus/web.yml").read_text()


def test_compose_networks_and_no_secret_in_it(alerted: Path) -> None:
    compose_text = (alerted / "compose" / "docker-compose.yml").read_text()
    compose = yaml.safe_load(compose_text)
    manager = compose["services"][ALERTMANAGER_SERVICE]
    assert manager["networks"] == ["alerting", "alerts-out"]
    assert "alerting" in compose["services"][PROMETHEUS_SERVICE]["networks"]
    assert compose["networks"]["alerting"] == {"internal": True}
    assert compose["networks"]["alerts-out"] == {}  # the one with a route out
    members = [name for name, body in compose["services"].items()
               if "alerting" in (body.get("networks") or [])]
    assert sorted(members) == [ALERTMANAGER_SERVICE, PROMETHEUS_SERVICE]
    assert "--web.config.file=/etc/kit-alertmanager/web.yml" in manager["command"]
    assert manager["env_file"] == ["prometheus-auth.env"]
    assert "ports" not in manager
    assert {"type": "volume", "source": "alertmanager-data",
            "target": "/alertmanager"} in manager["volumes"]
    for secret in (WEBHOOK_URL, SLACK_URL, SMTP_PASSWORD):
        assert secret not in compose_text


def test_no_secret_in_a_world_readable_file(alerted: Path) -> None:
    """Every file of the site that holds a receiver's secret or kit's Alertmanager password is
    unreadable by others; the secrets' copies are readable by Alertmanager's group alone."""
    password = (alerted / ".kit" / "prometheus.password").read_text().strip()
    holders = []
    for path in alerted.rglob("*"):
        if not path.is_file() or path.is_relative_to(alerted / "secrets"):
            continue
        content = path.read_bytes()
        if any(secret.encode() in content
               for secret in (WEBHOOK_URL, SLACK_URL, SMTP_PASSWORD, password)):
            holders.append(path.relative_to(alerted))
            assert not path.stat().st_mode & 0o007, path
    copies = alerted / "observability/alertmanager/secrets"
    assert sorted(p.name for p in copies.iterdir()) == [
        "0-webhook.url", "1-smtp.password", "2-slack.url"]
    assert (copies / "0-webhook.url").read_text() == WEBHOOK_URL  # the line, no newline
    assert (copies / "1-smtp.password").read_text() == SMTP_PASSWORD
    for copy in copies.iterdir():
        status = copy.stat()
        assert stat.S_IMODE(status.st_mode) == (0o640 if os.geteuid() == 0 else 0o600)
        if os.geteuid() == 0:
            assert status.st_gid == 65534  # Alertmanager's image runs as nobody:nogroup
    assert Path("observability/alertmanager/secrets/0-webhook.url") in holders


def test_off_without_alerts(site: Path) -> None:
    assert run_kit("render", enable(site)).exit_code == 0
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert ALERTMANAGER_SERVICE not in compose["services"]
    assert "alerting" not in compose["networks"]
    assert not (site / "observability" / "alertmanager").exists()
    config = yaml.safe_load((site / "observability/prometheus/prometheus.yml").read_text())
    assert "alerting" not in config


@pytest.mark.parametrize(("mode", "change", "message"), [
    (0o644, None, "readable by others (mode 0644)"),
    (0o600, ("webhook.url", "hooks.example.net/no-scheme"), "does not hold one http(s) URL"),
    (0o600, ("webhook.url", WEBHOOK_URL + "\nhttps://second.example/"), "alone on one line"),
    (0o600, ("smtp.pw", ""), "does not hold the password"),
    (0o600, ("slack.url", None), "cannot read"),
])
def test_a_bad_secret_file_is_refused_naming_it(site: Path, mode: int,
                                                change: tuple[str, str | None] | None,
                                                message: str) -> None:
    write_secrets(site, mode)
    if change is not None:
        name, value = change
        if value is None:
            (site / "secrets" / name).unlink()
        else:
            (site / "secrets" / name).write_text(value)
    result = run_kit("render", enable(site, ALERTS))
    assert result.exit_code == 2, result.output
    assert message in result.output and "observability.alerts.receivers[" in result.output
    assert not (site / "compose").exists()  # nothing written


def test_a_linked_secret_file_is_refused(site: Path, tmp_path: Path) -> None:
    write_secrets(site)
    target = site / "secrets" / "real.url"
    (site / "secrets" / "webhook.url").rename(target)
    (site / "secrets" / "webhook.url").symlink_to(target)
    result = run_kit("render", enable(site, ALERTS))
    assert result.exit_code == 2 and "cannot read" in result.output, result.output


@pytest.mark.parametrize(("alerts", "message"), [
    ("  alerts: {receivers: []}\n", "at least 1 item"),
    ("  alerts: {receivers: [{webhook: {url_file: a}, slack_webhook_file: b}]}\n",
     "a receiver is one of"),
    ("  alerts: {receivers: [{email: {to: ops@example.com, from: kit@example.com, "
     "smtp: {host: smtp.example.com, username: kit}}}]}\n", "go together"),
    ("  alerts: {receivers: [{email: {to: 'a;b', from: kit@example.com, "
     "smtp: {host: smtp.example.com}}}]}\n", "to"),
    ("  alerts: {receivers: [{webhook: {url_file: a}}], repeat_interval: 5}\n",
     "greater than or equal to 60"),
])
def test_bad_alerts_spec_is_refused(site: Path, alerts: str, message: str) -> None:
    extra = "observability:\n  enabled: true\n" + alerts
    result = run_kit("validate", enable(site, extra))
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output


def test_alerts_need_observability(site: Path) -> None:
    extra = "observability:\n  alerts: {receivers: [{webhook: {url_file: a}}]}\n"
    result = run_kit("validate", enable(site, extra))
    assert result.exit_code == 2 and "needs observability.enabled" in result.output


def test_compose_accepts_the_file(alerted: Path) -> None:
    for binary in compose_binaries():
        result = subprocess.run(
            [*binary, "-p", "kit-alerts-test", "-f", "compose/docker-compose.yml", "config",
             "-q"], cwd=alerted, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{binary}: {result.stderr}"
