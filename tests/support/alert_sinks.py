"""Where a live site's Alertmanager delivers in the e2e tests: tests/support/alert_sink_server.py
(a webhook receiver and aiosmtpd's SMTP sink) in a container of the stand-in image on the site's
alerts-out network, aiosmtpd and its two dependencies bound in from this host's Python (pure
Python). Every delivery is read back as it arrived, with the time it arrived."""

from __future__ import annotations

import email
import importlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker

from kit.engine.desired import ALERTMANAGER_SERVICE
from tests.support.docker_engine import IMAGES
from tests.support.live_stack import LiveSite

WEBHOOK_PORT = 8080
SMTP_PORT = 2525
SERVER = Path(__file__).with_name("alert_sink_server.py")
PACKAGES = ("aiosmtpd", "public", "attr", "attrs")  # aiosmtpd, atpublic, attrs
TOKEN = "T0KEN-" + secrets.token_hex(8)  # in the webhook's URL, as a service's token would be
SMTP_USER = "kit-alerts"
SMTP_PASSWORD = "smtp-" + secrets.token_hex(8)
DELIVERY_S = 60  # each event is delivered well within this (printed: a few seconds)


@dataclass
class Sinks:
    host: str  # the container's name on the alerts-out network
    out: Path

    def deliveries(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]

    def wait(self, what: str, found: Callable[[list[dict]], list[dict]],
             timeout: float) -> list[dict]:
        """The deliveries `found` picks, once it picks any; fails after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            picked = found(self.deliveries())
            if picked:
                return picked
            time.sleep(0.2)
        raise AssertionError(f"{what}: nothing delivered within {timeout} s; got "
                             f"{[d.get('kind') for d in self.deliveries()]}")


def package_dir(name: str) -> str:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    return str(Path(module.__file__).parent)


@contextmanager
def alert_sinks(client: docker.DockerClient, network: str, name: str, work: Path,
                smtp_user: str, smtp_password_file: Path) -> Iterator[Sinks]:
    """The sink container on `network` as `name` until the block ends, ready when it yields."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "deliveries.jsonl"
    volumes = {str(SERVER): {"bind": "/sink/server.py", "mode": "ro"},
               str(smtp_password_file): {"bind": "/sink/smtp.password", "mode": "ro"},
               str(work): {"bind": "/out", "mode": "rw"},
               **{package_dir(package): {"bind": f"/sink/lib/{package}", "mode": "ro"}
                  for package in PACKAGES}}
    container = client.containers.run(
        IMAGES["vllm_standin"], ["/sink/server.py", "/out/deliveries.jsonl", str(WEBHOOK_PORT),
                                 str(SMTP_PORT), smtp_user, "/sink/smtp.password"],
        entrypoint=["python3"], name=name, network=network, detach=True, volumes=volumes,
        environment={"PYTHONPATH": "/sink/lib"}, labels={"kit.test": "alert-sink"})
    sinks = Sinks(name, out)
    try:
        sinks.wait("the sink ready", lambda found: [d for d in found if d["kind"] == "ready"],
                   30)
        yield sinks
    finally:
        container.remove(force=True)


def receivers(root: Path, sink: str) -> dict:
    """`observability.alerts` of a test site whose folder is `root` (made here): the webhook's
    URL (with TOKEN) and the SMTP password in 0600 files under root/secrets, group_wait 2 s."""
    (root / "secrets").mkdir(parents=True)
    for name, value in (("webhook.url", f"http://{sink}:{WEBHOOK_PORT}/hook/{TOKEN}\n"),
                        ("smtp.password", SMTP_PASSWORD + "\n")):
        (root / "secrets" / name).write_text(value)
        (root / "secrets" / name).chmod(0o600)
    return {"group_wait": 2, "group_interval": 2, "repeat_interval": 3600, "receivers": [
        {"webhook": {"url_file": "secrets/webhook.url"}},
        {"email": {"to": "ops@example.com", "from": "kit@example.com",
                   "smtp": {"host": sink, "port": SMTP_PORT, "username": SMTP_USER,
                            "password_file": "secrets/smtp.password", "require_tls": False}}}]}


def site_sinks(site: LiveSite, sink: str):
    """The sinks of a site whose alerts `receivers` made, on its alerts-out network."""
    return alert_sinks(site.client, site.network("alerts-out"), sink, site.root.parent / "sink",
                       SMTP_USER, site.root / "secrets" / "smtp.password")


def firing(alert: str, since: float):
    """Picks the webhook notifications and mails of `alert` firing that arrived after `since`."""

    def pick(kind: str, deliveries: list[dict]) -> list[dict]:
        found = []
        for delivery in deliveries:
            if delivery["kind"] != kind or delivery["at"] < since:
                continue
            if kind == "webhook" and any(a["labels"]["alertname"] == alert
                                         and a["status"] == "firing"
                                         for a in delivery["body"]["alerts"]):
                found.append(delivery)
            if kind == "smtp" and subject_names(delivery["body"], alert):
                found.append(delivery)
        return found

    return pick


def subject_names(mail: str, alert: str) -> bool:
    """Whether the mail's subject (Alertmanager's default: `[FIRING:N] ALERT labels…`) is about
    `alert` firing."""
    subject = str(email.message_from_string(mail)["Subject"] or "")
    return subject.startswith("[FIRING") and alert in subject.split()


def delivered(site: LiveSite, sinks: Sinks, alert: str,
              since: float) -> tuple[list[dict], list[dict]]:
    """Both receivers' deliveries of `alert` after `since`; the time from the event printed."""
    pick = firing(alert, since)
    try:
        hooks = sinks.wait(f"{alert} by webhook", lambda d: pick("webhook", d), DELIVERY_S)
        mails = sinks.wait(f"{alert} by mail", lambda d: pick("smtp", d), DELIVERY_S)
    except AssertionError as error:
        logs = site.container(ALERTMANAGER_SERVICE).logs(tail=20).decode(errors="replace")
        raise AssertionError(f"{error}\nAlertmanager's log:\n{logs}") from None
    print(f"\n{alert}: event → webhook {hooks[0]['at'] - since:.1f} s, "
          f"→ mail {mails[0]['at'] - since:.1f} s")
    assert hooks[0]["path"] == f"/hook/{TOKEN}"  # the URL came from the 0600 file
    assert all(mail["auth"] for mail in mails)  # it logged in with the password file's secret
    return hooks, mails


