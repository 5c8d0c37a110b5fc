"""The one aligned text table kit's verbs print."""

from kit.table import text_table


def test_figures_are_right_aligned_from_numeric_from() -> None:
    assert text_table([["WHO", "N"], ["key:a", "1,000"], ["b", "7"]], 1).splitlines() == [
        "WHO        N", "key:a  1,000", "b          7"]


def test_without_numeric_from_every_column_is_left_aligned_and_lines_end_clean() -> None:
    assert text_table([("SERVER", "STATE"), ("gpu01", "running"), ("a-long-name", "-")]
                      ).splitlines() == [
        "SERVER       STATE", "gpu01        running", "a-long-name  -"]
    assert text_table([("A", ""), ("bb", "")]) == "A\nbb"
