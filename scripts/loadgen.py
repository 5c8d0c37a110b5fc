#!/usr/bin/env python3
"""Concurrent streamed chat completions against one endpoint; prints one JSON line of figures.

stdlib only (it runs inside a container of the stack's network as well as on the host):

    python3 loadgen.py --url https://nginx:443 --host llm.example.com --ca ca.crt \
        --auth "Basic …" --model llama-3.1-8b --streams 200 --tokens 64

Measures, over all streams: TTFT (request sent → first content chunk) p50/p99, tokens/s (content
chunks received / wall time of the run), the worst gap between two chunks of one stream, and
failures (non-200, truncated streams without [DONE], errors).
"""

import argparse
import asyncio
import json
import ssl
import statistics
import time
from urllib.parse import urlsplit


async def one_stream(args: argparse.Namespace, context: ssl.SSLContext | None, start: asyncio.Event,
                     results: list[dict]) -> None:
    url = urlsplit(args.url)
    port = url.port or (443 if url.scheme == "https" else 80)
    body = json.dumps({
        "model": args.model, "stream": True, "max_tokens": args.tokens,
        "messages": [{"role": "user", "content": "Count slowly."}],
    }).encode()
    headers = [
        f"POST /v1/chat/completions HTTP/1.1", f"Host: {args.host or url.hostname}",
        "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close",
    ]
    if args.auth:
        headers.append(f"Authorization: {args.auth}")
    request = ("\r\n".join(headers) + "\r\n\r\n").encode() + body
    await start.wait()
    record: dict = {"ok": False, "chunks": 0, "gaps": [], "ttft": None}
    try:
        reader, writer = await asyncio.open_connection(
            url.hostname, port, ssl=context, server_hostname=(args.host or url.hostname)
            if context else None,
        )
        sent = time.perf_counter()
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
        record["status"] = int(status_line.split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        last = None
        done = False
        buffer = b""
        while not done:
            size_line = await reader.readline()
            if not size_line:
                break
            size = int(size_line.strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            now = time.perf_counter()
            buffer += data[:-2]
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]":
                    done = True
                    break
                if b'"content":"' in payload and b'"content":""' not in payload:
                    if record["ttft"] is None:
                        record["ttft"] = now - sent
                    elif last is not None:
                        record["gaps"].append(now - last)
                    record["chunks"] += 1
                    last = now
        record["ok"] = done and record["status"] == 200
        writer.close()
    except (OSError, ValueError, asyncio.IncompleteReadError) as error:
        record["error"] = f"{type(error).__name__}: {error}"
    results.append(record)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


async def run(args: argparse.Namespace) -> dict:
    context = None
    if urlsplit(args.url).scheme == "https":
        context = ssl.create_default_context(cafile=args.ca)
    results: list[dict] = []
    start = asyncio.Event()
    tasks = [asyncio.create_task(one_stream(args, context, start, results))
             for _ in range(args.streams)]
    await asyncio.sleep(0.2)
    began = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    return {
        "streams": args.streams,
        "ok": sum(r["ok"] for r in results),
        "failed": sum(not r["ok"] for r in results),
        "errors": sorted({r.get("error", f"status {r.get('status')}") for r in results
                          if not r["ok"]})[:5],
        "tokens": sum(r["chunks"] for r in results),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(r["chunks"] for r in results) / wall, 1),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
        "ttft_p99_ms": round(percentile(ttfts, 0.99) * 1000, 1) if ttfts else None,
        "worst_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
        "gap_p99_ms": round(percentile(gaps, 0.99) * 1000, 1) if gaps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--host", help="Host header and TLS server name (default: URL host)")
    parser.add_argument("--ca", help="CA bundle to verify the server against")
    parser.add_argument("--auth", help="Authorization header value")
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=64)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
