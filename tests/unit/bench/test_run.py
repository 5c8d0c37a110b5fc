"""kit bench's choices before any request: which SLO judges a step, and the replicas it sees."""

import sys
from pathlib import Path

import pytest

from kit.bench.analysis import DEFAULT_SLO, Slo
from kit.bench.run import slo_for
from kit.plan.host import load_spec
from tests.support.cli import run_kit
from tests.support.sites import REPO


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
    ("    slo: {ttft_p95_ms: 400, tpot_p95_ms: 30}\n", (None, None), Slo(400, 30)),
    ("    slo: {ttft_p95_ms: 400}\n", (None, None), Slo(400, DEFAULT_SLO.tpot_p95_ms)),
    ("    slo: {ttft_p95_ms: 400, tpot_p95_ms: 30}\n", (250.0, None), Slo(250, 30)),
    ("", (250.0, 20.0), Slo(250, 20)),
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


def test_without_matplotlib_bench_is_exit_2_before_any_request(
        site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its PNGs need the plot extra: refused before the site is even loaded, not after a run
    of many minutes."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    result = run_kit("bench", site / "site.yaml")
    assert result.exit_code == 2, result.output
    assert "kit bench (bench.png, bench-pareto.png) draws with matplotlib" in result.output
    assert "pip install 'kit[plot]'" in result.output
    assert not (site / "bench").exists()
