"""Reading kit's own state files (under <site>/.kit/ and the credential files): one rule for all.

A file that does not exist means "nothing recorded yet" (None). A file that exists but cannot be
read or parsed is bad input naming the file and how to recover: never a traceback, and never
silently taken for empty, since that would forget credentials or what nginx has loaded.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kit.errors import BadInput
from kit.files import read_existing

T = TypeVar("T")


def read_state(path: Path, parse: Callable[[str], T], *, fix: str) -> T | None:
    """`parse` of the file's text; None when it does not exist; BadInput when it is broken.

    Reading is `files.read_existing` (the one rule for absent and unreadable files); what
    this adds is the parse, with `fix` saying how to recover from a corrupt file."""
    content = read_existing(path)
    if content is None:
        return None
    try:
        return parse(content.decode())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise BadInput(f"{path} is corrupt ({error})", fix=fix) from None


def json_object(text: str) -> dict[str, Any]:
    """A JSON document that must be an object (state files are never bare lists or numbers)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, found {type(value).__name__}")
    return value
