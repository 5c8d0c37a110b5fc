"""Where a live site's Alertmanager delivers in the e2e tests: tests/support/alert_sink_server.py
(a webhook receiver and aiosmtpd's SMTP sink) in a container of the stand-in image on the site's
alerts-out network, aiosmtpd and its two dependencies bound in from this host's Python (pure
Python). Every delivery is read back as it arrived, with the time it arrived."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker

from tests.support.docker_engine import IMAGES

WEBHOOK_PORT = 8080
SMTP_PORT = 2525
SERVER = Path(__file__).with_name("alert_sink_server.py")
PACKAGES = ("aiosmtpd", "public", "attr", "attrs")  # aiosmtpd, atpublic, attrs


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
