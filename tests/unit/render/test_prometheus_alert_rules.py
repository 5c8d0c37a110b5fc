"""The rendered alert rules run by Prometheus's own rule engine (`promtool test rules`, Debian's
3.5 build as the test image's): each alert fires on the series that mean trouble, at the time
its `for:` says, and not on the healthy ones."""

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.cli import run_kit
from tests.support.sites import enable

# observability with idle_sleep off: the usage ledger (on by default) and the replicas' rules
SPEC = "observability: {enabled: true, scrape_interval: 5, replica_down_after: 20}\n"


@pytest.fixture
def rules(site: Path) -> Path:
    result = run_kit("render", enable(site, SPEC))
    assert result.exit_code == 0, result.output
    return site / "observability" / "prometheus" / "rules.yml"


def run_tests(promtool: str, rules: Path, tests: list[dict], tmp_path: Path) -> str:
    """`promtool test rules` of `tests` against the rendered rules file; its output."""
    file = tmp_path / "tests.yml"
    file.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "5s",
                                    "tests": tests}))
    result = subprocess.run([promtool, "test", "rules", str(file)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def firing(alert: str, at: str, alerts: list[dict]) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": alerts}


def ledger_series(**values: str) -> list[dict]:
    """The usage ledger's collector's series (metric name → promtool's values notation)."""
    usage = 'job="usage",instance="usage-ledger"'
    return [{"series": f"{name}{{{usage}}}", "values": value} for name, value in values.items()]


def ledger_alert(summary: str) -> dict:
    """A critical alert of the usage ledger's collector with its summary."""
    return {"exp_labels": {"severity": "critical", "job": "usage", "instance": "usage-ledger"},
            "exp_annotations": {"summary": summary}}


def test_a_stopped_replica_fires_after_replica_down_after(rules: Path, promtool: str,
                                                          tmp_path: Path) -> None:
    labels = 'job="vllm",service="llama8b",replica="0",instance="llama8b"'
    run_tests(promtool, rules, [{
        "interval": "5s",
        "input_series": [{"series": f"up{{{labels}}}", "values": "1 1 0x10"}],
        "alert_rule_test": [
            firing("KitReplicaDown", "25s", []),  # down 15 s: within replica_down_after (20 s)
            firing("KitReplicaDown", "35s", [{
                "exp_labels": {"severity": "critical", "job": "vllm", "service": "llama8b",
                               "replica": "0", "instance": "llama8b"},
                "exp_annotations": {"summary": "llama8b replica 0 does not answer /metrics"}}]),
        ],
    }], tmp_path)


def test_the_usage_ledger_not_recording(rules: Path, promtool: str, tmp_path: Path) -> None:
    """The collector stopped (its scrape fails), or running but behind the door by more than
    two minutes for a minute, or its disk full: each its own alert."""
    run_tests(promtool, rules, [{
        "interval": "5s",
        "input_series": ledger_series(up="1 1 1 0x10", kit_usage_lag_seconds="0 3 130x20",
                                      kit_usage_disk_full="0 0 0 1"),
        "alert_rule_test": [
            firing("KitUsageCollectorDown", "20s", []),
            firing("KitUsageCollectorDown", "40s", [ledger_alert(
                "the usage ledger's collector does not answer: requests wait in the spool "
                "unrecorded (kit status, kit logs usage-ledger)")]),
            firing("KitUsageNotRecording", "40s", []),  # behind for 30 s: not yet
            firing("KitUsageNotRecording", "75s", [ledger_alert(
                "the usage ledger is 2m 10s behind the door (kit status shows why)")]),
            firing("KitUsageDiskFull", "10s", []),
            firing("KitUsageDiskFull", "15s", [ledger_alert(
                "the usage ledger's disk is full: records wait in the spool; free space or "
                "lower usage.retention_days")]),
        ],
    }], tmp_path)


def test_a_healthy_ledger_fires_nothing(rules: Path, promtool: str, tmp_path: Path) -> None:
    run_tests(promtool, rules, [{
        "interval": "5s",
        "input_series": ledger_series(up="1x40", kit_usage_lag_seconds="0 3 1 0x40",
                                      kit_usage_disk_full="0x40",
                                      kit_usage_credential_requests_pruned_total="0x40"),
        "alert_rule_test": [firing(name, "200s", []) for name in (
            "KitUsageCollectorDown", "KitUsageNotRecording", "KitUsageDiskFull",
            "KitUsagePrunedForSpace")],
    }], tmp_path)


def test_the_rule_test_can_fail(rules: Path, promtool: str, tmp_path: Path) -> None:
    """promtool fails a test whose expected alert does not come: these tests can fail."""
    file = tmp_path / "tests.yml"
    file.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "5s",
                                    "tests": [{"interval": "5s", "input_series": [
                                        {"series": 'up{job="usage"}', "values": "1x20"}],
                                        "alert_rule_test": [firing(
                                            "KitUsageCollectorDown", "60s",
                                            [{"exp_labels": {"severity": "critical",
                                                             "job": "usage"}}])]}]}))
    result = subprocess.run([promtool, "test", "rules", str(file)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0


def test_a_budget_crossing_80_and_100_percent(rules: Path, promtool: str,
                                             tmp_path: Path) -> None:
    """The door's share of a credential's window: 80 % warns, 100 % says it is spent; twenty
    credentials crossing at once are twenty alerts of one name (Alertmanager groups them)."""
    state = 'job="front-door-state",instance="door"'
    crossing = [{"series": f'kit_budget_used_ratio{{{state},credential="key:c{n}",window="day"}}',
                 "values": "0.5 0.85 1 1"} for n in range(20)]
    run_tests(promtool, rules, [{
        "interval": "5s",
        "input_series": crossing,
        "alert_rule_test": [
            firing("KitBudgetNearlySpent", "0s", []),
            firing("KitBudgetNearlySpent", "5s", [
                {"exp_labels": {"severity": "warning", "job": "front-door-state",
                                "instance": "door", "credential": f"key:c{n}", "window": "day"},
                 "exp_annotations": {"summary": f"key:c{n} used 85% of its day token budget "
                                     "(kit usage shows its requests)"}} for n in range(20)]),
            firing("KitBudgetSpent", "5s", []),
            firing("KitBudgetNearlySpent", "10s", []),  # spent: the 80 % one has resolved
            firing("KitBudgetSpent", "10s", [
                {"exp_labels": {"severity": "warning", "job": "front-door-state",
                                "instance": "door", "credential": f"key:c{n}", "window": "day"},
                 "exp_annotations": {"summary": f"key:c{n} used 100% of its day token budget: "
                                     "its requests get 429 until the window resets"}}
                for n in range(20)]),
        ],
    }], tmp_path)


def test_a_certificate_set_to_expire(rules: Path, promtool: str, tmp_path: Path) -> None:
    """promtool's clock starts at 0: a certificate ending at 15 days is fine, at 14 days it
    fires (self-signed: the fix is a new certificate)."""
    state = 'job="front-door-state",instance="door"'
    day = 86400
    run_tests(promtool, rules, [{
        "interval": "5s",
        "input_series": [
            {"series": f"kit_tls_certificate_not_after_seconds{{{state}}}",
             "values": f"{15 * day}x2 {14 * day}x2"}],
        "alert_rule_test": [
            firing("KitCertificateExpiresSoon", "5s", []),
            firing("KitCertificateExpiresSoon", "15s", [{
                "exp_labels": {"severity": "critical", "job": "front-door-state",
                               "instance": "door"},
                "exp_annotations": {"summary": "the front door's certificate ends in 14.0 days: "
                                    "install a new one (tls.cert, kit up)"}}]),
        ],
    }], tmp_path)


def test_a_replica_out_of_rotation_for_15_minutes(rules: Path, promtool: str,
                                                  tmp_path: Path) -> None:
    state = 'job="front-door-state",instance="door"'
    labels = f'{state},service="llama8b",host="llama8b-1"'
    run_tests(promtool, rules, [{
        "interval": "1m",
        "input_series": [{"series": f"kit_door_replica_in_rotation{{{labels}}}",
                          "values": "1 0x20"}],
        "alert_rule_test": [
            firing("KitReplicaOutOfRotation", "10m", []),  # a rollout's replacement, maybe
            firing("KitReplicaOutOfRotation", "17m", [{
                "exp_labels": {"severity": "warning", "job": "front-door-state",
                               "instance": "door", "service": "llama8b", "host": "llama8b-1"},
                "exp_annotations": {"summary": "llama8b: llama8b-1 is out of the front door's "
                                    "server list (a rolling update that stopped): kit up puts "
                                    "it back"}}]),
        ],
    }], tmp_path)


def test_acme_renewal_failing_for_15_minutes(site: Path, promtool: str, tmp_path: Path) -> None:
    spec = enable(site, SPEC)
    spec.write_text(spec.read_text().replace("tls: {mode: self-signed}",
                                             "tls: {mode: acme, email: ops@example.com}"))
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    rules = site / "observability" / "prometheus" / "rules.yml"
    state = 'job="front-door-state",instance="door"'
    day = 86400
    run_tests(promtool, rules, [{
        "interval": "1m",
        "input_series": [
            {"series": f"kit_acme_last_run_exit_code{{{state}}}", "values": "0 1x20"},
            {"series": f"kit_tls_certificate_not_after_seconds{{{state}}}",
             "values": f"{13 * day}x20"}],
        "alert_rule_test": [
            firing("KitAcmeRenewalFailing", "10m", []),
            firing("KitAcmeRenewalFailing", "17m", [{
                "exp_labels": {"severity": "critical", "job": "front-door-state",
                               "instance": "door"},
                "exp_annotations": {"summary": "certbot's runs keep failing (exit 1): kit status "
                                    "names the cause"}}]),
            firing("KitCertificateExpiresSoon", "1m", [{
                "exp_labels": {"severity": "critical", "job": "front-door-state",
                               "instance": "door"},
                "exp_annotations": {"summary": "the front door's certificate ends in 13.0 days: "
                                    "certbot has not renewed it (kit status shows its last "
                                    "run)"}}]),
        ],
    }], tmp_path)
