"""`kit usage --plot FILE.png`: requests and tokens per day per credential, two panels.

matplotlib is the optional extra `kit[plot]`: loaded only here, off-screen (Agg); without it the
plot is refused before anything is read or written.
"""

from __future__ import annotations

import io
from datetime import date, timedelta
from types import ModuleType

from kit.errors import BadInput
from kit.usage.totals import PeriodUsage

TOP = 8  # credentials drawn by name; the rest are one line, "others"
INSTALL = "pip install 'kit[plot]'"


def pyplot(needed_by: str, instead: str | None = None) -> ModuleType:
    """matplotlib's pyplot drawing off-screen; BadInput naming what needs it (`needed_by`), the
    extra and any way to go without (`instead`) when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise BadInput(f"{needed_by} draws with matplotlib, which is not installed (it is the "
                       "optional extra kit[plot])",
                       fix=INSTALL + (f" (or {instead})" if instead else "")) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def daily_series(usage: PeriodUsage) -> tuple[list[date], dict[str, tuple[list[int], list[int]]]]:
    """The period's days, and per credential (the TOP by tokens, then "others") the requests
    and tokens of each day (0 on days without any)."""
    by_who: dict[str, dict[date, list[int]]] = {}
    for (who, _, day_text), figures in usage.cells.items():
        totals = by_who.setdefault(who, {}).setdefault(date.fromisoformat(day_text), [0, 0])
        totals[0] += figures.requests
        totals[1] += figures.tokens
    if not by_who:
        return [], {}
    seen = sorted({day for days in by_who.values() for day in days})
    days = [seen[0] + timedelta(days=n) for n in range((seen[-1] - seen[0]).days + 1)]
    ranked = sorted(by_who, key=lambda who: (-sum(t for _, t in by_who[who].values()), who))
    series: dict[str, tuple[list[int], list[int]]] = {}
    for rank, who in enumerate(ranked):
        name = who if rank < TOP else "others"
        requests, tokens = series.setdefault(name, ([0] * len(days), [0] * len(days)))
        for day, (count, used) in by_who[who].items():
            index = (day - days[0]).days
            requests[index] += count
            tokens[index] += used
    return days, series


def png(usage: PeriodUsage, plt: ModuleType) -> bytes:
    """The figure as PNG bytes (the caller writes them atomically)."""
    days, series = daily_series(usage)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True)
    for who, (requests, tokens) in series.items():
        top.plot(days, requests, marker="o", markersize=3, label=who)
        bottom.plot(days, tokens, marker="o", markersize=3, label=who)
    top.set_ylabel("requests per day")
    bottom.set_ylabel("tokens per day (prompt + completion)")
    top.set_title(f"kit usage {usage.period.describe()}")
    if series:
        top.legend(loc="upper left", fontsize="small")
    else:
        top.text(0.5, 0.5, "no records in this period", ha="center", transform=top.transAxes)
    for axes in (top, bottom):
        axes.grid(True, alpha=0.3)
    figure.autofmt_xdate()
    return figure_png(plt, figure)


def figure_png(plt: ModuleType, figure) -> bytes:
    """A drawn figure laid out, as PNG bytes, and closed (`kit usage --plot`, `kit bench`)."""
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()
