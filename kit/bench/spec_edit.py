"""`kit bench --write-spec`: the recommended max_num_seqs into site.yaml, changing nothing else.

ruamel.yaml's round-trip parser finds where the service's `max_num_seqs` value is (or where its
entry's `name` ends, to add the key after it); the new text is the old one with only that span
replaced, so every other byte stays: comments, quoting, layout, CRLF line endings, a BOM and the
`---`/`...` document markers (a dump would re-emit them its own way, and a regex would miss flow
styles). The result must parse to the same document with only that value changed and load as a
valid spec before it replaces the file, atomically: through a symlink to the file it points at,
with that file's mode and owner.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from kit.errors import BadInput
from kit.files import rewrite_in_place
from kit.plan.host import host_checks
from kit.spec.edit import plain
from kit.spec.load import parse_spec

BOM = "\ufeff"
# a plain or quoted scalar as it ends in block (comment, line end) or flow (`,` `}`) context
SCALAR = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'|[^\s,}\]#]+")


def _load(text: str) -> CommentedMap:
    yaml = YAML()  # round-trip mode: every node keeps its line and column
    document = yaml.load(text)
    if not isinstance(document, CommentedMap):
        raise BadInput("the spec is not a mapping", fix="kit validate SPEC says what is wrong")
    return document


def _entry(document: CommentedMap, service: str) -> CommentedMap:
    for entry in document.get("services") or []:
        if isinstance(entry, CommentedMap) and entry.get("name") == service:
            return entry
    raise BadInput(f"no service {service!r} in the spec", fix="check --service")


def _offset(lines: list[str], line: int, column: int) -> int:
    return sum(len(text) for text in lines[:line]) + column


def with_max_num_seqs(text: str, service: str, max_num_seqs: int) -> str:
    """The spec text with services[name == service].max_num_seqs set, every other byte kept."""
    bom = BOM if text.startswith(BOM) else ""
    body = text.removeprefix(bom)
    document = _load(body)
    entry = _entry(document, service)
    lines = body.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + [lines[-1]]
    key = "max_num_seqs" if "max_num_seqs" in entry else "name"
    start = _offset(lines, *entry.lc.value(key))
    found = SCALAR.match(body, start)
    if found is None:  # a block scalar or something as odd: not a value kit edits in place
        raise BadInput(f"services[{service}].{key} is not written as a plain value",
                       fix=f"write `{key}: …` on one line, then run this again")
    if key == "max_num_seqs":
        new = body[:start] + str(max_num_seqs) + body[found.end():]
    elif entry.fa.flow_style():
        new = body[:found.end()] + f", max_num_seqs: {max_num_seqs}" + body[found.end():]
    else:  # a new line after the name's, at the name key's column, with the file's line ending
        line, column = entry.lc.key("name")
        ending = "\r\n" if lines[line].endswith("\r\n") else "\n"
        added = f"{' ' * column}max_num_seqs: {max_num_seqs}"
        if not lines[line].endswith("\n"):  # the name is on the file's last line
            new = f"{body}{ending}{added}"
        else:
            after = _offset(lines, line + 1, 0)
            new = f"{body[:after]}{added}{ending}{body[after:]}"
    _check_only_change(document, _load(new), service, max_num_seqs)
    return bom + new


def _check_only_change(before: CommentedMap, after: CommentedMap, service: str,
                       max_num_seqs: int) -> None:
    """The edited text means the old document with one value set (a guard on the splice)."""
    expected = cast(dict[str, Any], plain(before))  # before is a mapping: so is its copy
    for entry in expected["services"]:
        if entry.get("name") == service:
            entry["max_num_seqs"] = max_num_seqs
    if plain(after) != expected:
        raise BadInput(f"services[{service}] is written in a way kit cannot edit in place",
                       fix=f"set max_num_seqs: {max_num_seqs} there by hand")


def write_max_num_seqs(spec_path: Path, service: str, max_num_seqs: int) -> Path:
    """Rewrite the spec once the new text loads as a valid spec; through a symlink, the file it
    points at, keeping its mode and owner. Returns the file written."""
    text = with_max_num_seqs(Path(os.path.realpath(spec_path)).read_bytes().decode(), service,
                             max_num_seqs)
    # validated as the spec it is read as: relative paths from the folder the user named
    parse_spec(text, spec_path, host=host_checks(check_host=False, check_capacity=False))
    return rewrite_in_place(spec_path, text.encode())
