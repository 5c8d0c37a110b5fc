"""Loading a spec: YAML with the position of every key, pydantic, the cross-field checks.

1. YAML → Python with the position of every key recorded; duplicate keys, anchors/aliases, deep
   nesting, over-long numbers and oversized files refused here (a hostile spec fails fast);
2. pydantic field rules, strict (no bool or string coercion into numbers), every text value
   allow-listed by what it is (kit.names);
3. checks across fields (kit/spec/checks.py), then the caller's `host` checks (TLS files, model
   directories and capacity: kit/plan/host.py), on every part that passed 2, so a typo in one key
   does not hide a problem elsewhere.
Every problem is reported with file:line:col, not only the first.
"""

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)
from pydantic_core import ErrorDetails

from kit.errors import BadInput
from kit.spec.checks import Parts, cross_checks
from kit.spec.model import Spec
from kit.spec.problems import Located, SpecError, SpecProblem, dotted

# What a caller checks beyond the spec itself, given the parts that validated and the spec's folder.
HostChecks = Callable[[Parts, Path], list[SpecProblem]]

# Hostile YAML: a site spec is small and flat; these bounds are far above any real one.
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 16
MAX_NUMBER_CHARS = 32


# --------------------------------------------------------------------------- YAML with positions


class RefusedYaml(yaml.MarkedYAMLError):
    """YAML that parses but that a site spec never needs (and a hostile one uses)."""

    def __init__(self, problem: str, fix: str, mark: yaml.Mark):
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing and before anything is expanded, anchors and
    aliases (billion laughs, self-reference) and deep nesting (Python's recursion limit)."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise RefusedYaml(
                "anchors and aliases (&name, *name) are not allowed in a kit file",
                "write the value out where it is used", event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise RefusedYaml(
                f"nested deeper than {MAX_DEPTH} levels",
                "a site spec nests four levels at most (services[].env.NAME), site.lock six",
                event.start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def parse_yaml(text: str) -> Located:
    """YAML → plain data, remembering where each key is and refusing duplicate keys."""
    loader = _SpecLoader(text)
    try:
        root = loader.get_single_node()
        located = Located(data=None)
        if root is not None:
            located.data = _walk(root, (), located, loader)
        return located
    finally:
        loader.dispose()
COLLECTION_TAGS: dict[type[yaml.Node], str] = {
    yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"
}


def _walk(node: yaml.Node, path: tuple, located: Located, loader: yaml.SafeLoader) -> Any:
    located.marks.setdefault(path, _mark(node))
    if COLLECTION_TAGS.get(type(node), node.tag) != node.tag:
        raise RefusedYaml(f"the tag {node.tag} is not allowed in a kit file", "remove the tag",
                      node.start_mark)
    if isinstance(node, yaml.MappingNode):
        result: dict = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, path, located, loader)
            if not isinstance(key, str | int | float | bool) or key is None:
                located.problems.append(SpecProblem(path, "keys must be plain scalars"))
                continue
            child = (*path, key)
            located.marks[child] = _mark(key_node)
            if key in result:
                located.problems.append(SpecProblem(child, f"duplicate key {key!r}"))
                continue
            result[key] = _walk(value_node, child, located, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), located, loader) for i, item in enumerate(node.value)]
    return _scalar(node, path, located, loader)


def _scalar(node: yaml.Node, path: tuple, located: Located, loader: yaml.SafeLoader) -> Any:
    """One scalar (or a key) built by YAML's rules; a value Python cannot build is a problem at
    its position (a 5,000-digit number, a 30 February timestamp), never a traceback; a number
    YAML 1.1 reads in another base than the decimal one written is refused (_odd_number)."""
    if node.tag in NUMBER_TAGS and len(str(node.value)) > MAX_NUMBER_CHARS:
        located.marks.setdefault(path, _mark(node))
        located.problems.append(SpecProblem(path, f"a number of {len(node.value)} characters"))
        return None
    try:
        value = loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as error:
        located.marks.setdefault(path, _mark(node))
        located.problems.append(SpecProblem(path, f"{node.value!r} cannot be read: {error}"))
        return None
    if node.tag in NUMBER_TAGS and (odd := _odd_number(str(node.value), value)) is not None:
        located.marks.setdefault(path, _mark(node))
        located.problems.append(odd(path))
        return None
    return value


def _odd_number(text: str, value: Any) -> Callable[[tuple], SpecProblem] | None:
    """A YAML 1.1 number that is not written as the plain decimal it is read as: `010443` is
    octal (4387), `1:20` base 60 (80), `0x10`, `0b11`, `1_000`. None for a plain number."""
    digits = text.lstrip("+-")
    if ":" in digits:
        kind, meant = "a base-60 number", str(value)
    elif digits[:2].lower() in ("0x", "0b"):
        kind = "a hexadecimal number" if digits[1] in "xX" else "a binary number"
        meant = str(value)
    elif re.fullmatch(r"0[0-7_]+", digits):
        sign = text[:len(text) - len(digits)]
        kind, meant = "an octal number", sign + (digits.replace("_", "").lstrip("0") or "0")
    elif "_" in digits:
        kind, meant = "a number with '_' separators", text.replace("_", "")
    else:
        return None
    message = (f"{text} is {kind} in YAML 1.1 (it reads as {value}): kit reads numbers written "
               "in plain decimal only")
    fix = f"write {meant}, or quote the value if it is text ('{text}')"
    return lambda path: SpecProblem(path, message, fix)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


# --------------------------------------------------------------------------- loading


def read_spec(path: Path, *, host: HostChecks | None = None) -> Spec:
    """Read and validate a spec file; raise SpecError listing every problem found, the spec's
    own and those `host` finds (kit/plan/host.py: what the spec names on this machine)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise BadInput(
            f"spec file {path} does not exist",
            fix="pass the spec path (kit render path/to/site.yaml) or create one with `kit init`",
        ) from None
    except OSError as error:
        raise BadInput(f"cannot read spec file {path}: {error.strerror or error}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise BadInput(
            f"{path}: larger than {MAX_SPEC_BYTES >> 20} MiB; a site spec is a few KiB",
            fix="pass the site.yaml, not another file",
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        line, column = _line_column(raw, error.start)
        raise BadInput(
            f"{path}:{line}:{column}: not UTF-8 text ({error.reason})",
            fix="save the spec as UTF-8",
        ) from None
    return parse_spec(text, path, host=host)


def _line_column(text: str | bytes, offset: int) -> tuple[int, int]:
    before = text[:offset]
    if isinstance(before, str):
        return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1
    return before.count(b"\n") + 1, offset - (before.rfind(b"\n") + 1) + 1


CONFLICT_MARKER = re.compile(r"^(<{7}|={7}|>{7})(?: |$)", re.MULTILINE)
CONFLICT_FIX = ("resolve the git merge conflict: keep the lines you want and remove the "
                "<<<<<<<, ======= and >>>>>>> lines")


def read_yaml(text: str, source: Path | str, *, remake: str | None = None) -> Located:
    """`parse_yaml` of a kit file (the spec, site.lock), every YAML error turned into BadInput
    at `source:line:col`; a git merge conflict left in the file is named as one. `remake`: how
    to write the file again instead (added to each fix)."""
    also = f"; or {remake}" if remake else ""
    if conflict := CONFLICT_MARKER.search(text):
        line, column = _line_column(text, conflict.start())
        raise BadInput(f"{source}:{line}:{column}: a git merge conflict marker "
                       f"({conflict.group(1)}): the file is half one version, half another",
                       fix=CONFLICT_FIX + also)
    try:
        return parse_yaml(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise BadInput(
            f"{source}:{line}:{column}: invalid YAML: {error.problem or error}",
            fix=(getattr(error, "fix", None)
                 or "fix the YAML at that position (indentation, a missing ':' or quote, a tag)")
            + also,
        ) from None
    except yaml.reader.ReaderError as error:
        line, column = _line_column(text, error.position)
        raise BadInput(
            f"{source}:{line}:{column}: invalid YAML: character {error.character!r} is not "
            "allowed in YAML text",
            fix="remove that character (control characters and NUL cannot appear in the file)"
            + also,
        ) from None
    except yaml.YAMLError as error:
        raise BadInput(f"{source}:1:1: invalid YAML: {error}", fix=remake) from None


def parse_spec(text: str, source: Path, *, host: HostChecks | None = None) -> Spec:
    if len(text) > MAX_SPEC_BYTES:
        raise BadInput(f"{source}: larger than {MAX_SPEC_BYTES >> 20} MiB")
    located = read_yaml(text, source)
    problems = list(located.problems)
    if not isinstance(located.data, dict):
        problems.append(SpecProblem((), "the spec must be a mapping (site:, domain:, services:)"))
        raise SpecError(source, located, problems)
    if problems:
        raise SpecError(source, located, problems)
    spec = None
    try:
        spec = Spec.model_validate(located.data)
        parts = Parts.of(spec)
    except ValidationError as error:
        problems = _from_pydantic(error.errors())
        parts = Parts.salvage(located.data)
    problems += cross_checks(parts)
    if host is not None:
        problems += host(parts, source.parent)
    if problems or spec is None:
        raise SpecError(source, located, problems)
    return spec


def _from_pydantic(errors: list[ErrorDetails]) -> list[SpecProblem]:
    """One problem per key (a union reports each alternative: the first says enough)."""
    problems: dict[tuple, SpecProblem] = {}
    for error in errors:
        problem = _problem(error)
        problems.setdefault(problem.path, problem)
    return list(problems.values())


def _problem(error: ErrorDetails) -> SpecProblem:
    path = tuple(part for part in error["loc"] if not _is_union_tag(part))
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(path[:-1])
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1, cutoff=0.6)
        fix: str | None = (
            f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(allowed)}"
        )
        return SpecProblem(path, f"unknown key {path[-1]!r}", fix)
    if kind == "missing":
        return SpecProblem(path, "required key is missing", f"add {dotted(path)}: to the spec")
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    fix = None
    if kind == "string_pattern_mismatch":
        message = f"{value!r} has characters that are not allowed here ({_pattern_hint(path)})"
    elif kind != "value_error" and not isinstance(value, dict | list):
        message = f"{message} (got {value!r})"
    if isinstance(value, bool) and kind in ("int_type", "float_type", "string_type"):
        fix = "YAML reads yes/no/on/off/true/false as booleans: write the number or quote the text"
    elif isinstance(value, str) and kind in ("int_type", "float_type"):
        fix = "write the number without quotes"
    elif isinstance(value, float) and kind == "int_type":
        fix = "write a whole number without a decimal point"
    return SpecProblem(path, message, fix)


def _is_union_tag(part: Any) -> bool:
    """pydantic puts union member names (e.g. 'int', 'literal['auto']', 'constrained-float')
    into error locations."""
    return isinstance(part, str) and (
        "[" in part or part.startswith(("constrained-", "function-")) or part in (
            "int", "float", "str", "dict", "list", "bool", "path", "is-instance[Path]"
        )
    )


def _pattern_hint(path: tuple) -> str:
    hints = {
        "site": "lower-case letters, digits and '-', starting with a letter, at most 31",
        "name": "lower-case letters, digits and '-', starting with a letter",
        "users": "lower-case letters, digits, '.', '_' and '-', starting with a letter",
        "served_name": "letters, digits and . _ / : -",
        "model": "a directory name under models_root or an org/name Hugging Face id (pin its "
                 "revision with the service's `revision:` key, not org/name@rev)",
        "revision": "a 40-hex commit, or a branch or tag name without '/'",
        "vllm": "an image reference like vllm/vllm-openai:v0.33.0",
        "nginx": "an image reference like nginx:1.27-alpine",
        "certbot": "an image reference like certbot/certbot:v3.1.0",
        "max_body": "a size like 1m, 512k or 1g",
        "email": "an e-mail address like ops@example.com (not starting with - or .)",
        "acme_server": "an https:// directory URL",
        "extra_args": "no newlines, NUL or '$'",
        "env": "names: letters, digits, '_'; values: no newlines, NUL or '$'",
    }
    for part in reversed(path):
        if part in hints:
            return hints[part]
    return "see `kit schema`"


def _allowed_keys(path: tuple) -> list[str]:
    model: Any = Spec
    for part in path:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        model = _model_in(annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None
