"""Alertmanager's files from the plan (observability.alerts, docs/observability.md "Delivered
alerts"): alertmanager.yml (one route, grouped by alert and service, to every receiver the spec
lists), the receivers' secrets copied from the operator's 0600 files, and what the compose
template lays out for its container (`am` in it). Its API's account: kit/credentials/material.py.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from kit.credentials.material import PROMETHEUS_GID, secret_readable
from kit.engine.desired import ALERTMANAGER_SERVICE
from kit.errors import BadInput
from kit.files import Output, generated_yaml
from kit.layout import PROMETHEUS_AUTH_ENV_FILE, PROMETHEUS_WEB_CONFIG
from kit.plan.alerts import (
    ALERTMANAGER_DATA,
    ALERTMANAGER_MOUNT,
    ALERTMANAGER_PORT,
    ALERTS_NETWORK,
    ALERTS_OUT_NETWORK,
    GROUP_BY,
    RECEIVER,
    RESOLVE_TIMEOUT,
    SECRETS_FOLDER,
)
from kit.render.prometheus import prometheus_get

if TYPE_CHECKING:
    from kit.layout import SiteLayout
    from kit.plan.alerts import AlertsPlan, SecretFile
    from kit.plan.build import Plan

MAX_SECRET_BYTES = 4096
URL = re.compile(r"https?://[^\s\x00-\x1f\x7f]+")
PASSWORD = re.compile(r"[^\x00-\x1f\x7f]+")  # one line, no control character


def _secret_path(secret: SecretFile) -> str:
    return f"{ALERTMANAGER_MOUNT}/{SECRETS_FOLDER}/{secret.name}"


def alertmanager_config(alerts: AlertsPlan) -> str:
    """alertmanager.yml: every alert to one receiver holding each destination of the spec,
    grouped by alert name and service (a budget alert of 20 credentials is one notification),
    resolved ones sent too. Every secret is a `*_file` under secrets/: this file holds none."""
    receiver: dict = {"name": RECEIVER}
    if alerts.webhooks:
        receiver["webhook_configs"] = [{"url_file": _secret_path(hook), "send_resolved": True}
                                       for hook in alerts.webhooks]
    if alerts.emails:
        receiver["email_configs"] = [
            {"to": email.to, "from": email.sender, "smarthost": email.smarthost,
             "require_tls": email.require_tls, "send_resolved": True,
             **({"auth_username": email.username,
                 "auth_password_file": _secret_path(email.password)}
                if email.username is not None and email.password is not None else {})}
            for email in alerts.emails]
    if alerts.slack:
        receiver["slack_configs"] = [{"api_url_file": _secret_path(hook), "send_resolved": True}
                                     for hook in alerts.slack]
    return generated_yaml({
        "global": {"resolve_timeout": RESOLVE_TIMEOUT},
        "route": {
            "receiver": RECEIVER,
            "group_by": list(GROUP_BY),
            "group_wait": f"{alerts.group_wait}s",
            "group_interval": f"{alerts.group_interval}s",
            "repeat_interval": f"{alerts.repeat_interval}s",
        },
        "receivers": [receiver],
    })


def alertmanager_files(plan: Plan, layout: SiteLayout) -> list[Output]:
    """alertmanager.yml when observability.alerts is set (its secrets: `secret_outputs`)."""
    alerts = plan.observability.alerts if plan.observability else None
    if alerts is None:
        return []
    return [Output(layout.alertmanager_dir.relative_to(layout.root) / "alertmanager.yml",
                   alertmanager_config(alerts).encode())]


def secret_outputs(alerts: AlertsPlan, layout: SiteLayout, spec_dir: Path) -> list[Output]:
    """Each receiver's secret, copied under observability/alertmanager/secrets/, readable by
    Alertmanager's user (its group, as root) alone."""
    mode, group = secret_readable(PROMETHEUS_GID)
    folder = layout.alertmanager_dir.relative_to(layout.root) / SECRETS_FOLDER
    return [Output(folder / secret.name, read_secret(secret, spec_dir), mode, generated=False,
                   group=group, secret=True)
            for secret in alerts.secrets]


def read_secret(secret: SecretFile, spec_dir: Path) -> bytes:
    """The secret's one line (without its newline), refused with the fix when the operator's
    file is readable by others, not a regular file, empty, several lines, or not a URL where
    one is wanted."""
    path = secret.source if secret.source.is_absolute() else spec_dir / secret.source
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        raise BadInput(f"{secret.key}: cannot read {path}: {error.strerror}",
                       fix=f"write the secret alone in {path} (chmod 600), a regular file "
                       "(not a link) readable by the user running kit") from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise BadInput(f"{secret.key}: {path} is not a regular file",
                           fix=f"write the secret alone in a regular file and point {secret.key} "
                           "at it")
        if status.st_mode & 0o077:
            raise BadInput(
                f"{secret.key}: {path} is readable by others (mode "
                f"{stat.S_IMODE(status.st_mode):04o}); it holds a secret",
                fix=f"chmod 600 {path} (and replace the secret if others could read it)")
        content = file.read(MAX_SECRET_BYTES + 1)
    text = content.decode(errors="replace").removesuffix("\n").removesuffix("\r")
    pattern, what = (URL, "one http(s) URL") if secret.url else (PASSWORD, "the password")
    if len(content) > MAX_SECRET_BYTES or not pattern.fullmatch(text):
        raise BadInput(f"{secret.key}: {path} does not hold {what} alone on one line",
                       fix=f"write {what} alone in {path} (one line, at most "
                       f"{MAX_SECRET_BYTES} bytes)")
    return text.encode()


def alertmanager_get(path: str, output: str = "-") -> str:
    """A shell command GETting `path` of Alertmanager's API from inside its container, with
    kit's account from its environment (kit status, kit alerts, its healthcheck)."""
    return prometheus_get(path, output, ALERTMANAGER_PORT)


def template_facts(plan: Plan) -> dict:
    """What the compose template lays out for Alertmanager (`am` in it); {} without alerts."""
    alerts = plan.observability.alerts if plan.observability else None
    if alerts is None:
        return {}
    return {
        "service": ALERTMANAGER_SERVICE,
        "image": alerts.image,
        "mount": ALERTMANAGER_MOUNT,
        "data": ALERTMANAGER_DATA,
        "network": ALERTS_NETWORK,
        "out_network": ALERTS_OUT_NETWORK,
        "env_file": PROMETHEUS_AUTH_ENV_FILE,
        "command": [
            f"--config.file={ALERTMANAGER_MOUNT}/alertmanager.yml",
            f"--storage.path={ALERTMANAGER_DATA}",
            f"--web.listen-address=:{ALERTMANAGER_PORT}",
            f"--web.config.file={ALERTMANAGER_MOUNT}/{PROMETHEUS_WEB_CONFIG}",
            "--cluster.listen-address=",  # one Alertmanager: no gossip port
        ],
        "health": ["CMD-SHELL", alertmanager_get("/-/ready", "/dev/null")],
    }
