"""The time span a usage question covers: `--since` / `--until` as dates, times or durations.

A date is a UTC day: `--since 2026-11-01` starts at its midnight, `--until 2026-11-30` takes that
whole day in. A duration (`7d`, `12h`, `30m`, `2w`) counts back from now. A full ISO time
(`2026-11-01T08:00`, UTC unless it says otherwise) is taken as it is.
"""

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from kit.errors import BadInput

DURATION = re.compile(r"(\d{1,6})([mhdw])")
UNIT = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1),
        "w": timedelta(weeks=1)}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
FORMS = "a date (2026-11-01), a UTC time (2026-11-01T08:00) or a duration back from now " \
        "(30m, 12h, 7d, 2w)"


@dataclass(frozen=True)
class Period:
    """[since, until): since None is the ledger's beginning."""

    since: datetime | None
    until: datetime

    def holds(self, moment: datetime) -> bool:
        return (self.since is None or moment >= self.since) and moment < self.until

    @property
    def first_day(self) -> date | None:
        """The first segment that can hold a record of the period: a record is appended at or
        after it ended, so no segment before its day holds one."""
        return None if self.since is None else self.since.date()

    def hours(self, now: datetime) -> float:
        """The period's length up to now (GPU-hours are held, not used, so idle time counts)."""
        if self.since is None:
            return 0.0
        return max(0.0, (min(self.until, now) - self.since).total_seconds() / 3600)

    def describe(self) -> str:
        since = "the ledger's beginning" if self.since is None else _text(self.since)
        return f"{since} to {_text(self.until)} (UTC)"

    def to_json(self) -> dict:
        return {"since": None if self.since is None else self.since.isoformat(),
                "until": self.until.isoformat()}


def _text(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


def moment(text: str, option: str, now: datetime, *, end: bool = False) -> datetime:
    """One bound. `end`: a bare date means the end of that day (--until takes it in)."""
    value = text.strip()
    duration = DURATION.fullmatch(value)
    if duration:
        return now - int(duration[1]) * UNIT[duration[2]]
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{option} {text!r} is not a date, time or duration",
                       fix=f"give {option} {FORMS}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if end and DATE.fullmatch(value):
        parsed += timedelta(days=1)
    return parsed.astimezone(UTC)


def period(since: str | None, until: str | None, now: datetime, *,
           default_since: str | None) -> Period:
    """--since/--until → Period; `default_since` when --since is not given (None: the ledger's
    beginning). BadInput when the period is empty."""
    start_text = since if since is not None else default_since
    start = None if start_text is None else moment(start_text, "--since", now)
    stop = now if until is None else moment(until, "--until", now, end=True)
    if start is not None and start >= stop:
        raise BadInput(f"the period is empty: --since {start_text} is not before "
                       f"--until {until or 'now'}",
                       fix="give a --since earlier than --until")
    return Period(start, stop)
