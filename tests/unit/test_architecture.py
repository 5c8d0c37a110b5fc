"""docs/architecture.md is the map a newcomer reads first: it must name every module of kit/ (in
every wing) and nothing that does not exist — no file, and no `kit.…` function or class."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"\b((?:kit|templates|scripts|tests)/[\w/.-]+\.(?:py|j2|js|sh))\b")


def modules() -> set[str]:
    """kit's modules in every wing (the verbs under kit/commands/ are one row of the map)."""
    return {
        str(path.relative_to(ROOT))
        for path in (ROOT / "kit").rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
        and not {"commands", "templates", "data"} & set(path.relative_to(ROOT).parts)
    }


def test_every_path_the_map_names_exists() -> None:
    named = set(NAMED.findall(MAP.read_text()))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_module_is_on_the_map() -> None:
    named = set(NAMED.findall(MAP.read_text()))
    absent = sorted(modules() - named)
    assert not absent, f"modules missing from docs/architecture.md: {absent}"
    assert "`kit/commands/*.py`" in MAP.read_text()


DOTTED = re.compile(r"`(kit(?:\.\w+)+)`")
CALLS = re.compile(r"\b(kit(?:\.\w+){2,})\b(?!/|\.py)")


def resolve(dotted: str) -> object:
    """The object `kit.wing.module.name` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_name_the_map_gives_exists() -> None:
    """The call chains name functions as `kit.wing.module.function`: each one must resolve, so
    a rename or a move that forgets the map fails here."""
    text = MAP.read_text()
    named = sorted(set(CALLS.findall(text)) | set(DOTTED.findall(text)))
    assert len(named) > 30  # the chains are written with full names
    missing = []
    for dotted in named:
        try:
            resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_resolver_refuses_a_name_that_does_not_exist() -> None:
    with pytest.raises(AttributeError):
        resolve("kit.stack.up.no_such_function")


def classes_sharing_a_name(sources: dict[str, str]) -> dict[str, list[str]]:
    """Class name → every `path:line` defining it, for names defined more than once (nested
    classes too: a reader meeting the name cannot tell which one is meant)."""
    where: dict[str, list[str]] = {}
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{path}:{node.lineno}")
    return {name: found for name, found in sorted(where.items()) if len(found) > 1}


def test_no_two_classes_in_kit_share_a_name() -> None:
    """One name, one type (issue 44: `Target`, `Slo`, `Outcome`, `Progress`… each meant two
    things): name a type after what it is, not after the module it sits in."""
    sources = {str(path.relative_to(ROOT)): path.read_text()
               for path in sorted((ROOT / "kit").rglob("*.py"))
               if not {"templates", "data"} & set(path.relative_to(ROOT).parts)}
    shared = classes_sharing_a_name(sources)
    assert not shared, "rename all but one after what it is:\n" + "\n".join(
        f"{name}: {', '.join(found)}" for name, found in shared.items())


def test_the_class_check_finds_a_planted_duplicate() -> None:
    planted = {"kit/a.py": "class Progress:\n    pass\n",
               "kit/b.py": "def f():\n    class Progress:\n        pass\n",
               "kit/c.py": "class Target:\n    pass\n"}
    assert classes_sharing_a_name(planted) == {"Progress": ["kit/a.py:1", "kit/b.py:2"]}
