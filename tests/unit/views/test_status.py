"""kit status that does not lie, and kit up repairing what it shows, on the fake engine: a front
door whose published port is dead, a last probe of a stack that no longer runs."""

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kit.converge.apply import Executor
from kit.converge.reconcile import RecreateContainer, down_actions
from kit.engine.door_ports import PortProblem, knock
from kit.site import Site
from kit.stack.up import up_site
from kit.views.status import gather, render_text
from tests.support.fake_engine import HealthyEngine, engine_with_images
from tests.support.sites import write_site

HTTPS_PORT = 18443  # write_site's proxy ports, bound to 127.0.0.1
REFUSED = PortProblem("connection refused", host_answered=True)


def brought_up(tmp_path: Path) -> tuple[Site, HealthyEngine]:
    site = Site.load(write_site(tmp_path))
    engine = engine_with_images()  # no host bind checks; ports are knocked through it
    up(site, engine)
    return site, engine


def up(site: Site, engine: HealthyEngine, reported: list[str] | None = None):
    return up_site(Site.load(site.spec_path), timeout=5, probe=False,
                   report=(reported if reported is not None else []).append,
                   warn=lambda _: None, connect=lambda: engine)


def test_a_dead_published_port_is_shown_and_kit_up_recreates_the_front_door(
    tmp_path: Path,
) -> None:
    site, engine = brought_up(tmp_path)
    healthy = gather(site, engine)
    assert [str(port) for port in healthy.door] == [
        "https port 127.0.0.1:18443 answers (TLS handshake)",
        "http port 127.0.0.1:18080 answers (HTTP)"]
    assert ("127.0.0.1", HTTPS_PORT, "llm.test.internal") in engine.knocked  # SNI: the domain
    assert healthy.drift == ()

    engine.dead_ports[HTTPS_PORT] = REFUSED  # the engine's forwarder died; nginx runs on
    status = gather(site, engine)
    text = render_text(status, datetime.now(UTC))
    assert "front door: https port 127.0.0.1:18443 DOES NOT ANSWER: connection refused" in text
    assert "front door: http port 127.0.0.1:18080 answers (HTTP)" in text
    assert "kit up recreates it" in text
    assert len(status.drift) == 1 and status.drift[0].startswith(
        "recreate container unit01-nginx-1: nginx runs healthy but https port 127.0.0.1:18443 "
        "(connection refused) does not answer")
    report = status.to_json(datetime.now(UTC))
    assert report["front_door_ports"][0] == {
        "address": "127.0.0.1", "port": HTTPS_PORT, "tls": True, "answers": False,
        "problem": "connection refused"}
    json.dumps(report)

    reported: list[str] = []
    repaired = up(site, engine, reported)
    (recreate,) = [a for a in repaired.converged.actions if isinstance(a, RecreateContainer)]
    assert recreate.service.name == "nginx"
    assert repaired.summary().startswith("stack unit01: 1 change(s) applied")
    repair = "recreate container unit01-nginx-1: nginx runs healthy but https port"
    assert any(line.startswith(repair) for line in reported)
    assert engine.dead_ports == {}  # the new container's start published its ports again
    assert all(port.answers for port in gather(site, engine).door)
    assert up(site, engine).converged.actions == []


def test_a_remote_port_that_times_out_is_shown_but_not_repaired(tmp_path: Path) -> None:
    """From here a timeout to a remote engine's host may be a firewall in between: shown, but
    kit up does not recreate the front door over it (a refusal from that host it would)."""
    site, engine = brought_up(tmp_path)
    engine.dead_ports[HTTPS_PORT] = PortProblem("no answer within 3 s", host_answered=False)
    status = gather(site, engine)
    assert "DOES NOT ANSWER: no answer within 3 s" in render_text(status, datetime.now(UTC))
    assert status.drift == ()


def test_an_unhealthy_front_door_is_waited_for_not_recreated_over_its_port(
    tmp_path: Path,
) -> None:
    site, engine = brought_up(tmp_path)
    engine.set_health("unit01-nginx-1", "unhealthy")
    engine.dead_ports[HTTPS_PORT] = REFUSED
    assert not any(line.startswith("recreate") for line in gather(site, engine).drift)


def test_the_last_probe_of_a_stack_that_no_longer_runs_is_shown_stale(tmp_path: Path) -> None:
    site, engine = brought_up(tmp_path)
    now = datetime.now(UTC)
    site.layout.last_probe.write_text(json.dumps(
        {"ok": True, "target": "x", "checked_at": (now + timedelta(seconds=1)).isoformat(),
         "checks": [{"name": "tls", "ok": True}]}))
    assert gather(site, engine).probe_stale is None
    assert "last probe: passed at " in render_text(gather(site, engine), now)

    Executor(engine, site.layout.applied, wait=lambda _: None, report=lambda _: None).run(
        down_actions(site.observe(engine, with_images=False), volumes=False))
    down = gather(site, engine)
    assert down.probe_stale == "the front door it probed no longer runs"
    assert "(stale: the front door it probed no longer runs)" in render_text(down, now)
    assert down.to_json(now)["last_probe_stale"] == "the front door it probed no longer runs"

    up(site, engine)  # a front door started after the probe: that probe is not of it
    site.layout.last_probe.write_text(json.dumps(
        {"ok": True, "target": "x", "checked_at": (now - timedelta(hours=1)).isoformat(),
         "checks": []}))
    assert gather(site, engine).probe_stale == "the front door restarted after it was taken"


# --------------------------------------------------------------------------- knock, for real


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def serve_once(server: socket.socket, answer) -> threading.Thread:
    def run() -> None:
        connection, _ = server.accept()
        with connection:
            answer(connection)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_knock_tells_an_answering_port_from_a_dead_one(listener: socket.socket,
                                                        tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    serve_once(listener, lambda c: (c.recv(100), c.sendall(b"HTTP/1.1 301 Moved\r\n\r\n")))
    assert knock("127.0.0.1", port, None) is None
    serve_once(listener, lambda c: c.close())  # a forwarder with nothing behind it
    closed = PortProblem("accepted and closed without an answer", host_answered=True)
    assert knock("127.0.0.1", port, None) == closed
    serve_once(listener, lambda c: c.close())
    assert knock("127.0.0.1", port, "llm.test.internal") == closed
    listener.close()
    assert knock("127.0.0.1", port, "llm.test.internal") == REFUSED


def test_knock_completes_a_tls_handshake_whoever_signed_the_certificate(
    listener: socket.socket, tmp_path: Path,
) -> None:
    """Trust is the gate's question: status asks only whether TLS answers."""
    from kit.credentials.tls import self_signed_files
    from kit.layout import SiteLayout

    files = self_signed_files(SiteLayout(tmp_path), "unit01", "llm.test.internal")
    (tmp_path / "c.pem").write_bytes(files.server_cert)
    (tmp_path / "k.pem").write_bytes(files.server_key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")

    def handshake(connection: socket.socket) -> None:
        with context.wrap_socket(connection, server_side=True) as tls:
            tls.recv(1)

    thread = serve_once(listener, handshake)
    assert knock("127.0.0.1", listener.getsockname()[1], "llm.test.internal") is None
    thread.join(5)
