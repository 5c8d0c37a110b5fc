"""The README's shell examples, so a test can run exactly what a reader would type."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    """The text of the README section `## title`, up to the next `## ` heading."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def shell_blocks(title: str) -> list[str]:
    """Every ```sh fenced block of that section, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", section(title), flags=re.M | re.S)
