"""kit/state.py: one rule for kit's state files — missing is None, broken is exit 2 with a fix."""

from pathlib import Path

import pytest

from kit.engine.observe import read_proxy_loaded
from kit.errors import BadInput, ExitCode
from kit.state import json_object, read_state


def test_a_missing_file_is_nothing_recorded(tmp_path: Path) -> None:
    assert read_state(tmp_path / "absent.json", json_object, fix="unused") is None


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "42", "\xff\xfe"])
def test_a_corrupt_file_is_bad_input_naming_it_and_the_fix(tmp_path: Path, content: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(BadInput) as raised:
        read_state(path, json_object, fix="delete it")
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert str(path) in raised.value.message
    assert raised.value.fix == "delete it"


def test_an_unreadable_file_is_bad_input(tmp_path: Path) -> None:
    folder = tmp_path / "state.json"
    folder.mkdir()  # reading a directory fails with an OSError, as a permission problem would
    with pytest.raises(BadInput, match="cannot read"):
        read_state(folder, json_object, fix="remove it")


def test_a_state_file_missing_its_keys_is_corrupt_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "applied.json"
    path.write_text('{"proxy": {"container_id": "abc"}}')
    with pytest.raises(BadInput, match="corrupt"):
        read_proxy_loaded(path)
