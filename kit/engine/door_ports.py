"""The front door's published ports, knocked on from where clients come.

A healthy nginx inside its container says nothing about the port the engine publishes for it:
the engine's port forwarder can die (docker-proxy under thousands of idle connections, a
firewall reload flushing its rules) while the container runs on. `kit status` shows each port's
answer, and `kit up` counts a port that does not answer as drift of the front door
(kit/converge/reconcile.py recreates it, which makes the engine publish its ports again; the gate
proves it). Stdlib sockets only: the answer must be what any client would see.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

KNOCK_TIMEOUT_S = 3.0
EVERY_ADDRESS = ("0.0.0.0", "::", "")
CLOSED = "accepted and closed without an answer"  # a forwarder with nothing behind it


@dataclass(frozen=True)
class PortProblem:
    """Why a port did not answer; `host_answered`: the host itself refused or cut the
    connection (nothing answers behind the port), not a timeout that a firewall between this
    machine and a remote engine could cause."""

    reason: str
    host_answered: bool


@dataclass(frozen=True)
class PortAnswer:
    """One published port of the running front door and what a client got there."""

    address: str
    port: int
    tls: bool
    problem: PortProblem | None  # None: it answered
    local_engine: bool  # the engine runs here: any failure is the port's own

    @property
    def answers(self) -> bool:
        return self.problem is None

    @property
    def dead(self) -> bool:
        """Certainly broken at the engine (kit up repairs it): every failure on this host's own
        engine; on a remote one only a refusal or reset from that host."""
        return self.problem is not None and (self.local_engine or self.problem.host_answered)

    @property
    def what(self) -> str:
        return f"{'https' if self.tls else 'http'} port {self.address}:{self.port}"

    def __str__(self) -> str:
        if self.problem is None:
            return f"{self.what} answers ({'TLS handshake' if self.tls else 'HTTP'})"
        return f"{self.what} DOES NOT ANSWER: {self.problem.reason}"

    def to_json(self) -> dict:
        return {"address": self.address, "port": self.port, "tls": self.tls,
                "answers": self.answers,
                "problem": self.problem.reason if self.problem else None}


def knock(address: str, port: int, server_name: str | None,
          timeout: float = KNOCK_TIMEOUT_S) -> PortProblem | None:
    """A TLS handshake (with `server_name`) or an HTTP request on one port; None when it
    answered. Trust is not judged here (the gate does): only that something answers."""
    try:
        with socket.create_connection((address, port), timeout) as raw:
            raw.settimeout(timeout)
            if server_name is not None:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                with context.wrap_socket(raw, server_hostname=server_name):
                    return None
            raw.sendall(b"HEAD / HTTP/1.0\r\nUser-Agent: kit-status\r\n\r\n")
            if raw.recv(5) == b"HTTP/":
                return None
            return PortProblem(CLOSED, host_answered=True)
    except ConnectionRefusedError:
        return PortProblem("connection refused", host_answered=True)
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return PortProblem(CLOSED, host_answered=True)
    except TimeoutError:
        return PortProblem(f"no answer within {timeout:g} s", host_answered=False)
    except ssl.SSLError as error:
        return PortProblem(f"TLS handshake failed: {error.reason or error}", host_answered=True)
    except OSError as error:
        return PortProblem(error.strerror or str(error), host_answered=False)
