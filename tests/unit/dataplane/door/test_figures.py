"""The door's own state for the alerts (kit/dataplane/door/figures.js) at the real nginx + njs,
without Docker: each budgeted credential's share of its windows (seeded after a start as a
request would be), the end of the certificate it serves read from its DER (UTCTime and
GeneralizedTime), the ACME loop's last run, and each replica in or out of its server list —
served on the metrics listener to Prometheus's address alone."""

from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from kit.layout import SiteLayout
from kit.plan.build import OUT_OF_SERVICE
from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.sites import base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
SPEC = "observability: {enabled: true, scrape_interval: 5}\n"


def budget(spec: Path, name: str, *limits: str) -> None:
    added = run_kit("keys", "add", spec, name, "--offline", *limits)
    assert added.exit_code == 0, added.output


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, Path, dict]]:
    root = tmp_path_factory.mktemp("figures")
    folder = base_site(root)
    spec = folder / "site.yaml"
    # two replicas of the one service (each its own GPU): a server list to be in or out of
    spec.write_text(spec.read_text().replace("services:\n", SPEC + "services:\n").replace(
        "gpus: [0]", "gpus: [0, 1]\n    tensor_parallel: 1"))
    layout = SiteLayout(folder)
    render_site(Site.load(spec))
    budget(spec, "half", "--tokens-per-day", "50")
    budget(spec, "spent", "--tokens-per-day", "100", "--tokens-per-month", "1000")
    budget(spec, "fresh", "--tokens-per-month", "10")
    compose = yaml.safe_load(layout.compose_file.read_text())
    network = compose["services"]["prometheus"]["networks"]["metrics"]["ipv4_address"]
    door = compose["services"]["nginx"]["networks"]["metrics"]["ipv4_address"]
    work = root / "work"
    (work / "spool").mkdir(parents=True)
    now = dt.datetime.now(dt.UTC)
    # what the collector last wrote: the door's windows start from it
    (work / "spool" / "budget-seed.json").write_text(json.dumps({
        "day": now.strftime("%Y-%m-%d"), "month": now.strftime("%Y-%m"),
        "credentials": {"key:half": [40, 40], "key:spent": [100, 150]}}))
    replicas = [name for name in compose["services"] if name.startswith("llama8b")]
    with serving_door(folder / "nginx", work, replicas, root / "models" / "llama-8b", SERVED,
                      HOST, addresses=(door, network)) as serving:
        yield serving, folder, {"door": door, "prometheus": network}


def state(door: Door, address: dict, source: str = "prometheus") -> tuple[int, str]:
    """GET /kit-door-state of the metrics listener from `source`'s address, in the namespace."""
    with door.inside(), socket.create_connection(
            (address["door"], 9113), timeout=10,
            source_address=(address[source], 0)) as client:
        client.sendall(b"GET /kit-door-state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
    head, _, body = reply.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def samples(body: str) -> dict[str, float]:
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in body.splitlines() if line and not line.startswith("#")}


def test_budget_shares_start_from_the_ledger_after_a_start(site) -> None:
    door, _, address = site
    status, body = state(door, address)
    assert status == 200, body
    found = samples(body)
    assert found['kit_budget_used_ratio{credential="key:half",window="day"}'] == 0.8
    assert found['kit_budget_used_ratio{credential="key:spent",window="day"}'] == 1
    assert found['kit_budget_used_ratio{credential="key:spent",window="month"}'] == 0.15
    assert found['kit_budget_used_ratio{credential="key:fresh",window="month"}'] == 0


def test_the_certificate_s_end_is_read_from_its_der(site, tmp_path: Path) -> None:
    door, folder, address = site
    served = x509.load_pem_x509_certificate((folder / "nginx/tls/server.crt").read_bytes())
    found = samples(state(door, address)[1])
    assert found["kit_tls_certificate_not_after_seconds"] == \
        served.not_valid_after_utc.timestamp()
    original = (folder / "nginx/tls/server.crt").read_bytes()
    try:  # a certificate ending after 2049 holds a GeneralizedTime; one of 1999 a UTCTime
        for ends in (dt.datetime(2051, 3, 4, 5, 6, 7, tzinfo=dt.UTC),
                     dt.datetime(1999, 12, 31, 23, 59, 58, tzinfo=dt.UTC)):
            (folder / "nginx/tls/server.crt").write_bytes(certificate_ending(ends) + original)
            found = samples(state(door, address)[1])
            assert found["kit_tls_certificate_not_after_seconds"] == ends.timestamp()
    finally:
        (folder / "nginx/tls/server.crt").write_bytes(original)


def certificate_ending(ends: dt.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, HOST)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime(1990, 1, 1, tzinfo=dt.UTC)).not_valid_after(ends)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(Encoding.PEM)


def test_the_acme_loop_s_last_run(site) -> None:
    door, folder, address = site
    assert "kit_acme_last_run" not in state(door, address)[1]  # no run yet: nothing
    last_run = folder / "nginx/tls/acme-last-run"
    try:
        last_run.write_text("exit=1 at=1765000000 next=120\ncertbot: Detail: no route\n")
        found = samples(state(door, address)[1])
        assert found["kit_acme_last_run_exit_code"] == 1
        assert found["kit_acme_last_run_timestamp_seconds"] == 1765000000
    finally:
        last_run.unlink()


def test_a_replica_out_of_its_server_list(site) -> None:
    door, folder, address = site
    pool = folder / "nginx/replicas/llama8b.conf"
    original = pool.read_text()
    hosts = [line.split()[1].rsplit(":", 1)[0] for line in original.splitlines()
             if line.startswith("server ")]
    assert len(hosts) == 2
    found = samples(state(door, address)[1])
    assert [found[f'kit_door_replica_in_rotation{{service="llama8b",host="{host}"}}']
            for host in hosts] == [1, 1]
    try:  # as kit up's rollout marks one (kit/converge/rollout.py)
        pool.write_text(original.replace("server " + hosts[1], OUT_OF_SERVICE + "server "
                                         + hosts[1]))
        found = samples(state(door, address)[1])
        assert [found[f'kit_door_replica_in_rotation{{service="llama8b",host="{host}"}}']
                for host in hosts] == [1, 0]
    finally:
        pool.write_text(original)


def test_only_prometheus_s_address_reads_it(site) -> None:
    door, _, address = site
    assert state(door, address, source="door")[0] == 403
