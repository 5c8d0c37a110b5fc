"""kit bench's choices before any request: which SLO judges a step, and the replicas it sees."""

import json
import sys
from pathlib import Path

import pytest

from kit.bench import run as bench_run
from kit.bench.analysis import DEFAULT_SLO, SloBounds
from kit.bench.run import slo_for
from kit.plan.host import load_spec
from tests.support.bench_door import local_door
from tests.support.cli import run_kit
from tests.support.sites import REPO
from tests.support.standin_process import LLAMA_8B, model_dir, serving


def _service(tmp_path: Path, extra: str = ""):
    text = (REPO / "site.yaml").read_text().replace(
        '    env: {VLLM_ENGINE_READY_TIMEOUT_S: "1200"}',
        '    env: {VLLM_ENGINE_READY_TIMEOUT_S: "1200"}\n' + extra)
    spec = tmp_path / "site.yaml"
    spec.write_text(text)
    return load_spec(spec).services[0]


def test_without_flags_or_spec_slo_the_default_judges(tmp_path: Path) -> None:
    assert slo_for(_service(tmp_path), None, None) == DEFAULT_SLO


@pytest.mark.parametrize(("written", "flags", "expected"), [
    ("    slo: {ttft_p95_ms: 400, tpot_p95_ms: 30}\n", (None, None), SloBounds(400, 30)),
    ("    slo: {ttft_p95_ms: 400}\n", (None, None), SloBounds(400, DEFAULT_SLO.tpot_p95_ms)),
    ("    slo: {ttft_p95_ms: 400, tpot_p95_ms: 30}\n", (250.0, None), SloBounds(250, 30)),
    ("", (250.0, 20.0), SloBounds(250, 20)),
])
def test_the_flag_wins_then_the_spec_slo(tmp_path: Path, written: str, flags, expected) -> None:
    assert slo_for(_service(tmp_path, written), *flags) == expected


@pytest.mark.parametrize(("args", "message"), [
    (["--request-rate", "2,x"], "positive request rates"),
    (["--request-rate", "0"], "positive request rates"),
    (["--request-rate", "inf"], "positive request rates"),
    (["--arrival", "lockstep", "--request-rate", "2"], "is a closed loop of streams"),
    (["--arrival", "poisson", "--concurrency", "4"], "driven by a request rate"),
    (["--arrival", "burst"], "'burst' is not one of"),
])
def test_arrival_and_rate_mistakes_are_exit_2(site: Path, args, message) -> None:
    result = run_kit("bench", site / "site.yaml", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (site / "bench").exists()


def test_without_matplotlib_bench_measures_and_says_the_charts_were_skipped(
        site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The plot extra draws the PNGs only: without matplotlib `kit bench` measures all the same
    (table, bench.json, bench.csv, exit 0) and says, before and after, that the charts were
    skipped and how to get them (issue 42)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    model = model_dir(tmp_path, "tiny", LLAMA_8B)
    with serving(str(model), "--max-num-seqs", "8", STANDIN_TTFT_MS="20") as (port, _):
        monkeypatch.setattr(bench_run, "BenchDoor", local_door(port, model))
        result = run_kit("bench", site / "site.yaml", "--concurrency", "1,2",
                         "--requests-per-step", "2", "--output-tokens", "4",
                         "--slo-ttft-p95-ms", "5000", "--slo-tpot-p95-ms", "1000")
    assert result.exit_code == 0, result.output
    skipped = ("charts skipped: kit bench (bench.png, bench-pareto.png) draws with matplotlib, "
               "which is not installed (it is the optional extra kit[plot]); the table, "
               "bench.json and bench.csv are written all the same. For the charts: "
               "pip install 'kit[plot]'")
    assert result.output.count(skipped) == 2, result.output  # before the run and after it
    assert "concurrency" in result.output.lower()  # the table
    assert sorted(p.name for p in (site / "bench").iterdir()) == ["bench.csv", "bench.json"]
    steps = json.loads((site / "bench" / "bench.json").read_text())["steps"]
    assert sorted(step["max_concurrency"] for step in steps) == [1, 2]
    assert (site / "bench" / "bench.csv").read_text().count("\n") == 3  # header + 2 steps
