"""A spec's problems: each at a key path, reported as `file:line:col: key.path: message`."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import BadInput


@dataclass(frozen=True)
class SpecProblem:
    path: tuple
    message: str
    fix: str | None = None


@dataclass
class Located:
    """A parsed document plus the (line, column) of every key path in it (1-based)."""

    data: Any
    marks: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    problems: list[SpecProblem] = field(default_factory=list)

    def position(self, path: tuple) -> tuple[int, int]:
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))


class SpecError(BadInput):
    """All problems of one spec, each as `file:line:col: key.path: message`."""

    def __init__(self, source: Path | str, located: Located | None, problems: list[SpecProblem],
                 *, fix: str | None = None):
        self.problems = problems
        lines = []
        where_in = located.position if located else lambda path: (1, 1)
        for problem in sorted(problems, key=lambda problem: where_in(problem.path)):
            line, column = where_in(problem.path)
            where = f"{source}:{line}:{column}"
            key = dotted(problem.path)
            text = f"{where}: {key}: {problem.message}" if key else f"{where}: {problem.message}"
            if problem.fix:
                text += f"\n    fix: {problem.fix}"
            lines.append(text)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{source}: {len(problems)} {noun}:\n" + "\n".join(lines), fix=fix)


def dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
