"""--write-spec: one value changes and every other byte stays (golden files per case: comments,
CRLF, BOM and document markers, flow style; a symlinked spec, its mode); only a measured
boundary is written; and `kit bench`'s bad input: exit 2, nothing written."""

import json
import os
from pathlib import Path

import pytest

from kit.bench import run as bench_run
from kit.bench.analysis import Recommendation, SloBounds, recommend, summarize
from kit.bench.client import Outcome, StepRecord
from kit.bench.run import BenchRun
from kit.bench.spec_edit import with_max_num_seqs, write_max_num_seqs
from kit.errors import BadInput
from tests.support.cli import run_kit
from tests.support.sites import LLAMA_8B, REPO, tree

DATA = REPO / "tests" / "data" / "bench"


def test_only_max_num_seqs_changes_and_comments_stay():
    before = (DATA / "site-before.yaml").read_text()
    after = with_max_num_seqs(before, "llama8b", 24)
    assert after == (DATA / "site-after-llama8b-24.yaml").read_text()


@pytest.mark.parametrize(("case", "service", "seqs"), [
    ("crlf", "llama8b", 24),  # CRLF kept on every line, the value replaced in place
    ("bom-markers", "small", 12),  # BOM, %YAML, `---`, `...` and the comments around them kept
    ("flow", "small", 12),  # a flow-style entry gets the key inside its braces
])
def test_every_other_byte_stays(case: str, service: str, seqs: int):
    before = (DATA / f"{case}-before.yaml").read_bytes()
    after = with_max_num_seqs(before.decode(), service, seqs).encode()
    assert after == (DATA / f"{case}-after-{service}-{seqs}.yaml").read_bytes()


def test_a_service_without_the_key_gets_it_added_in_its_block():
    after = with_max_num_seqs((DATA / "site-before.yaml").read_text(), "small", 12)
    block = after.split("- name: small")[1]
    assert "max_num_seqs: 12" in block and "# max_num_seqs left to kit" in after
    assert "max_num_seqs: 64        # set by hand in March" in after


def test_writes_the_file_only_when_the_spec_still_loads(tmp_path: Path):
    models = tmp_path / "models" / "llama-8b"
    models.mkdir(parents=True)
    (models / "config.json").write_text(json.dumps(LLAMA_8B))
    spec = tmp_path / "site.yaml"
    spec.write_text((DATA / "site-before.yaml").read_text().replace("MODELS",
                                                                     str(tmp_path / "models")))
    write_max_num_seqs(spec, "llama8b", 24)
    assert "max_num_seqs: 24        # set by hand" in spec.read_text()
    before = spec.read_text()
    with pytest.raises(BadInput):
        write_max_num_seqs(spec, "llama8b", 0)  # below the spec's minimum
    with pytest.raises(BadInput, match="no service 'nope'"):
        write_max_num_seqs(spec, "nope", 4)
    assert spec.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "site.yaml"]


def spec_file(folder: Path, case: str = "site") -> Path:
    """A valid spec from DATA's `case` (models_root made under `folder`)."""
    models = folder / "models" / "llama-8b"
    models.mkdir(parents=True)
    (models / "config.json").write_text(json.dumps(LLAMA_8B))
    spec = folder / "site.yaml"
    spec.write_bytes((DATA / f"{case}-before.yaml").read_bytes()
                     .replace(b"MODELS", str(folder / "models").encode()))
    return spec


def test_a_symlinked_spec_is_written_through_the_link(tmp_path: Path):
    real = spec_file(tmp_path, "crlf")
    (tmp_path / "conf").mkdir()
    link = tmp_path / "conf" / "site.yaml"
    link.symlink_to(real)
    assert write_max_num_seqs(link, "llama8b", 24) == real
    assert link.is_symlink() and os.readlink(link) == str(real)
    expected = (DATA / "crlf-after-llama8b-24.yaml").read_bytes()
    assert real.read_bytes() == expected.replace(b"MODELS", str(tmp_path / "models").encode())
    assert sorted(p.name for p in (tmp_path / "conf").iterdir()) == ["site.yaml"]


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_the_spec_keeps_its_mode_and_owner(tmp_path: Path, mode: int):
    spec = spec_file(tmp_path)
    spec.chmod(mode)
    before = spec.stat()
    write_max_num_seqs(spec, "llama8b", 24)
    after = spec.stat()
    assert (after.st_mode & 0o7777, after.st_uid, after.st_gid) == (
        mode, before.st_uid, before.st_gid)
    assert after.st_ino != before.st_ino  # replaced atomically, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "site.yaml"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another owner")
def test_a_spec_owned_by_another_user_keeps_its_owner(tmp_path: Path):
    spec = spec_file(tmp_path)
    os.chown(spec, 4321, 4322)
    spec.chmod(0o640)
    write_max_num_seqs(spec, "llama8b", 24)
    after = spec.stat()
    assert (after.st_uid, after.st_gid, after.st_mode & 0o7777) == (4321, 4322, 0o640)


def passing_step(slo: SloBounds):
    """32 streams well within the SLO (TTFT 100 ms, TPOT 10 ms)."""
    gaps = [0.01] * 10
    outcomes = [Outcome(ttft=0.1, latency=0.1 + sum(gaps), itl=gaps, prompt_tokens=100,
                        output_tokens=11)] * 10
    return summarize(StepRecord(32, outcomes, duration_s=2.0, lag_p90_ms=0.5, lag_max_ms=0.5),
                     slo, None)


def finished_run(first_failing: int | None) -> BenchRun:
    """A run where every step up to 32 streams passed and, when given, `first_failing` failed;
    with no failure the recommendation is the real `recommend`'s."""
    slo = SloBounds(ttft_p95_ms=500, tpot_p95_ms=50)
    run = BenchRun("llama8b", slo, 64, 32, gpus=1, replicas=1, configured_max_num_seqs=None,
                   max_passing=32, first_failing=first_failing)
    run.recommendation = (
        recommend([passing_step(slo)], slo, 32, None, replicas=1, configured_max_num_seqs=None)
        if first_failing is None else Recommendation(32, f"TTFT over the SLO at {first_failing}"))
    return run


@pytest.mark.parametrize(("first_failing", "exit_code"), [
    (None, 1),  # every step passed: no boundary measured, nothing written, exit 1
    (40, 0),  # a failing step bounds it: written
])
def test_write_spec_writes_only_a_measured_boundary(site: Path, monkeypatch, first_failing,
                                                    exit_code):
    monkeypatch.setattr(bench_run, "run_bench", lambda *_: finished_run(first_failing))
    before = (site / "site.yaml").read_bytes()
    result = run_kit("bench", site / "site.yaml", "--write-spec", "--out", site.parent / "out")
    assert result.exit_code == exit_code, result.output
    if first_failing is None:
        assert (site / "site.yaml").read_bytes() == before
        assert "max_num_seqs at least 32 per replica" in result.output
        assert ("nothing written to the spec: no step failed, so no boundary was measured "
                "(every step up to 32 streams met the SLO)") in result.output
    else:
        assert "max_num_seqs: 32" in (site / "site.yaml").read_text()
        assert "max_num_seqs 32 for llama8b" in result.output


def test_an_embedding_model_is_not_benched(site: Path):
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace('extra_args: ["--enable-prefix-caching"]',
                                             'extra_args: ["--runner", "pooling"]'))
    before = tree(site)
    for args in ([], ["--service", "llama8b"]):
        result = run_kit("bench", spec, *args)
        assert result.exit_code == 2, result.output
        assert "an embedding model: kit bench measures streamed completions" in result.output
    assert tree(site) == before


@pytest.mark.parametrize(("args", "message"), [
    (["--service", "nope"], "no service 'nope'"),
    (["--concurrency", "4,x"], "positive integers separated by commas"),
    (["--concurrency", "0"], "positive integers separated by commas"),
    ([], "run kit render first"),  # no site CA yet: nothing to verify the front door with
])
def test_bad_input_is_exit_2_and_writes_nothing(site: Path, args, message):
    before = tree(site)
    result = run_kit("bench", site / "site.yaml", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert tree(site) == before
