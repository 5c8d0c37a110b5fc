"""CSV cells a spreadsheet would run as formulas are neutralised; numbers stay numbers."""

import csv
import io

import pytest

from kit.usage.tables import csv_lines, safe_cell


@pytest.mark.parametrize(("value", "cell"), [
    ("=1+1", "'=1+1"), ("+SUM(A1)", "'+SUM(A1)"), ("-2+3", "'-2+3"), ("@cmd", "'@cmd"),
    ("\t=x", "'\t=x"), ("\r=x", "'\r=x"), ("key:ci", "key:ci"), ("a=b", "a=b"),
    (-5, -5), (1.5, 1.5), (None, ""), (True, "True"),
])
def test_cells(value: object, cell: object) -> None:
    assert safe_cell(value) == cell


def test_csv_lines_header_and_rows_one_at_a_time() -> None:
    chunks = list(csv_lines(["who", "n"], iter([["=evil()", 3], ["key:a", None]])))
    assert len(chunks) == 3
    assert list(csv.reader(io.StringIO("".join(chunks)))) == [
        ["who", "n"], ["'=evil()", "3"], ["key:a", ""]]

