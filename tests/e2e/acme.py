"""A real ACME CA for the e2e tests: Debian's pebble (kit-test/pebble:2.4, tests/images/build.sh)
in the engine's network namespace, with its mock DNS answering every name with ACME_ADDRESS.

ACME_ADDRESS is an extra address of the namespace's loopback: sites publish on it (proxy.bind
0.0.0.0), certbot's containers reach pebble on it through their bridge's gateway, and pebble
validates HTTP-01 against `http://DOMAIN:<the site's http_port>/` there. So the site's domain
resolves to the test stack for pebble only, and nothing leaves the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import docker

from tests.e2e.conftest import IMAGES

ACME_ADDRESS = "10.77.0.1"  # also in tests/images/build.sh: pebble's HTTPS certificate names it
ACME_PORT = 14000  # pebble's directory; its management API (the roots) on the next port
# build.sh made it: it signs pebble's HTTPS certificate
PEBBLE_CA = Path(os.environ.get("KIT_TEST_CACHE", "/var/cache/kit-test")) / "acme-ca" / "ca.crt"


def directory(port: int) -> str:
    """The ACME directory URL of a pebble on `port` (tls.acme_server)."""
    return f"https://{ACME_ADDRESS}:{port}/dir"


def add_acme_address() -> None:
    """ACME_ADDRESS on this namespace's loopback (idempotent; the engine's own namespace)."""
    shown = subprocess.run(["ip", "-4", "addr", "show", "dev", "lo"], capture_output=True,
                           text=True, check=True).stdout
    if f"{ACME_ADDRESS}/32" not in shown:
        subprocess.run(["ip", "addr", "add", f"{ACME_ADDRESS}/32", "dev", "lo"], check=True)


class Pebble:
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
        try:
            self.wait_ready()
        except AssertionError:
            self.remove()
            raise

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
                    why = f"pebble did not answer {self.directory}:\n{logs}"
                    raise AssertionError(why) from None
                time.sleep(0.2)

    def root(self) -> bytes:
        """The root pebble issues under (made at its start): what the test alone trusts."""
        context = ssl.create_default_context(cafile=str(PEBBLE_CA))
        url = f"https://{ACME_ADDRESS}:{self.port + 1}/roots/0"
        return urllib.request.urlopen(url, context=context, timeout=5).read()

    def remove(self) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)
