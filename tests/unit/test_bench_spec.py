"""--write-spec: one value changes, the operator's comments, quoting and layout stay (golden);
and `kit bench`'s bad input: exit 2, nothing written."""

import json
from pathlib import Path

import pytest

from kit.bench_spec import with_max_num_seqs, write_max_num_seqs
from kit.errors import BadInput
from tests.conftest import LLAMA_8B, REPO, tree
from tests.support.cli import run_kit

DATA = REPO / "tests" / "data" / "bench"


def test_only_max_num_seqs_changes_and_comments_stay():
    before = (DATA / "site-before.yaml").read_text()
    after = with_max_num_seqs(before, "llama8b", 24)
    assert after == (DATA / "site-after-llama8b-24.yaml").read_text()


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
