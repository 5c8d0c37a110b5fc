"""The shape of an nginx config with every argument masked: what no spec value may change.

Tokenised by nginx's own rules (whitespace, `;`, `{`, `}`, `#` comments, quotes with
backslash escapes), so a value that smuggles in a `;`, a brace or a newline shows up as a
different shape, and one that smuggles in a `$variable` as a different set of variables.
"""

import re
from dataclasses import dataclass

VARIABLE = re.compile(r"\$\{?([A-Za-z0-9_]+)")
# Blocks whose entries are data (a key and a value), not directives.
DATA_BLOCKS = {"map", "types", "split_clients", "geo"}


@dataclass(frozen=True)
class Token:
    text: str
    quoted: bool


def tokens(conf: str) -> list[Token]:
    found: list[Token] = []
    i = 0
    while i < len(conf):
        char = conf[i]
        if char.isspace():
            i += 1
        elif char == "#":
            end = conf.find("\n", i)
            i = len(conf) if end < 0 else end
        elif char in ";{}":
            found.append(Token(char, False))
            i += 1
        elif char in "\"'":
            text, i = _quoted(conf, i + 1, char)
            found.append(Token(text, True))
        else:
            start = i
            while i < len(conf) and not conf[i].isspace() and conf[i] not in ";{}\"'":
                i += 2 if conf[i] == "\\" else 1
            found.append(Token(conf[start:i], False))
    return found


def _quoted(conf: str, i: int, quote: str) -> tuple[str, int]:
    text = []
    while i < len(conf) and conf[i] != quote:
        if conf[i] == "\\" and i + 1 < len(conf):
            i += 1
        text.append(conf[i])
        i += 1
    if i >= len(conf):
        raise ValueError("unterminated quoted string")
    return "".join(text), i + 1


def structure(conf: str) -> tuple[tuple, frozenset[str]]:
    """(each directive as (depth, name, argument count, opens a block?), variables used)."""
    shape: list[tuple] = []
    blocks: list[str] = []
    statement: list[str] = []
    variables = set()
    for token in tokens(conf):
        if token.text in (";", "{") and not token.quoted:
            inside_data = bool(blocks) and blocks[-1] in DATA_BLOCKS
            name = "<entry>" if inside_data else (statement[0] if statement else "")
            shape.append((len(blocks), name, len(statement) - 1, token.text == "{"))
            if token.text == "{":
                blocks.append(statement[0] if statement else "")
            statement = []
        elif token.text == "}" and not token.quoted:
            shape.append((len(blocks), "}", 0, False))
            blocks.pop()
        else:
            statement.append(token.text)
            variables.update(VARIABLE.findall(token.text))
    return tuple(shape), frozenset(variables)


@dataclass(frozen=True)
class Directive:
    """One nginx directive: its name, its arguments, and its block when it opens one."""

    name: str
    args: tuple[str, ...]
    block: tuple["Directive", ...] | None = None

    def find(self, name: str, *args: str) -> list["Directive"]:
        """Directives named `name` anywhere below this one whose arguments start with `args`."""
        found = []
        for child in self.block or ():
            if child.name == name and child.args[: len(args)] == args:
                found.append(child)
            found += child.find(name, *args)
        return found

    def one(self, name: str, *args: str) -> "Directive":
        """The single directive `name args...` below this one (fails the test otherwise)."""
        found = self.find(name, *args)
        assert len(found) == 1, f"expected one `{name} {' '.join(args)}`, found {len(found)}"
        return found[0]

    def values(self, name: str) -> list[tuple[str, ...]]:
        """The arguments of every `name` directly in this block (not in nested blocks)."""
        return [child.args for child in self.block or () if child.name == name]


def parse(conf: str) -> Directive:
    """The whole config as a tree whose root block holds the top-level directives."""
    stack: list[list[Directive]] = [[]]
    openers: list[tuple[str, tuple[str, ...]]] = []
    statement: list[str] = []
    for token in tokens(conf):
        if token.quoted or token.text not in ";{}":
            statement.append(token.text)
        elif token.text == ";":
            stack[-1].append(Directive(statement[0], tuple(statement[1:])))
            statement = []
        elif token.text == "{":
            openers.append((statement[0], tuple(statement[1:])))
            stack.append([])
            statement = []
        else:
            name, args = openers.pop()
            children = stack.pop()
            stack[-1].append(Directive(name, args, tuple(children)))
    assert len(stack) == 1 and not statement, "unbalanced braces or a directive without ';'"
    return Directive("", (), tuple(stack[0]))
