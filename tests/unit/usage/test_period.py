"""--since / --until: dates are UTC days (an --until date takes its day in), durations count
back from now, and every bad value is exit 2 naming the option and the forms it takes."""

from datetime import UTC, datetime

import pytest

from kit.errors import BadInput
from kit.usage.period import Period, period

NOW = datetime(2026, 12, 1, 22, 30, tzinfo=UTC)


def test_dates_durations_and_times() -> None:
    assert period("2026-11-01", "2026-11-30", NOW, default_since=None) == Period(
        datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
    assert period("7d", None, NOW, default_since=None) == Period(
        datetime(2026, 11, 24, 22, 30, tzinfo=UTC), NOW)
    assert period("2026-12-01T08:00", "30m", NOW, default_since=None) == Period(
        datetime(2026, 12, 1, 8, tzinfo=UTC), datetime(2026, 12, 1, 22, tzinfo=UTC))
    assert period("2026-12-01T09:00+01:00", None, NOW, default_since=None).since == datetime(
        2026, 12, 1, 8, tzinfo=UTC)
    assert period("2w", "1h", NOW, default_since=None) == Period(
        datetime(2026, 11, 17, 22, 30, tzinfo=UTC), datetime(2026, 12, 1, 21, 30, tzinfo=UTC))


def test_defaults_and_what_a_period_holds() -> None:
    assert period(None, None, NOW, default_since="30d").since == datetime(
        2026, 11, 1, 22, 30, tzinfo=UTC)
    whole = period(None, None, NOW, default_since=None)
    assert whole.since is None and whole.first_day is None and whole.holds(datetime(
        2001, 1, 1, tzinfo=UTC))
    day = period("2026-11-30", "2026-11-30", NOW, default_since=None)
    assert day.holds(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC))
    assert not day.holds(datetime(2026, 12, 1, tzinfo=UTC))
    assert day.hours(NOW) == 24 and day.first_day.isoformat() == "2026-11-30"


@pytest.mark.parametrize(("since", "until", "named"), [
    ("yesterday", None, "--since 'yesterday'"),
    ("7x", None, "--since '7x'"),
    ("2026-13-01", None, "--since '2026-13-01'"),
    (None, "-3d", "--until '-3d'"),
    ("2026-12-01", "2026-11-01", "the period is empty"),
])
def test_a_bad_bound_names_itself_and_the_forms(since, until, named) -> None:
    with pytest.raises(BadInput) as raised:
        period(since, until, NOW, default_since="30d")
    assert named in raised.value.message and raised.value.fix
