"""The stand-in's `/v1/responses` and `/v1/embeddings` bodies (NOT vLLM: its shapes rebuilt).

No trace of these routes was taken on a real vLLM; the layouts follow vLLM 0.33's own
definitions: `ResponsesResponse` and `ResponseUsage` (vllm/entrypoints/openai/responses/
protocol.py, field order kept), the streamed events as its Responses router writes them
(`event: <type>\\ndata: <json>\\n\\n`, a `sequence_number` each, no `[DONE]`; the usage only in
`response.completed`), and the pooling `EmbeddingResponse` with vLLM's `UsageInfo` (prompt
tokens, `completion_tokens: 0`).
"""

from __future__ import annotations

import base64
import json
import math
import random
import secrets
import struct
import time
import zlib


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def response_usage(prompt: int, generated: int) -> dict:
    """vLLM's ResponseUsage (the per-turn lists stay empty for a single turn)."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "input_tokens_per_turn": [],
                                 "cached_tokens_per_turn": []},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": prompt + generated,
    }


class ResponseShape:
    """What every answer to one /v1/responses request repeats: the response object, its one
    output message. A request ends by length here, so a finished response is `incomplete`
    with `max_output_tokens` as the reason, as vLLM reports a response cut by its limit."""

    def __init__(self, body: dict, *, model: str, max_tokens: int, prompt_tokens: int):
        self.body, self.model, self.max_tokens = body, model, max_tokens
        self.prompt_tokens = prompt_tokens
        self.rid = f"resp_{secrets.token_hex(16)}"
        self.message_id = f"msg_{secrets.token_hex(16)}"
        self.created = int(time.time())

    def message(self, text: str | None) -> dict:
        content = [] if text is None else [
            {"annotations": [], "text": text, "type": "output_text", "logprobs": None}]
        return {"id": self.message_id, "content": content, "role": "assistant",
                "status": "in_progress" if text is None else "completed", "type": "message"}

    def response(self, text: str | None, generated: int = 0) -> dict:
        done = text is not None
        return {
            "id": self.rid, "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"} if done else None,
            "instructions": self.body.get("instructions"), "metadata": self.body.get("metadata"),
            "model": self.model, "object": "response",
            "output": [self.message(text)] if done else [],
            "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "tools": [],
            "top_p": 1.0, "background": False, "max_output_tokens": self.max_tokens,
            "max_tool_calls": None, "previous_response_id": None, "prompt": None,
            "reasoning": None, "service_tier": "auto",
            "status": "incomplete" if done else "in_progress", "text": None,
            "top_logprobs": None, "truncation": "disabled",
            "usage": response_usage(self.prompt_tokens, generated) if done else None,
            "user": None, "input_messages": None, "output_messages": None,
        }


class ResponsesStreamSink:
    """The streamed events of one response, written as the engine produces tokens."""

    def __init__(self, conn, shape: ResponseShape):
        self.conn, self.shape = conn, shape
        self.sequence = 0
        self.parts: list[str] = []

    def event(self, kind: str, **fields: object) -> bytes:
        data = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        """What vLLM sends before the first token: the response created and in progress."""
        shape = self.shape
        return (self.event("response.created", response=shape.response(None))
                + self.event("response.in_progress", response=shape.response(None)))

    def on_token(self, index: int, text: str, last: bool) -> None:
        shape, item = self.shape, self.shape.message_id
        events = []
        if index == 0:
            events += [
                self.event("response.output_item.added", item=shape.message(None),
                           output_index=0),
                self.event("response.content_part.added", content_index=0, item_id=item,
                           output_index=0, part={"annotations": [], "text": "",
                                                 "type": "output_text", "logprobs": []}),
            ]
        self.parts.append(text)
        events.append(self.event("response.output_text.delta", content_index=0, delta=text,
                                 item_id=item, logprobs=[], output_index=0))
        if last:
            whole = "".join(self.parts)
            events += [
                self.event("response.output_text.done", content_index=0, item_id=item,
                           logprobs=[], output_index=0, text=whole),
                self.event("response.content_part.done", content_index=0, item_id=item,
                           output_index=0, part={"annotations": [], "text": whole,
                                                 "type": "output_text", "logprobs": None}),
                self.event("response.output_item.done", item=shape.message(whole),
                           output_index=0),
                self.event("response.completed", response=shape.response(whole, index + 1)),
            ]
        self.conn.write_events(*events, end=last, usage_chunks=int(last))  # response.completed


class ResponsesCollectSink:
    """A non-streamed response: one JSON body once the last token is generated."""

    def __init__(self, conn, request, shape: ResponseShape):
        self.conn, self.request, self.shape = conn, request, shape
        self.parts: list[str] = []

    def on_token(self, index: int, text: str, last: bool) -> None:
        self.parts.append(text)
        if last and not self.conn.transport.is_closing():
            self.conn.send(self.request, 200,
                           dumps(self.shape.response("".join(self.parts), index + 1)))


def embedding_inputs(value: object) -> list | None:
    """The inputs of an embeddings request (a text, texts, token ids or lists of them), one
    vector each; None when it is none of those."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [value]
        if all(isinstance(v, str) for v in value) or all(
                isinstance(v, list) and v and all(isinstance(i, int) for i in v)
                for v in value):
            return list(value)
    return None


def embedding(tokens: list[str], size: int, encoding: str) -> list[float] | str:
    """A unit vector of `size` numbers, the same for the same tokens (no model: made up)."""
    rng = random.Random(zlib.crc32("\x00".join(tokens).encode()))
    vector = [rng.gauss(0.0, 1.0) for _ in range(size)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    vector = [v / norm for v in vector]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
    return vector


def embedding_body(model: str, vectors: list, prompt_tokens: int) -> bytes:
    """vLLM's EmbeddingResponse: data in input order, then the usage (UsageInfo)."""
    return dumps({
        "id": f"embd-{secrets.token_hex(16)}", "object": "list",
        "created": int(time.time()), "model": model,
        "data": [{"index": i, "object": "embedding", "embedding": v}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
                  "completion_tokens": 0, "prompt_tokens_details": None},
    })
