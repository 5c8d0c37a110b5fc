"""kit alerts: Alertmanager's amtool run in its container (scripted here: the core uses the
engine's exec alone), its answers read, bad input refused before anything runs."""

import json
from pathlib import Path

import pytest

from kit.errors import BadInput, KitError
from kit.site import Site
from kit.stack.alerts import amtool_argv, expire, list_alerts, running_alertmanager, silence
from tests.support.fake_engine import ExecOnlyEngine

MANAGER = "am1"
SILENCE = "0f9c1c2e-5a61-4d3c-9a4e-0b8f3c2d1e7a"
ALERTS = [{"labels": {"alertname": "KitBudgetSpent", "credential": "key:ci", "window": "day"},
           "annotations": {"summary": "key:ci used 100% of its day token budget"},
           "status": {"state": "suppressed", "silencedBy": [SILENCE]},
           "startsAt": "2026-12-06T20:00:00Z"}]
SILENCES = [{"id": SILENCE, "matchers": [{"name": "alertname", "value": "KitBudgetSpent"}],
             "endsAt": "2026-12-06T22:00:00Z", "status": {"state": "active"},
             "comment": "raising it tomorrow"}]


def scripted() -> ExecOnlyEngine:
    engine = ExecOnlyEngine(MANAGER)
    engine.exec_results[tuple(amtool_argv("-o", "json", "alert", "query", "--silenced",
                                          "--inhibited", "--active"))] = [
        (0, json.dumps(ALERTS))]
    engine.exec_results[tuple(amtool_argv("-o", "json", "silence", "query"))] = [
        (0, json.dumps(SILENCES))]
    return engine


def test_the_alerts_and_silences_are_read() -> None:
    alerts, silences = list_alerts(scripted(), MANAGER)
    (alert,) = alerts
    assert (alert.name, alert.state, alert.labels) == (
        "KitBudgetSpent", "suppressed", {"credential": "key:ci", "window": "day"})
    (held,) = silences
    assert (held.id, held.matchers, held.comment) == (
        SILENCE, "alertname=KitBudgetSpent", "raising it tomorrow")


def test_amtool_runs_as_kit_with_the_container_s_secret() -> None:
    argv = amtool_argv("silence", "expire", SILENCE)
    assert argv[:2] == ["sh", "-c"]
    assert '"http://kit:${KIT_PROMETHEUS_PASSWORD}@127.0.0.1:9093"' in argv[2]  # its env's
    assert argv[2].endswith(f"silence expire {SILENCE}")


def test_a_silence_is_added_with_its_matchers() -> None:
    engine = ExecOnlyEngine(MANAGER)
    argv = amtool_argv("silence", "add", "--duration=2h", "--author=kit",
                       "--comment=GPU swap; back at 18:00", "alertname=KitReplicaDown",
                       "service=llama8b")
    engine.exec_results[tuple(argv)] = [(0, SILENCE + "\n")]
    assert silence(engine, MANAGER, "KitReplicaDown", ("service=llama8b",), "2h",
                   "GPU swap; back at 18:00") == SILENCE


@pytest.mark.parametrize(("alert", "labels", "duration", "comment", "said"), [
    ("KitReplicaDown", ("service",), "2h", "x", "is not NAME=VALUE"),
    ("KitReplicaDown", ("service=a b",), "2h", "x", "is not a label"),
    ("Kit$(reboot)", (), "2h", "x", "is not a label"),
    ("KitReplicaDown", ("1x=a",), "2h", "x", "is not a label"),
    ("KitReplicaDown", (), "2 hours", "x", "is not a duration"),
    ("KitReplicaDown", (), "2h", "line\nbreak", "1 to 500 characters"),
])
def test_bad_input_is_refused_before_amtool_runs(alert: str, labels: tuple[str, ...],
                                                  duration: str, comment: str,
                                                  said: str) -> None:
    engine = ExecOnlyEngine(MANAGER)
    with pytest.raises(BadInput, match=said):
        silence(engine, MANAGER, alert, labels, duration, comment)
    with pytest.raises(BadInput, match="is not a silence id"):
        expire(engine, MANAGER, "abc; rm -rf /")
    assert engine.calls == []


def test_amtool_failing_or_unreadable_is_said() -> None:
    engine = scripted()
    engine.exec_results[tuple(amtool_argv("-o", "json", "silence", "query"))] = [
        (1, "Unauthorized")]
    with pytest.raises(KitError, match=r"amtool silence query failed \(exit 1\): Unauthorized"):
        list_alerts(engine, MANAGER)
    engine = ExecOnlyEngine(MANAGER)
    argv = amtool_argv("silence", "add", "--duration=1h", "--author=kit",
                       "--comment=x", "alertname=KitReplicaDown")
    engine.exec_results[tuple(argv)] = [(0, "no silence")]
    with pytest.raises(KitError, match="added no silence"):
        silence(engine, MANAGER, "KitReplicaDown", (), "1h", "x")


def test_a_site_without_alerts_is_refused(site: Path) -> None:
    engine = ExecOnlyEngine()
    with pytest.raises(BadInput, match="observability.alerts is unset"):
        running_alertmanager(Site.load(site / "site.yaml"), engine)
    assert engine.calls == []
