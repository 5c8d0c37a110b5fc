"""The plot's data: per credential, requests and tokens on every day of the span (0 on quiet
days), the busiest credentials by name and the rest as "others"; the PNG itself."""

from datetime import UTC, date, datetime

from kit.usage.period import period
from kit.usage.plot import TOP, daily_series, png, pyplot
from kit.usage.totals import Figures, Usage

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def figures(requests: int, tokens: int) -> Figures:
    return Figures(requests=requests, completed=requests, prompt_tokens=tokens)


def test_every_day_of_the_span_and_the_top_credentials() -> None:
    cells = {("key:a", "alpha", "2026-11-01"): figures(2, 100),
             ("key:a", "beta", "2026-11-03"): figures(1, 50),
             **{(f"key:{n:02d}", "alpha", "2026-11-02"): figures(1, n) for n in range(TOP + 2)}}
    days, series = daily_series(Usage(period("30d", None, NOW, default_since=None), cells))
    assert days == [date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)]
    assert series["key:a"] == ([2, 0, 1], [100, 0, 50])
    assert len(series) == TOP + 1 and series["others"] == ([0, 3, 0], [0, 0 + 1 + 2, 0])


def test_the_png() -> None:
    usage = Usage(period("30d", None, NOW, default_since=None),
                  {("key:a", "alpha", "2026-11-01"): figures(2, 100)})
    image = png(usage, pyplot())
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    assert png(Usage(usage.period, {}), pyplot())[:8] == b"\x89PNG\r\n\x1a\n"
