"""kit usage and kit audit as an operator runs them: exit 0 with the figures, exit 1 naming a
broken ledger, exit 2 for every bad input (naming it and the fix) with nothing written."""

import csv
import io
import json
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kit.usage.ledger import LEDGER_DIR
from tests.support import synthetic_ledger as synthetic
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine
from tests.support.sites import tree

TODAY = datetime.now(UTC).date()
DAYS = [(TODAY - timedelta(days=n)).isoformat() for n in (2, 1, 0)]


def recent() -> dict[str, bytes]:
    """Three days up to today: key:a twice a day, key:b once (the last one on beta)."""
    return synthetic.ledger_files(synthetic.chained({day: [
        synthetic.record(f"{day}T00:00:01.000Z", who="key:a", prompt=100, completion=20),
        synthetic.record(f"{day}T00:00:02.000Z", who="key:a", prompt=100, completion=20),
        synthetic.record(f"{day}T00:00:03.000Z", who="key:b",
                         model="beta" if day == DAYS[-1] else "alpha", prompt=7, completion=3)]
        for day in DAYS}))


@pytest.fixture
def site(tmp_path: Path, engines: dict) -> tuple[Path, dict[str, bytes]]:
    engine = FakeEngine()
    engines[None] = engine
    files = recent()
    return synthetic.ledger_site(tmp_path, engine, files), files


def test_usage_prints_the_table(site) -> None:
    spec, _ = site
    done = run_kit("usage", spec, "--since", "7d")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("usage ") and lines[0].endswith("(UTC)")
    assert lines[2].split() == ["key:a", "6", "6", "0", "0", "0", "600", "120", "720"]
    assert lines[-1].split() == ["TOTAL", "9", "9", "0", "0", "0", "621", "129", "750"]


def test_usage_csv_json_by_model_and_day(site) -> None:
    spec, _ = site
    done = run_kit("usage", spec, "--by", "model,day", "--csv")
    assert done.exit_code == 0, done.output
    table = list(csv.reader(io.StringIO(done.output)))
    assert table[0][:3] == ["model", "day", "requests"]
    assert ["beta", DAYS[-1], "1", "1", "0", "0", "0", "7", "3", "10"] in table
    done = run_kit("usage", spec, "--json", "--since", DAYS[-1])
    document = json.loads(done.output)
    assert [(r["who"], r["requests"]) for r in document["rows"]] == [("key:a", 2), ("key:b", 1)]


def test_usage_plot_is_a_png(site, tmp_path: Path) -> None:
    spec, _ = site
    plot = tmp_path / "usage.png"
    done = run_kit("usage", spec, "--plot", plot)
    assert done.exit_code == 0, done.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_usage_plot_without_matplotlib_names_the_extra(site, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _ = site
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    before = tree(tmp_path)
    done = run_kit("usage", spec, "--plot", tmp_path / "usage.png")
    assert done.exit_code == 2 and "pip install 'kit[plot]'" in done.output
    assert tree(tmp_path) == before


@pytest.mark.parametrize(("args", "named"), [
    (["--by", "who,team"], "--by 'who,team': 'team' is not one of them"),
    (["--since", "last week"], "--since 'last week' is not a date, time or duration"),
    (["--until", "2026-02-30"], "--until '2026-02-30'"),
    (["--csv", "--json"], "--csv and --json exclude each other"),
    (["--plot", "usage.svg"], "the plot is a PNG"),
    (["--plot", "no/such/folder/usage.png"], "does not exist"),
])
def test_usage_bad_input_is_exit_2_and_writes_nothing(site, tmp_path: Path, args, named) -> None:
    spec, _ = site
    before = tree(tmp_path)
    done = run_kit("usage", spec, *args)
    assert done.exit_code == 2 and named in done.output and "fix:" in done.output, done.output
    assert tree(tmp_path) == before


def test_usage_of_a_site_without_a_ledger_is_exit_2(tmp_path: Path, engines: dict) -> None:
    engines[None] = engine = FakeEngine()
    spec = synthetic.ledger_site(tmp_path, engine, None)
    done = run_kit("usage", spec)
    assert done.exit_code == 2 and "does not exist yet" in done.output


def test_verify_passes_then_names_an_edit(site) -> None:
    spec, files = site
    done = run_kit("audit", "verify", spec)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[0] == "ledger whole: 9 records in 3 segment(s)"
    assert "head: seq 9 hash " in done.output and "this head kept in" in done.output
    anchors = spec.parent / ".kit" / "usage-anchors.json"
    assert stat.S_IMODE(anchors.stat().st_mode) == 0o600
    lines = synthetic.segment_lines(files, DAYS[1])
    lines[2] = lines[2].replace(b'"who":"key:b"', b'"who":"key:c"')
    synthetic.set_segment_lines(files, DAYS[1], lines)
    done = run_kit("audit", "verify", spec)
    assert done.exit_code == 1
    assert (f"the usage ledger is not whole: segments/{DAYS[1]}.jsonl line 3 (seq 6, request id "
            "req000006): altered") in done.output
    done = run_kit("audit", "verify", spec, "--json")
    assert done.exit_code == 1 and '"seq": 6' in done.output


def test_verify_reports_every_pruned_range_and_why(tmp_path: Path, engines: dict) -> None:
    """Issue 42 item 6: a prune by the disk bound passed `kit audit verify` unseen. The verify
    lists every range pruned, when, why, and the requests of credentials it held."""
    engine = FakeEngine()
    engines[None] = engine
    files = synthetic.ledger_files(synthetic.chained({day: [
        synthetic.record(f"{day}T00:00:0{n}.000Z", who="key:a") for n in range(1, 4)]
        for day in DAYS}), pruned=(DAYS[0], DAYS[1]))
    entries = [json.loads(line) for line in files[f"{LEDGER_DIR}/pruned.jsonl"].splitlines()]
    entries[1] |= {"reason": "max_bytes", "at": f"{DAYS[2]}T01:00:00.000Z",
                   "credential_requests": 3}
    files[f"{LEDGER_DIR}/pruned.jsonl"] = b"".join(
        json.dumps(entry).encode() + b"\n" for entry in entries)
    spec = synthetic.ledger_site(tmp_path, engine, files)
    done = run_kit("audit", "verify", spec)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[1:3] == [
        f"  pruned: seqs 1..3 (segments/{DAYS[0]}.jsonl) pruned at {DAYS[0]}T23:59:59.000Z, "
        "older than usage.retention_days",
        f"  pruned: seqs 4..6 (segments/{DAYS[1]}.jsonl) pruned at {DAYS[2]}T01:00:00.000Z, "
        "to keep the ledger under usage.max_disk, holding 3 requests of credentials"]
    ranges = json.loads(run_kit("audit", "verify", spec, "--json").output)["pruned_ranges"]
    assert [(r["first_seq"], r["reason"], r["credential_requests"]) for r in ranges] == [
        (1, "retention", None), (4, "max_bytes", 3)]


def test_export_csv_to_a_file_and_jsonl_to_stdout(site, tmp_path: Path) -> None:
    spec, files = site
    out = tmp_path / "audit.csv"
    done = run_kit("audit", "export", spec, "--since", DAYS[-1], "--format", "csv", "--out", out)
    assert done.exit_code == 0, done.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["seq"] for r in rows] == ["7", "8", "9"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    done = run_kit("audit", "export", spec)
    whole = b"".join(files[f"{LEDGER_DIR}/segments/{day}.jsonl"] for day in DAYS)
    assert done.exit_code == 0 and done.stdout_bytes == whole


def test_export_bad_input_is_exit_2(site, tmp_path: Path) -> None:
    spec, _ = site
    before = tree(tmp_path)
    for args in (["--format", "xml"], ["--since", "soon"],
                 ["--out", tmp_path / "missing" / "x.csv"]):
        done = run_kit("audit", "export", spec, *args)
        assert done.exit_code == 2, (args, done.output)
    assert tree(tmp_path) == before


def test_usage_with_a_gpu_hour_cost_in_the_spec_prints_the_cost(site) -> None:
    """write_site: alpha holds 1 GPU, beta 2; 24 h at 3.0 per GPU-hour: alpha 72, beta 144,
    each shared by its own tokens (beta's only tokens are key:b's)."""
    spec, _ = site
    spec.write_text(spec.read_text() + "usage: {gpu_hour_cost: 3.0}\n")
    day = DAYS[1]
    done = run_kit("usage", spec, "--since", f"{day}T00:00", "--until", f"{day}T23:59:59.999",
                   "--json")
    assert done.exit_code == 0, done.output
    document = json.loads(done.output)
    costs = {row["who"]: row["cost"] for row in document["rows"]}
    hours = document["chargeback"]["hours"]
    assert document["chargeback"]["gpus"] == {"alpha": 1, "beta": 2}
    assert costs["key:a"] == pytest.approx(3.0 * hours * 240 / 250, rel=1e-6)
    assert costs["key:b"] == pytest.approx(3.0 * hours * 10 / 250, rel=1e-6)
    assert document["chargeback"]["idle_cost"] == {"beta": pytest.approx(6.0 * hours)}
    text = run_kit("usage", spec, "--since", day, "--until", day).output
    assert "COST/M TOKENS" in text and "per GPU-hour" in text
