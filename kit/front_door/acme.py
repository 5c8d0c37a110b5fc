"""tls.mode acme as kit sees it: which certificate nginx/tls holds (the kit-CA placeholder or
the ACME CA's), what certbot's last run said and, when it failed, why in the operator's terms.

`kit up` waits here for certbot's first run before its gate (a first deployment is not a
failure while the certificate is on its way), and `kit status` shows the same facts.
The certbot loop (plan.AcmePlan.loop) writes each run's outcome to nginx/tls/acme-last-run:
a line `exit=N at=EPOCH next=SECONDS` (until its next run), then certbot's output.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from kit.credentials.material import read_if_present
from kit.credentials.tls import Installed, installed
from kit.engine.desired import ACME_SERVICE
from kit.front_door.client import target_for
from kit.plan.build import AcmePlan

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

RENEW_DAYS_LEFT = 30  # certbot's renew_before_expiry default: --keep-until-expiring renews then
FIRST_RUN_WAIT_S = 180.0  # certbot's first run takes seconds; a CA that stalls longer is named
SERVED_WAIT_S = 3 * AcmePlan.watch_every + 5.0  # nginx's watcher reloads within watch_every
_HEADER = re.compile(r"exit=(\d+) at=(\d+)(?: next=(\d+))?")  # an older loop wrote no next=


@dataclass(frozen=True)
class Cause:
    """Why certbot got no certificate, in the operator's terms, and what to do about it."""

    name: str  # ca-unreachable, http-port-unreachable, dns-not-here, rate-limited, certbot-failed
    message: str
    fix: str


def _detail(output: str) -> str:
    """The CA's own words (certbot's `Detail:` line, or the detail of an ACME problem
    `urn:ietf:params:acme:error:TYPE :: DESCRIPTION :: DETAIL`), else certbot's last error line."""
    details = re.findall(r"^\s*Detail:\s*(.+)$", output, re.MULTILINE)
    if details:
        return details[-1].strip()
    problems = re.findall(r"urn:ietf:params:acme:error:\w+ :: [^\n]*? :: (.+)$", output,
                          re.MULTILINE)
    if problems:
        return problems[-1].strip()
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "rror" in line] or lines
    return errors[-1] if errors else "no output"


def classify(output: str, domain: str, server: str) -> Cause:
    """The cause of a failed certbot run, from the ACME problem type it printed."""
    detail = _detail(output)
    if re.search(r"rateLimited|[Tt]oo many (certificates|failed authorizations|requests)",
                 output):
        return Cause("rate-limited", f"the ACME CA rate-limits this account or name: {detail}",
                     "wait until the limit resets (the CA's message says when); use "
                     "tls.staging: true while testing, and keep the letsencrypt volume (kit down "
                     "without --volumes) so a re-created site reuses its certificate")
    dns_fix = (f"point {domain}'s A/AAAA records at this server's public address, then wait "
               "for the retry (minutes) or restart the certbot container")
    if re.search(r"Type:\s+dns\b|DNS problem|NXDOMAIN|no valid A records|could not resolve "
                 r"URL|no such host", output):
        return Cause("dns-not-here", f"DNS name not pointing here: the CA could not resolve "
                     f"{domain} to this server: {detail}", dns_fix)
    if re.search(r"Type:\s+unauthorized\b", output):
        return Cause("dns-not-here", f"DNS name not pointing here: the CA reached a server for "
                     f"{domain} that does not answer this site's challenge: {detail}", dns_fix)
    if re.search(r"Type:\s+connection\b", output):
        return Cause("http-port-unreachable", "challenge failed: the HTTP port is not reachable "
                     f"from the CA: {detail}",
                     f"let the internet reach port 80 of {domain} (firewall, NAT, proxy.bind / "
                     "proxy.http_port published on it): the CA fetches "
                     f"http://{domain}/.well-known/acme-challenge/ from there")
    if re.search(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", output):
        return Cause("ca-untrusted", f"certbot does not trust the HTTPS certificate of the ACME "
                     f"directory {server}: {detail}",
                     "set tls.ca_bundle to the PEM certificate of the CA that signs the ACME "
                     "server (a private CA: step-ca's root_ca.crt, pebble's minica root), then "
                     "kit up")
    if re.search(r"Failed to establish a new connection|Max retries exceeded|Connection "
                 r"(refused|aborted|reset)|Name or service not known|timed out", output):
        return Cause("ca-unreachable", f"the ACME CA is unreachable at {server}: {detail}",
                     "check tls.acme_server and that this host can open HTTPS connections to it "
                     "(outbound firewall, proxy, DNS)")
    return Cause("certbot-failed", f"certbot failed: {detail}",
                 "see `kit logs certbot` and nginx/tls/acme-last-run")


@dataclass(frozen=True)
class LastRun:
    """certbot's last run: its exit code, when it ended, what it printed."""

    exit_code: int
    at: dt.datetime
    output: str
    next_in: int | None = None  # seconds from `at` to certbot's next run, when the file says

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def next_at(self) -> dt.datetime | None:
        """When certbot runs again: after a failure 1 min later, doubling up to 1 h, or at the
        time the CA named if that is later, so a CA that refuses (a rate limit) sees one order
        per retry, never a loop, and none before it said."""
        return None if self.next_in is None else self.at + dt.timedelta(seconds=self.next_in)


def parse_last_run(text: str) -> LastRun | None:
    """None when the file is not what the certbot loop writes (then nothing is known)."""
    header, _, output = text.partition("\n")
    match = _HEADER.fullmatch(header.strip())
    if match is None:
        return None
    at = dt.datetime.fromtimestamp(int(match[2]), dt.UTC)
    return LastRun(int(match[1]), at, output, None if match[3] is None else int(match[3]))


@dataclass(frozen=True)
class AcmeStatus:
    """What `kit up` and `kit status` say about the site's ACME certificate."""

    server: str
    cert: Installed | None
    last_run: LastRun | None
    cause: Cause | None  # of the last run, when it failed
    retry_first: int  # tls.acme_retry_s: certbot's first wait after a failed run

    @property
    def waiting(self) -> bool:
        """No certificate from the CA yet: nginx serves the kit-CA placeholder."""
        return self.cert is None or self.cert.placeholder

    @property
    def renewal_due(self) -> dt.datetime | None:
        """From when certbot's run renews (before that, a run keeps the certificate)."""
        if self.waiting or self.cert is None:
            return None
        return self.cert.not_after - dt.timedelta(days=RENEW_DAYS_LEFT)

    @property
    def next_renewal(self) -> dt.datetime | None:
        """certbot's first 12-hourly run at or after the due date: when the renewal happens."""
        due = self.renewal_due
        if due is None or self.last_run is None:
            return due
        every = dt.timedelta(seconds=AcmePlan.renew_every)
        check = self.last_run.at + every
        if due > check:
            check += every * math.ceil((due - check) / every)
        return check

    def lines(self) -> list[str]:
        if self.waiting:
            head = (f"tls: waiting for the first certificate from {self.server}: serving a "
                    "kit-CA certificate meanwhile (clients that trust only public CAs refuse it)")
        else:
            cert = self.cert
            assert cert is not None  # not waiting
            head = (f"tls: certificate from {cert.issuer}, expires {_at(cert.not_after)}, "
                    f"next renewal {_at(self.next_renewal)} (certbot checks every "
                    f"{AcmePlan.renew_every // 3600} h and renews from {_at(self.renewal_due)})")
        lines = [head]
        run = self.last_run
        if run is None:
            lines.append("tls: certbot has not finished a run yet")
        elif self.cause is None:
            lines.append(f"tls: last certbot run succeeded at {_at(run.at)}")
        else:
            lines.append(f"tls: last certbot run FAILED at {_at(run.at)} "
                         f"({self.cause.name}): {self.cause.message}")
            lines.append(f"  fix: {self.cause.fix}")
            lines.append(f"  {self._retry(run)}")
        return lines

    def _retry(self, run: LastRun) -> str:
        if run.next_at is None:
            return "certbot retries within minutes"
        return (f"next attempt: certbot runs again at {_at(run.next_at)} ({run.next_in}s after "
                f"this run; after a failed run it waits {self.retry_first}s, doubling up to "
                f"{AcmePlan.retry_max}s, or until the time the CA named)")

    def to_json(self) -> dict:
        def iso(at: dt.datetime | None) -> str | None:
            return at.isoformat(timespec="seconds") if at else None

        run = self.last_run
        return {
            "mode": "acme",
            "server": self.server,
            "waiting_for_first_certificate": self.waiting,
            "issuer": self.cert.issuer if self.cert else None,
            "expires": iso(self.cert.not_after) if self.cert else None,
            "renewal_due": iso(self.renewal_due),
            "next_renewal": iso(self.next_renewal),
            "next_attempt": iso(run.next_at) if run else None,  # certbot's next run
            "last_run": None if run is None else {
                "ok": run.ok, "at": iso(run.at), "exit_code": run.exit_code,
                "cause": self.cause.name if self.cause else None,
                "message": self.cause.message if self.cause else None,
            },
        }


def _at(moment: dt.datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}Z" if moment else "-"


def acme_server(site: Site) -> str:
    tls = site.spec.tls
    if tls.acme_server:
        return tls.acme_server
    return "Let's Encrypt" + (" (staging)" if tls.staging else "")


def acme_status(site: Site) -> AcmeStatus:
    raw = read_if_present(site.layout.acme_last_run)
    run = parse_last_run(raw.decode(errors="replace")) if raw is not None else None
    server = acme_server(site)
    cause = None if run is None or run.ok else classify(run.output, site.spec.domain, server)
    return AcmeStatus(server, installed(site.layout), run, cause, site.spec.tls.acme_retry_s)


def served_certificate(site: Site, timeout: float = 5) -> bytes | None:
    """The leaf certificate nginx serves now (DER), unverified: which one, not whether trusted."""
    target = target_for(site.spec, site.layout, None, timeout)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((target.address, target.https_port), timeout) as raw, \
                context.wrap_socket(raw, server_hostname=target.domain) as tls:
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def certbot_started(site: Site, engine: Engine) -> dt.datetime | None:
    """When the running certbot container started: an outcome older than that is a former
    container's (kit up may just have re-created it)."""
    found = site.observe(engine, with_images=False).of(ACME_SERVICE)
    return max((c.started_at for c in found if c.running and c.started_at), default=None)


def _current(status: AcmeStatus, since: dt.datetime | None) -> AcmeStatus:
    run = status.last_run
    if since is None or run is None or run.at >= since - dt.timedelta(seconds=1):
        return status  # `date +%s` drops the fraction: a run of the start's second counts
    return replace(status, last_run=None, cause=None)


def await_certificate(
    site: Site,
    report: Callable[[str], None],
    *,
    since: dt.datetime | None = None,
    timeout: float = FIRST_RUN_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> AcmeStatus:
    """Before the gate: wait for certbot's first run since `since` (the certbot container's
    start) to end, installed or failed with a cause; then, once a certificate from the CA is
    installed, until nginx serves it (its watcher reloads within seconds). Returns the state
    `kit up` reports."""
    deadline = clock() + timeout
    status = _current(acme_status(site), since)
    if status.waiting and status.last_run is None:
        report(f"tls: waiting up to {timeout:.0f}s for certbot's first certificate from "
               f"{status.server}")
    while status.waiting and status.last_run is None and clock() < deadline:
        sleep(1)
        status = _current(acme_status(site), since)
    if status.waiting:
        return status  # nginx serves the placeholder it started with
    assert status.cert is not None  # not waiting
    expected = x509.load_pem_x509_certificate(status.cert.pem).public_bytes(Encoding.DER)
    served_by = clock() + SERVED_WAIT_S
    serving = served_certificate(site) == expected
    while not serving and clock() < served_by:
        sleep(0.25)
        serving = served_certificate(site) == expected
    age = time.time() - site.layout.server_cert.stat().st_mtime
    if serving:
        report(f"tls: nginx serves the installed certificate (installed {age:.1f}s ago; nginx "
               f"checks it every {AcmePlan.watch_every}s and reloads in place when it changes)")
    else:
        report(f"tls: nginx still serves another certificate {age:.0f}s after certbot "
               "installed this one (see `kit logs` of nginx)")
    return status
