"""site.yaml edited by kit itself (`kit adapters add|remove`): one entry of a service's
`adapters:` added or removed, every other byte kept.

ruamel.yaml's round-trip keeps comments, quoting and flow or block style; what it cannot keep
is a layout of its own choosing (indentation, line width). So the edit is made with the dump
layout that reproduces the unedited file byte for byte: the edited text then differs only
where the entry is. A file no layout reproduces (odd indentation, a BOM-less mix of line
endings...) is refused, naming the hand edit to make instead. The result must mean the old
document with exactly that change (a guard on the round-trip) before anyone writes it.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from kit.errors import BadInput

BOM = "\ufeff"
# (mapping, sequence, offset) indentations tried in turn: the usual `- ` under its key (2, 4, 2:
# kit init's layout), at its key's column (2, 2, 0: PyYAML's), and four-space mappings.
LAYOUTS = ((2, 4, 2), (2, 2, 0), (4, 4, 0), (4, 6, 4), (4, 4, 2))
WIDTH = 4096  # never fold a long line the file did not fold


def _yaml(layout: tuple[int, int, int] | None = None) -> YAML:
    yaml = YAML()  # round-trip
    yaml.preserve_quotes = True
    yaml.width = WIDTH
    if layout is not None:
        mapping, sequence, offset = layout
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _dump(document: Any, layout: tuple[int, int, int]) -> str:
    buffer = io.StringIO()
    _yaml(layout).dump(document, buffer)
    return buffer.getvalue()


def plain(node: object) -> object:
    """A round-trip document as plain dicts and lists (what it means, without its layout)."""
    if isinstance(node, dict):
        return {key: plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [plain(value) for value in node]
    return node


def _service(document: Any, service: str) -> CommentedMap:
    for entry in (document.get("services") or []) if isinstance(document, dict) else []:
        if isinstance(entry, CommentedMap) and entry.get("name") == service:
            return entry
    raise BadInput(f"no service {service!r} in the spec", fix="name a service of site.yaml")


def edit_adapters(text: str, service: str, *, add: dict[str, str] | None = None,
                  remove: str | None = None) -> str:
    """The spec text with `add` (an adapter's keys) appended to services[name == service]
    .adapters, or the adapter named `remove` taken out of it; every other byte kept."""
    bom = BOM if text.startswith(BOM) else ""
    body = text.removeprefix(bom)
    crlf = "\r\n" in body
    if crlf:
        if body.replace("\r\n", "").count("\n"):
            raise BadInput("site.yaml mixes CRLF and LF line endings: kit cannot keep both",
                           fix="convert it to one kind of line ending, then run this again")
        body = body.replace("\r\n", "\n")
    document = _yaml().load(body)
    layout = next((layout for layout in LAYOUTS if _dump(document, layout) == body), None)
    if layout is None:
        raise BadInput("site.yaml is laid out in a way kit cannot reproduce, so it would not "
                       "edit it without changing other lines",
                       fix="make the change to the service's adapters: by hand and run kit up")
    expected = plain(document)
    entry = _service(document, service)
    names = [a.get("name") for a in entry.get("adapters") or [] if isinstance(a, dict)]
    if add is not None:
        new = CommentedMap(add)
        adapters = entry.get("adapters")
        if adapters is None:
            adapters = CommentedSeq()
            adapters.fa.set_flow_style()
            entry.insert(list(entry).index("name") + 1, "adapters", adapters)
        last = adapters[-1] if adapters else None
        if adapters.fa.flow_style() or (isinstance(last, CommentedMap)
                                        and last.fa.flow_style()):
            new.fa.set_flow_style()  # as the list's other entries are written
        adapters.append(new)
    if remove is not None:
        if remove not in names:
            raise BadInput(f"service {service} declares no adapter {remove!r}",
                           fix=f"name one of: {', '.join(map(str, names)) or '(none)'}")
        adapters = entry["adapters"]
        del adapters[names.index(remove)]
    changed = plain(document)
    _check_only_change(expected, changed, service, add, remove)
    new_body = _dump(document, layout)
    return bom + (new_body.replace("\n", "\r\n") if crlf else new_body)


def _check_only_change(before: Any, after: Any, service: str, add: dict[str, str] | None,
                       remove: str | None) -> None:
    """The edited document is the old one with that entry added or removed, nothing else."""
    for entry in before["services"]:
        if entry.get("name") == service:
            adapters = [a for a in entry.get("adapters") or [] if a.get("name") != remove]
            entry["adapters"] = adapters + ([add] if add else [])
    for entry in after["services"]:
        entry.setdefault("adapters", [])
    for entry in before["services"]:
        entry.setdefault("adapters", [])
    if before != after:
        raise BadInput(f"services[{service}] is written in a way kit cannot edit in place",
                       fix="make the change to its adapters: by hand and run kit up")
