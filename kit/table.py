"""The aligned text table kit's verbs print (`kit status`, `kit fleet`, `kit usage`): in the
ground, so every wing that prints one uses the same layout without importing another wing."""

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], numeric_from: int | None = None) -> str:
    """Columns aligned, joined by two spaces, trailing blanks cut; columns from `numeric_from`
    on are right-aligned (figures), none when it is None."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    first_figure = len(widths) if numeric_from is None else numeric_from
    return "\n".join("  ".join(
        cell.rjust(width) if index >= first_figure else cell.ljust(width)
        for index, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in rows)
