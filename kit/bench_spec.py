"""`kit bench --write-spec`: the recommended max_num_seqs into site.yaml, keeping the operator's
comments, order, quoting and layout (ruamel.yaml's round trip: a regex would miss flow styles
and anchors, and a plain YAML dump would drop every comment). The result is checked with kit's
own spec loader before it replaces the file, atomically.
"""

from __future__ import annotations

import io
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.util import load_yaml_guess_indent

from kit.errors import BadInput
from kit.files import atomic_write
from kit.spec import load_spec


def with_max_num_seqs(text: str, service: str, max_num_seqs: int) -> str:
    """The spec text with services[name == service].max_num_seqs set, everything else kept."""
    # keep the file's indentation: list items at `sequence` (their dash at `offset`), mappings
    # at what is left of that once the dash is taken out
    _, sequence, offset = load_yaml_guess_indent(text)
    yaml = YAML()  # round-trip mode
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap the operator's long lines
    if sequence is not None:
        offset = offset or 0
        yaml.indent(mapping=sequence - offset if offset else sequence, sequence=sequence,
                    offset=offset)
    document = yaml.load(text)
    for entry in document.get("services") or []:
        if entry.get("name") == service:
            entry["max_num_seqs"] = max_num_seqs
            break
    else:
        raise BadInput(f"no service {service!r} in the spec", fix="check --service")
    out = io.StringIO()
    yaml.dump(document, out)
    return out.getvalue()


def write_max_num_seqs(spec_path: Path, service: str, max_num_seqs: int) -> None:
    """Rewrite the spec file in place once the new text loads as a valid spec."""
    text = with_max_num_seqs(spec_path.read_text(), service, max_num_seqs)
    staged = spec_path.with_name(f".{spec_path.name}.bench")
    staged.write_text(text)
    try:
        load_spec(staged, check_host=False, check_capacity=False)
    finally:
        staged.unlink(missing_ok=True)
    atomic_write(spec_path, text.encode(), mode=spec_path.stat().st_mode & 0o777)
