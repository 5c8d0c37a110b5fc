"""Delivered alerts end to end (issue 47, docs/observability.md "Delivered alerts"): the rendered
Alertmanager (Debian's 0.33.1 as prom/alertmanager:v0.33.1) on a live site delivers kit's alerts
to a webhook receiver and an SMTP sink (aiosmtpd, with a login) on its alerts-out network for a
stopped replica, the usage ledger's collector stopped, twenty credentials crossing 80 % and then
100 % of their budgets (grouped: a few notifications, not twenty), and a certificate set to
expire; the time from each event to its delivery is printed. No secret in `docker inspect`, in
the containers' logs, or in a world-readable file of the site."""

from __future__ import annotations

import datetime as dt
import math
import re
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kit.engine.desired import ALERTMANAGER_SERVICE, PROMETHEUS_SERVICE
from tests.support.alert_sinks import (
    DELIVERY_S,
    SMTP_PASSWORD,
    TOKEN,
    Sinks,
    delivered,
    firing,
    receivers,
    site_sinks,
)
from tests.support.live_stack import (
    DOMAIN,
    SERVED_NAME,
    SERVICE,
    LiveSite,
    checked,
    edited,
    wait_for,
)

pytestmark = pytest.mark.e2e

CREDENTIALS = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory, docker_client, test_images) -> Iterator[tuple[LiveSite, Sinks]]:
    root = tmp_path_factory.mktemp("alerts") / "site"
    sink = f"kit-alert-sink-{secrets.token_hex(3)}"
    alerts = receivers(root, sink)

    def edit(spec: dict) -> None:
        spec["observability"] = {"enabled": True, "scrape_interval": 1,
                                 "replica_down_after": 2, "alerts": alerts}

    with edited(root, docker_client, edit, prefix="alr") as site, \
            site_sinks(site, sink) as sinks:
        yield site, sinks


def test_a_stopped_replica(stack) -> None:
    site, sinks = stack
    replica = site.container(SERVICE)
    since = time.time()
    replica.stop(timeout=1)
    try:
        hooks, _ = delivered(site, sinks, "KitReplicaDown", since)
        alert = next(a for a in hooks[0]["body"]["alerts"]
                     if a["labels"]["alertname"] == "KitReplicaDown")
        assert alert["labels"]["service"] == SERVICE
    finally:
        replica.start()


def test_the_collector_stopped(stack) -> None:
    site, sinks = stack
    collector = site.container("usage-ledger")
    since = time.time()
    collector.stop(timeout=2)
    try:
        delivered(site, sinks, "KitUsageCollectorDown", since)
    finally:
        collector.start()


def test_twenty_credentials_crossing_their_budgets_arrive_grouped(stack) -> None:
    """Twenty keys each spend ~89 % of a day's budget at once, then pass it: each crossing is
    delivered as a few grouped notifications listing every credential, not twenty."""
    site, sinks = stack
    probe = site.add_key("probe")
    reply = site.gate().fetch("POST", "/v1/chat/completions", credentials=f"Bearer {probe}",
                              body=request_body())
    usage = reply.json()["usage"]
    spent = usage["prompt_tokens"] + usage["completion_tokens"]  # what one request counts
    budget = spent + max(1, math.ceil(spent / 8))  # one request: 80-100 %; two: past it
    keys = {}
    for n in range(CREDENTIALS):
        # the files alone for all but the last, whose live add reloads the door with all
        offline = ("--offline",) if n < CREDENTIALS - 1 else ()
        added = checked(site.kit("keys add", f"budget{n}", "--tokens-per-day", str(budget),
                                 *offline))
        keys[f"key:budget{n}"] = added.stdout.split(f"key budget{n}: ")[1].split()[0]
    for alert in ("KitBudgetNearlySpent", "KitBudgetSpent"):
        since = time.time()
        with ThreadPoolExecutor(CREDENTIALS) as pool:
            statuses = list(pool.map(lambda key: site.gate().fetch(
                "POST", "/v1/chat/completions", credentials=f"Bearer {key}",
                body=request_body()).status, keys.values()))
        assert statuses == [200] * CREDENTIALS
        hooks, mails = delivered(site, sinks, alert, since)
        everyone = wait_for_all(sinks, alert, since, set(keys))
        hooks = firing(alert, since)("webhook", sinks.deliveries())
        mails = firing(alert, since)("smtp", sinks.deliveries())
        print(f"{alert}: {CREDENTIALS} credentials in {len(hooks)} webhook notifications and "
              f"{len(mails)} mails")
        assert everyone == set(keys)
        assert len(hooks) < CREDENTIALS / 2 and len(mails) < CREDENTIALS / 2


def wait_for_all(sinks: Sinks, alert: str, since: float, credentials: set[str]) -> set[str]:
    """The credentials the webhook's notifications of `alert` named, once they name them all."""

    def named(deliveries: list[dict]) -> list[str]:
        found = {a["labels"]["credential"]
                 for d in firing(alert, since)("webhook", deliveries)
                 for a in d["body"]["alerts"] if a["labels"]["alertname"] == alert}
        return sorted(found) if found >= credentials else []

    return set(sinks.wait(f"{alert} of every credential", named, DELIVERY_S))


def request_body() -> dict:
    return {"model": SERVED_NAME, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say hi."}]}


def test_a_certificate_set_to_expire(stack) -> None:
    """The front door's certificate replaced by one that ends in ten days (its own key, so a
    reload meanwhile would still pass nginx -t); the door reads it at the next scrape."""
    site, sinks = stack
    tls = site.layout.tls_dir
    kept = {name: (tls / name).read_bytes() for name in ("server.crt", "server.key")}
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, DOMAIN)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=10))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(DOMAIN)]), critical=False)
            .sign(key, hashes.SHA256()))
    since = time.time()
    try:
        (tls / "server.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (tls / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        hooks, _ = delivered(site, sinks, "KitCertificateExpiresSoon", since)
        assert "ends in 9.9 days" in str(hooks[0]["body"]) or "ends in 10.0 days" in str(
            hooks[0]["body"])
    finally:
        for file, content in kept.items():
            (tls / file).write_bytes(content)


def test_kit_alerts_lists_silences_and_expires(stack) -> None:
    """The budgets stay spent for the day: `kit alerts list` shows KitBudgetSpent of each
    credential; one silenced (by its credential label) shows SILENCED and the others not, and
    its silence expired leaves it active again, all through the real amtool and API."""
    site, _ = stack
    listed = checked(site.kit("alerts list")).stdout
    assert "KitBudgetSpent" in listed and "credential=key:budget0" in listed, listed
    added = checked(site.kit("alerts silence", "KitBudgetSpent", "--label",
                             "credential=key:budget0", "--for", "1h", "--comment",
                             "raising it"))
    silence_id = added.stdout.split()[1].rstrip(":")
    listed = checked(site.kit("alerts list")).stdout
    rows = {re.search(r"credential=(key:budget\d+),", line).group(1): line.split()[1]
            for line in listed.splitlines() if line.startswith("KitBudgetSpent ")}
    assert rows["key:budget0"] == "SILENCED", listed
    assert rows["key:budget1"] == "active", listed
    assert f"silence {silence_id} (active" in listed and "raising it" in listed
    checked(site.kit("alerts expire", silence_id))

    def active_again() -> bool:
        listed = checked(site.kit("alerts list")).stdout
        return any(line.startswith("KitBudgetSpent ") and "key:budget0," in line
                   and " active " in line for line in listed.splitlines())

    wait_for("the expired silence's alert active again", active_again, 30)
    bad = site.kit("alerts silence", "KitBudgetSpent", "--label", "credential=$(reboot)",
                   "--comment", "x")
    assert bad.returncode == 2 and "is not a label" in bad.stderr + bad.stdout


def test_no_secret_in_inspect_logs_or_world_readable_files(stack) -> None:
    site, sinks = stack
    password = (site.layout.state_dir / "prometheus.password").read_text().strip()
    for service in (ALERTMANAGER_SERVICE, PROMETHEUS_SERVICE):
        container = site.container(service)
        container.reload()
        inspected = str(container.attrs)
        logs = container.logs().decode(errors="replace")
        for secret in (TOKEN, SMTP_PASSWORD):
            assert secret not in inspected, f"{secret} in docker inspect of {service}"
            assert secret not in logs, f"{secret} in the logs of {service}"
        assert password not in inspected.replace(f"KIT_PROMETHEUS_PASSWORD={password}", "")
    for path in site.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            content = path.read_bytes()
            if any(s.encode() in content for s in (TOKEN, SMTP_PASSWORD, password)):
                assert not path.stat().st_mode & 0o004, f"{path} is world-readable"
