"""A real ACME CA for the e2e tests: Debian's pebble (kit-test/pebble:2.4, tests/images/build.sh)
in the engine's network namespace, with its mock DNS answering every name with ACME_ADDRESS;
and, since pebble has no rate limits, a rate limiter in front of it (Debian's nginx, limit_req).

ACME_ADDRESS is an extra address of the namespace's loopback: sites publish on it (proxy.bind
0.0.0.0), certbot's containers reach pebble on it through their bridge's gateway, and pebble
validates HTTP-01 against `http://DOMAIN:<the site's http_port>/` there. So the site's domain
resolves to the test stack for pebble only, and nothing leaves the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import docker

from tests.support.docker_engine import IMAGES

ACME_ADDRESS = "10.77.0.1"  # also in tests/images/build.sh: pebble's HTTPS certificate names it
ACME_PORT = 14000  # pebble's directory; its management API (the roots) on the next port
# build.sh made it: it signs pebble's HTTPS certificate
PEBBLE_CA = Path(os.environ.get("KIT_TEST_CACHE", "/var/cache/kit-test")) / "acme-ca" / "ca.crt"


LIMITER = Path(__file__).parent / "acme_limiter"  # the rate limiter's nginx.conf and njs
_ORDER = re.compile(r'^([\d.]+) "POST /order-plz HTTP/[\d.]+" (\d+) "([^"]*)" "([^"]*)"$', re.M)


def directory(port: int) -> str:
    """The ACME directory URL of a pebble on `port` (tls.acme_server)."""
    return f"https://{ACME_ADDRESS}:{port}/dir"


def add_acme_address() -> None:
    """ACME_ADDRESS on this namespace's loopback (the engine's own namespace); `replace` is
    idempotent, also when tests in parallel workers add it at once."""
    subprocess.run(["ip", "addr", "replace", f"{ACME_ADDRESS}/32", "dev", "lo"], check=True)


class _AcmeContainer:
    """A container on the host network of the engine's namespace serving an ACME directory."""

    container: docker.models.containers.Container
    port: int

    @property
    def directory(self) -> str:
        return directory(self.port)

    def wait_ready(self, timeout: float = 20) -> None:
        context = ssl.create_default_context(cafile=str(PEBBLE_CA))
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.directory, context=context, timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    logs = self.container.logs().decode(errors="replace")
                    why = f"{self.container.name} did not answer {self.directory}:\n{logs}"
                    raise AssertionError(why) from None
                time.sleep(0.2)

    def started(self) -> None:
        """Ready, or removed and the reason raised."""
        try:
            self.wait_ready()
        except AssertionError:
            self.remove()
            raise

    def remove(self) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)


class Pebble(_AcmeContainer):
    """One pebble (and its mock DNS) on the host network of the engine's namespace; several
    run side by side on different `port`s."""

    def __init__(self, client: docker.DockerClient, folder: Path, *, http_port: int,
                 validity_s: int, dns_answer: str = ACME_ADDRESS, port: int = ACME_PORT) -> None:
        self.port, self.http_port = port, http_port
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "pebble-config.json"
        config.write_text(json.dumps({"pebble": {
            "listenAddress": f"{ACME_ADDRESS}:{port}",
            "managementListenAddress": f"{ACME_ADDRESS}:{port + 1}",
            "certificate": "/etc/pebble/server.crt", "privateKey": "/etc/pebble/server.key",
            "httpPort": http_port, "tlsPort": 5001, "ocspResponderURL": "",
            "externalAccountBindingRequired": False, "certificateValidityPeriod": validity_s,
        }}))
        self.container = client.containers.run(
            IMAGES["pebble"], detach=True, network_mode="host",
            name=f"pebble-{secrets.token_hex(3)}",
            environment={"CHALLTESTSRV_IPV4": dns_answer, "CHALLTESTSRV_PORT": str(port + 2)},
            volumes={str(config): {"bind": "/etc/pebble/pebble-config.json", "mode": "ro"}},
        )
        self.started()

    def root(self) -> bytes:
        """The root pebble issues under (made at its start): what the test alone trusts."""
        context = ssl.create_default_context(cafile=str(PEBBLE_CA))
        url = f"https://{ACME_ADDRESS}:{self.port + 1}/roots/0"
        return urllib.request.urlopen(url, context=context, timeout=5).read()

    def trust(self) -> bytes:
        """What a site using this private ACME CA puts in tls.ca_bundle: the CA of its
        directory's HTTPS certificate (certbot) and the root it issues under (the gate)."""
        return PEBBLE_CA.read_bytes() + self.root()


@dataclass(frozen=True)
class Order:
    """One new-order request the rate limiter saw, and what it answered."""

    at: float  # epoch seconds
    status: int
    content_type: str
    retry_after: str


class RateLimiter(_AcmeContainer):
    """A rate-limited CA: Debian's nginx in front of `pebble`, granting one new order a minute
    and answering others as Let's Encrypt does (tests/support/acme_limiter/nginx.conf)."""

    def __init__(self, client: docker.DockerClient, folder: Path, pebble: Pebble, *,
                 port: int) -> None:
        self.port = port
        folder.mkdir(parents=True, exist_ok=True)
        conf = (LIMITER / "nginx.conf").read_text().replace("@LISTEN@", f"{ACME_ADDRESS}:{port}")
        conf = conf.replace("@PEBBLE@", f"{ACME_ADDRESS}:{pebble.port}")
        (folder / "nginx.conf").write_text(conf)
        shutil.copy(LIMITER / "limiter.js", folder)
        self.container = client.containers.run(
            IMAGES["nginx_debian"], ["nginx", "-c", "/etc/acme-limiter/nginx.conf", "-g",
                                     "daemon off;"],
            detach=True, network_mode="host", name=f"acme-limiter-{secrets.token_hex(3)}",
            volumes={str(folder): {"bind": "/etc/acme-limiter", "mode": "ro"},
                     str(PEBBLE_CA.parent): {"bind": "/etc/acme-limiter-tls", "mode": "ro"}},
        )
        self.started()

    def orders(self) -> list[Order]:
        """Every new-order request so far, oldest first (from the limiter's access log)."""
        logs = self.container.logs(stderr=False).decode(errors="replace")
        return [Order(float(m[1]), int(m[2]), m[3], m[4]) for m in _ORDER.finditer(logs)]
