"""How usage records and figures leave kit as CSV: cells a spreadsheet cannot run (the aligned
text table every verb prints is the ground's, kit/table.py).

A CSV cell starting with = + - @ (or a tab or carriage return) is a formula to Excel, LibreOffice
and Sheets (CSV injection); every text cell that starts so is prefixed with a single quote, the
neutralisation OWASP recommends. Records hold allow-listed values already: this holds anyway.
"""

import csv
import io
from collections.abc import Iterable, Sequence

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: object) -> object:
    """`value` as a CSV cell: numbers as they are, None empty, text neutralised."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        text = str(value)
        return f"'{text}" if text.startswith(FORMULA_START) else text
    return value


def csv_lines(header: Sequence[str], rows: Iterable[Sequence[object]]) -> Iterable[str]:
    """The CSV text, one record at a time (an export never holds the whole file)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([safe_cell(cell) for cell in header])
    yield buffer.getvalue()
    for row in rows:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([safe_cell(cell) for cell in row])
        yield buffer.getvalue()

