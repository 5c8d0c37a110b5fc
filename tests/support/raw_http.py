"""Requests written byte for byte (what http.client refuses to send: duplicate headers, broken
framing, huge lines, other HTTP versions), over TLS to the front door or in plain HTTP."""

import socket
from dataclasses import dataclass

from kit.front_door.gate import Gate


@dataclass(frozen=True)
class RawReply:
    status: int
    headers: dict[str, str]  # lower-case names; the last of a repeated header
    body: bytes  # as sent, undecoded


def parse_reply(data: bytes) -> RawReply:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return RawReply(int(status_line.split(" ")[1]), headers, body)


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        length = int(size.split(b";")[0], 16)
        if length == 0:
            break
        out, data = out + data[:length], data[length + 2:]
    return out


def exchange(gate: Gate, request: bytes, *, tls: bool = True, port: int | None = None,
             timeout: float = 20) -> RawReply:
    """Send `request` on a fresh connection and read until nginx closes it (each request here
    says `Connection: close` or is one nginx refuses and closes)."""
    target = gate.target
    port = port or (target.https_port if tls else target.http_port)
    raw = socket.create_connection((target.address, port), timeout)
    sock = gate.context.wrap_socket(raw, server_hostname=target.domain) if tls else raw
    with sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return parse_reply(data)


def request(method: str, target: str, host: str, headers: list[tuple[str, str]] = (),
            body: bytes = b"", version: str = "HTTP/1.1") -> bytes:
    """A request with `Connection: close`, Content-Length when there is a body."""
    lines = [f"{method} {target} {version}", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
