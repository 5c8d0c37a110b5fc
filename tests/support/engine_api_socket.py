"""A Docker Engine API on a unix socket that answers the exec calls (create, start, inspect) the
way dockerd does, writing each answer in ONE send — the headers and the first frames of an exec's
output together, as a loaded engine's socket delivers them — so a client that reads the socket
beneath its HTTP reader loses them."""

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXEC_ID = "5e1ec7ed" * 8


def frame(stream: int, payload: bytes) -> bytes:
    """One frame of a non-TTY exec's output: stream, three zero bytes, size big-endian, bytes."""
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def _answer(status: str, body: bytes, content_type: str, length: bool = True) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
    head += f"Content-Length: {len(body)}\r\n" if length else "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


def _serve(server: socket.socket, output: bytes, exit_code: int, started: list[dict],
           running_inspects: int) -> None:
    inspects = 0
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return  # closed: the test is over
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += connection.recv(65536)
            path = head.split(b" ")[1].decode()
            if path.endswith("/start"):
                started.append({"path": path, "body": json.loads(body),
                                "upgrade": b"upgrade:" in head.lower()})
                answer = _answer("200 OK", output, "application/vnd.docker.raw-stream",
                                 length=False)
            elif path.endswith("/json"):
                inspects += 1
                state = ({"Running": True, "ExitCode": None} if inspects <= running_inspects
                         else {"Running": False, "ExitCode": exit_code})
                answer = _answer("200 OK", json.dumps(state).encode(), "application/json")
            else:
                answer = _answer("201 Created", json.dumps({"Id": EXEC_ID}).encode(),
                                 "application/json")
            connection.sendall(answer)


@contextmanager
def engine_api(folder: Path, output: bytes, exit_code: int = 0,
               running_inspects: int = 0) -> Iterator[tuple[str, list]]:
    """(the engine's address, the exec starts it saw) for an engine whose execs write `output`
    (framed bytes) and exit with `exit_code` — inspected as still running, with no exit code,
    the first `running_inspects` times (an exit the engine has not processed yet)."""
    path = folder / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    started: list[dict] = []
    thread = threading.Thread(target=_serve, args=(server, output, exit_code, started,
                                                            running_inspects),
                              daemon=True)
    thread.start()
    try:
        yield f"unix://{path}", started
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=5)
