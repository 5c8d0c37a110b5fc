"""Proof that an air-gapped host attempted no outbound connection: its namespace's only link
(and its default route) leads to this end of a veth pair, where a raw packet socket records
every frame the host sends.

Any attempt to reach an address outside the namespace — a TCP or UDP send, a DNS query —
first asks for the gateway's address (ARP) or sends the packet itself over that link, so it
is recorded whatever process made it (kit, dockerd, a container) and however it failed
afterwards. IPv6 is switched off in the namespace so its kernel sends nothing unasked (router
and neighbour solicitations); `attempt` makes one connection attempt on purpose, to prove the
recorder sees one.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from dataclasses import dataclass, field

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # a frame this end sent (not one from the namespace)
ETHERTYPES = {0x0800: "IPv4", 0x0806: "ARP", 0x86DD: "IPv6"}


@dataclass
class EgressRecorder:
    """Frames arriving from the namespace over `interface` (this end of its veth)."""

    interface: str
    frames: list[str] = field(default_factory=list)  # "ARP 42 bytes", "IPv4 74 bytes to …"
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._socket.bind((self.interface, 0))
        self._socket.settimeout(0.2)
        self._thread = threading.Thread(target=self._record, daemon=True)
        self._thread.start()

    def _record(self) -> None:
        while not self._stop.is_set():
            try:
                frame, address = self._socket.recvfrom(65535)
            except TimeoutError:
                continue
            if address[2] == PACKET_OUTGOING or len(frame) < 14:
                continue
            kind = ETHERTYPES.get(int.from_bytes(frame[12:14], "big"), "other")
            where = (f" to {socket.inet_ntoa(frame[30:34])}" if kind == "IPv4" and len(frame) >= 34
                     else "")
            self.frames.append(f"{kind} {len(frame)} bytes{where}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def seal(namespace: str, gateway: str) -> None:
    """The namespace's default route through `gateway` (this end), IPv6 off: every outbound
    attempt then crosses the recorded link."""
    for key in ("all", "default", "lo"):
        _in(namespace, "sysctl", "-q", "-w", f"net.ipv6.conf.{key}.disable_ipv6=1")
    subprocess.run(["ip", "-n", namespace, "route", "replace", "default", "via", gateway],
                   check=True, capture_output=True)


def attempt(namespace: str, address: str = "203.0.113.7", port: int = 443) -> None:
    """One outbound connection attempt from the namespace (a documentation address: it goes
    nowhere), as a positive control of the recorder."""
    _in(namespace, "python3", "-c", "import socket\ntry:\n socket.create_connection("
        f"({address!r}, {port}), timeout=2)\nexcept OSError:\n pass", check=False)


def _in(namespace: str, *argv: str, check: bool = True) -> None:
    subprocess.run(["nsenter", f"--net=/run/netns/{namespace}", *argv], check=check,
                   capture_output=True)
