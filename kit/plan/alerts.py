"""Delivered alerts as planned (docs/observability.md, "Delivered alerts"): Alertmanager beside
Prometheus, its receivers and timings from `observability.alerts`, and the facts (port, mounts,
networks, secret file names) its rendered files, kit status and kit alerts share. The files
themselves: kit/render/alertmanager.py; the receivers' secrets: kit/credentials/receivers.py.

Networks by need: Alertmanager sits on `alerting` (internal) with Prometheus alone, which posts
the firing alerts there, and on `alerts-out`, its own network with a route out, for SMTP and
webhooks. No replica, no front door, no Grafana reaches it; its API asks for kit's account
(the same web config as Prometheus's) whatever the engine forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.spec.model import Receiver, Spec

ALERTMANAGER_PORT = 9093
ALERTMANAGER_MOUNT = "/etc/kit-alertmanager"  # observability/alertmanager/ inside Alertmanager
ALERTMANAGER_DATA = "/alertmanager"  # silences and the notification log (a named volume)
ALERTS_NETWORK = "alerting"  # Prometheus → Alertmanager, internal
ALERTS_OUT_NETWORK = "alerts-out"  # Alertmanager → SMTP servers and webhooks
SECRETS_FOLDER = "secrets"  # in observability/alertmanager/: the receivers' secrets
RECEIVER = "kit"  # Alertmanager's one receiver: every configured destination at once
GROUP_BY = ("alertname", "service")  # 20 credentials crossing a budget: one notification
RESOLVE_TIMEOUT = "5m"


@dataclass(frozen=True)
class SecretFile:
    """A receiver's secret: the operator's file (as the spec names it, relative to the spec)
    and the name of its copy in Alertmanager's secrets folder."""

    key: str  # the spec key, for errors (observability.alerts.receivers[0].webhook.url_file)
    source: Path
    name: str  # file name under secrets/
    url: bool  # an http(s) URL (webhooks, Slack) rather than a password


@dataclass(frozen=True)
class EmailPlan:
    to: str
    sender: str
    smarthost: str  # host:port ([v6]:port)
    username: str | None
    password: SecretFile | None
    require_tls: bool


@dataclass(frozen=True)
class AlertsPlan:
    image: str
    group_wait: int  # seconds
    group_interval: int
    repeat_interval: int
    webhooks: tuple[SecretFile, ...]
    emails: tuple[EmailPlan, ...]
    slack: tuple[SecretFile, ...]

    @property
    def secrets(self) -> tuple[SecretFile, ...]:
        passwords = tuple(email.password for email in self.emails if email.password is not None)
        return self.webhooks + passwords + self.slack


def alerts_plan(spec: Spec) -> AlertsPlan | None:
    """What `observability.alerts` asks for, None when unset (no Alertmanager is rendered)."""
    alerts = spec.observability.alerts
    if alerts is None or not spec.observability.enabled:
        return None
    webhooks, emails, slack = [], [], []
    for index, receiver in enumerate(alerts.receivers):
        key = f"observability.alerts.receivers[{index}]"
        if receiver.webhook is not None:
            webhooks.append(SecretFile(f"{key}.webhook.url_file", receiver.webhook.url_file,
                                       f"{index}-webhook.url", url=True))
        elif receiver.slack_webhook_file is not None:
            slack.append(SecretFile(f"{key}.slack_webhook_file", receiver.slack_webhook_file,
                                    f"{index}-slack.url", url=True))
        else:
            emails.append(_email(receiver, index, key))
    return AlertsPlan(
        image=spec.images.alertmanager,
        group_wait=alerts.group_wait,
        group_interval=alerts.group_interval,
        repeat_interval=alerts.repeat_interval,
        webhooks=tuple(webhooks),
        emails=tuple(emails),
        slack=tuple(slack),
    )


def _email(receiver: Receiver, index: int, key: str) -> EmailPlan:
    email = receiver.email
    assert email is not None  # a receiver is exactly one kind (kit/spec/model.py)
    smtp = email.smtp
    host = f"[{smtp.host}]" if ":" in smtp.host else smtp.host
    password = None if smtp.password_file is None else SecretFile(
        f"{key}.email.smtp.password_file", smtp.password_file, f"{index}-smtp.password",
        url=False)
    return EmailPlan(email.to, email.sender, f"{host}:{smtp.port}", smtp.username, password,
                     smtp.require_tls)
