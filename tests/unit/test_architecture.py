"""docs/architecture.md is the map a newcomer reads first: it must name every module of kit/ and
nothing that does not exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"\b((?:kit|templates|scripts|tests)/[\w/.-]+\.(?:py|j2|js|sh))\b")


def modules() -> set[str]:
    """kit's core modules (the verbs under kit/commands/ are one row of the map)."""
    return {
        str(path.relative_to(ROOT))
        for path in (ROOT / "kit").glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
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
