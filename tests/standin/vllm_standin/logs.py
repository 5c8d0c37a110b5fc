"""Log lines shaped like vLLM's: `(APIServer pid=N) INFO 11-29 18:35:58 [file.py:line] message`.

Informational lines go to stdout (vLLM's logging handler), tracebacks and errors to stderr, both
line-buffered so `docker logs` shows each line as it is written.
"""

from __future__ import annotations

import os
import sys
import time

API = "APIServer"
ENGINE = "EngineCore"


def _stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def _write(stream, text: str) -> None:
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()


def plain_line(level: str, source: str, message: str) -> None:
    """A line logged before vLLM prefixes its output with the process name."""
    _write(sys.stdout, f"{level} {_stamp()} [{source}] {message}")


def line(proc: str, level: str, source: str, message: str) -> None:
    stream = sys.stderr if level == "ERROR" else sys.stdout
    _write(stream, f"({proc} pid={os.getpid()}) {level} {_stamp()} [{source}] {message}")


def raw(proc: str, text: str, stream=None) -> None:
    """Lines vLLM's output prefixer tags with the process name only (tracebacks, uvicorn)."""
    prefix = f"({proc} pid={os.getpid()}) "
    _write(stream or sys.stderr, "\n".join(prefix + part for part in text.split("\n")))


def error_block(proc: str, source: str, text: str) -> None:
    """A logged exception: every line of the traceback carries the ERROR header."""
    for part in text.split("\n"):
        line(proc, "ERROR", source, part)
