"""A client that sends request after request with no pause through the real door
(tests/support/door_ns.py): each sent the moment the one before told its end, on a connection
opened beforehand — the client a budget counted only after the answer would let past it."""

from __future__ import annotations

import json
import re
import ssl
from itertools import cycle

from tests.support.door_ns import Door
from tests.support.raw_http import RawReply, parse_reply
from tests.support.raw_http import request as raw_request

# In turn: a stream whose client asked for usage, one whose client did not (the door takes the
# usage out), a whole answer. The same prompt and max_tokens: the same tokens each.
KINDS = ("stream_usage", "stream_plain", "answer")
CONTENT_LENGTH = re.compile(rb"(?im)^content-length: *(\d+)")


def _body(kind: str, model: str) -> bytes:
    body: dict = {"model": model, "prompt": "Hi", "max_tokens": 6}
    if kind != "answer":
        body["stream"] = True
    if kind == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def _read_until_told(sock: ssl.SSLSocket) -> RawReply:
    """What came until the answer told its end — a stream's `data: [DONE]` event, an answer's
    last byte (its Content-Length) — without waiting for anything after it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, found, body = data.partition(b"\r\n\r\n")
        length = CONTENT_LENGTH.search(head)
        if found and (len(body) >= int(length.group(1)) if length else b"data: [DONE]" in body):
            break
    return parse_reply(data)


def usage_tokens(reply: RawReply) -> int | None:
    """prompt + completion tokens of an answer or of a stream's usage chunk (None: none)."""
    for part in [reply.body, *reply.body.split(b"data: ")[::-1]]:
        try:
            usage = json.loads(part).get("usage")
        except (ValueError, AttributeError):
            continue
        if usage:
            return usage["prompt_tokens"] + usage["completion_tokens"]
    return None


def back_to_back(door: Door, host: str, key: str, model: str,
                 limit: int = 200) -> tuple[list[int], RawReply]:
    """Completions one after another (KINDS in turn) until the door refuses one: each admitted
    one's tokens as the engine counted them, and the refusal."""
    headers = [("Authorization", f"Bearer {key}"), ("Content-Type", "application/json")]
    spent: list[int] = []
    with door.inside():
        waiting = door.connect()
    for kind in cycle(KINDS):
        sock = waiting
        with door.inside():
            waiting = door.connect()  # the next request's connection, opened beforehand
        with sock:
            sock.sendall(raw_request("POST", "/v1/completions", host, headers, _body(kind, model)))
            reply = _read_until_told(sock)
        if reply.status != 200 or len(spent) >= limit:
            waiting.close()
            return spent, reply
        tokens = usage_tokens(reply)
        assert (tokens is None) == (kind == "stream_plain"), (kind, reply.body[-300:])
        spent.append(spent[-1] if tokens is None else tokens)  # the first is stream_usage
    raise AssertionError("cycle() never ends")
