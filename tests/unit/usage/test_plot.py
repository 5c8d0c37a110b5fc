"""The plot's data: per credential, requests and tokens on every day of the span (0 on quiet
days), the busiest credentials by name and the rest as "others"; the PNG itself. matplotlib is
the optional extra kit[plot]: kit runs without it, and only a PNG asks for it."""

import os
import subprocess
import sys
import tomllib
from datetime import UTC, date, datetime

from kit.usage.period import period
from kit.usage.plot import TOP, daily_series, png, pyplot
from kit.usage.totals import PeriodUsage, Totals
from tests.support.sites import REPO

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def figures(requests: int, tokens: int) -> Totals:
    return Totals(requests=requests, completed=requests, prompt_tokens=tokens)


def test_every_day_of_the_span_and_the_top_credentials() -> None:
    cells = {("key:a", "alpha", "2026-11-01"): figures(2, 100),
             ("key:a", "beta", "2026-11-03"): figures(1, 50),
             **{(f"key:{n:02d}", "alpha", "2026-11-02"): figures(1, n) for n in range(TOP + 2)}}
    days, series = daily_series(PeriodUsage(period("30d", None, NOW, default_since=None), cells))
    assert days == [date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)]
    assert series["key:a"] == ([2, 0, 1], [100, 0, 50])
    assert len(series) == TOP + 1 and series["others"] == ([0, 3, 0], [0, 0 + 1 + 2, 0])


def test_the_png() -> None:
    usage = PeriodUsage(period("30d", None, NOW, default_since=None),
                  {("key:a", "alpha", "2026-11-01"): figures(2, 100)})
    image = png(usage, pyplot("kit usage --plot"))
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    empty = PeriodUsage(usage.period, {})
    assert png(empty, pyplot("kit usage --plot"))[:8] == b"\x89PNG\r\n\x1a\n"


def test_matplotlib_is_the_plot_extra_and_the_tests_one_not_a_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [need for need in project["dependencies"] if need.startswith("matplotlib")]
    plot = project["optional-dependencies"]["plot"]
    assert [need for need in plot if need.startswith("matplotlib")] == ["matplotlib>=3.8"]
    assert set(plot) <= set(project["optional-dependencies"]["test"])  # the tests draw


WITHOUT_MATPLOTLIB = """
import importlib, pkgutil, sys
sys.modules["matplotlib"] = None  # `import matplotlib` raises ImportError, as when not installed
import kit
for found in pkgutil.walk_packages(kit.__path__, "kit."):
    if found.name != "kit.__main__":
        importlib.import_module(found.name)
from kit.errors import BadInput
from kit.usage.plot import pyplot
try:
    pyplot("kit usage --plot", instead="leave out --plot")
except BadInput as refused:
    print(refused.exit_code, refused.message, refused.fix, sep="\\n")
"""


def test_every_module_of_kit_loads_without_matplotlib_and_a_png_names_the_extra() -> None:
    run = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB], capture_output=True,
                         text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "2", "kit usage --plot draws with matplotlib, which is not installed (it is the "
        "optional extra kit[plot])", "pip install 'kit[plot]' (or leave out --plot)"]
