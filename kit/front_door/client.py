"""The front door's HTTP client: a request as a client sends it, through the published port.

The gate (kit/front_door/gate.py), the logins that prove a reload or a credential change, and
`kit bench` reach the front door through this one client. Stdlib only (http.client + ssl): a
client library could buffer, retry or follow redirects and so hide exactly what kit must see.
"""

import base64
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kit.credentials.tls import installed
from kit.errors import BadInput
from kit.layout import PROBE_USER, SiteLayout
from kit.site import front_door_host
from kit.spec.model import Spec
from kit.state import read_state


@dataclass(frozen=True)
class Target:
    """Where the front door is and how a client must trust it."""

    address: str  # what to connect to; the domain still goes in SNI, Host and the cert check
    domain: str
    https_port: int
    http_port: int
    ca_file: Path | None  # the kit CA in self-signed mode, tls.ca_bundle; None: the system store
    timeout: float
    bundle: bool = False  # ca_file is the operator's tls.ca_bundle (not the kit CA)

    @property
    def https_authority(self) -> str:
        host = f"[{self.domain}]" if ":" in self.domain else self.domain
        return host if self.https_port == 443 else f"{host}:{self.https_port}"


def target_for(spec: Spec, layout: SiteLayout, address: str | None, timeout: float) -> Target:
    ca_file = None
    bundle = spec.tls.ca_bundle is not None
    if spec.tls.mode == "self-signed" or (spec.tls.mode == "acme" and _acme_placeholder(layout)):
        ca_file, bundle = layout.ca_cert, False
    elif bundle:
        ca_file = layout.ca_bundle  # the site's copy of tls.ca_bundle (kit render writes it)
    if ca_file is not None and not ca_file.is_file():
        raise BadInput(
            f"{ca_file} does not exist: the probe cannot verify the server's certificate",
            fix="run kit render first",
        )
    bind = spec.proxy.bind
    return Target(
        address=address or (front_door_host(spec) if bind in ("0.0.0.0", "::") else bind),
        domain=spec.domain,
        https_port=spec.proxy.https_port,
        http_port=spec.proxy.http_port,
        ca_file=ca_file,
        timeout=timeout,
        bundle=bundle,
    )


def _acme_placeholder(layout: SiteLayout) -> bool:
    """acme mode before the first certificate: nginx serves the kit CA's, the gate trusts it."""
    cert = installed(layout)
    return cert is not None and cert.placeholder


def probe_password(layout: SiteLayout) -> str:
    fix = "run kit render first (it creates the probe identity)"
    password = read_state(layout.probe_password, str.strip, fix=fix)
    if not password:
        raise BadInput(f"no probe credentials in {layout.probe_password}", fix=fix)
    return password


# --------------------------------------------------------------------------- HTTP as a client


@dataclass(frozen=True)
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    latency_ms: float

    def json(self) -> dict:
        return json.loads(self.body)


class DoorConnection(http.client.HTTPConnection):
    """HTTP(S) to `address` while Host, SNI and the certificate check use the domain."""

    def __init__(self, target: Target, context: ssl.SSLContext | None) -> None:
        port = target.https_port if context else target.http_port
        self.default_port = 443 if context else 80  # Host omits the port when it is the default
        super().__init__(target.domain, port, timeout=target.timeout)
        self._address = target.address
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host) if self._tls else raw


class ProbeFailure(Exception):
    """A check's request could not complete; the message says why in the operator's terms."""


# --------------------------------------------------------------------------- judging a stream


# --------------------------------------------------------------------------- small helpers


def basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


class DoorClient:
    """HTTP(S) to the front door as a client reaches it: the published port, TLS verified
    against the site's CA (or tls.ca_bundle, or the system's), kit's probe identity;
    network and TLS errors become ProbeFailure, explained in the operator's terms."""

    def __init__(self, target: Target, password: str) -> None:
        self.target = target
        self.context = self._client_context()
        self.credentials = basic_header(PROBE_USER, password)

    def _client_context(self) -> ssl.SSLContext:
        """TLS 1.2+ verified against the site's CA (or the system's), as clients verify."""
        context = ssl.create_default_context(
            cafile=str(self.target.ca_file) if self.target.ca_file else None
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def fetch(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        credentials: str | None = None,
        tls: bool = True,
        extra: dict[str, str] | None = None,
    ) -> Reply:
        started = time.perf_counter()
        with self.exchange(method, path, body=body, credentials=credentials, tls=tls,
                           extra=extra) as response:
            data = response.read()
        return Reply(response.status, response.headers, data, ms_since(started))

    @contextmanager
    def exchange(
        self,
        method: str,
        path: str,
        *,
        body: dict | None = None,
        credentials: str | None = None,
        tls: bool = True,
        extra: dict[str, str] | None = None,
    ) -> Iterator[http.client.HTTPResponse]:
        """One request on a fresh connection (with `extra` headers); network and TLS errors
        become ProbeFailure."""
        connection = DoorConnection(self.target, self.context if tls else None)
        headers = {"Accept": "application/json, text/event-stream", "User-Agent": "kit-probe",
                   **(extra or {})}
        if credentials:
            headers["Authorization"] = credentials
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=payload, headers=headers)
            yield connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            raise ProbeFailure(self._explain(error, tls)) from error
        finally:
            connection.close()

    def _explain(self, error: Exception, tls: bool) -> str:
        where = f"{self.target.address}:{self.target.https_port if tls else self.target.http_port}"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"TLS verification failed: {error.verify_message} — {self._trust_hint(error)}"
        if isinstance(error, ConnectionRefusedError):
            return f"cannot connect to {where}: connection refused — is the stack up (kit up)?"
        if isinstance(error, ssl.SSLEOFError | ConnectionResetError):  # incl. RemoteDisconnected
            return (f"{where} accepted the connection and closed it without an answer: the port "
                    "is published but nothing answers behind it (is nginx up and listening "
                    "inside its container? kit status)")
        if isinstance(error, TimeoutError):
            return f"no answer from {where} within {self.target.timeout:g} s"
        return f"{where}: {type(error).__name__}: {error}"

    def _trust_hint(self, error: ssl.SSLCertVerificationError) -> str:
        if error.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            return f"the server certificate does not name {self.target.domain}"
        if self.target.bundle:
            return ("the server certificate is not signed by a CA of tls.ca_bundle "
                    f"({self.target.ca_file}): put the CA that issued it there")
        if self.target.ca_file:
            return f"the server certificate is not signed by the kit CA ({self.target.ca_file})"
        return ("the server certificate is not trusted by the system CA store (incomplete "
                "chain?); a private CA's (e.g. of tls.acme_server: step-ca, pebble): set "
                "tls.ca_bundle to its PEM certificate")
