"""kit's wheelhouse without pip or an index: the requirements file pins every wheel by name,
version and sha256; the source kit builds from is the one that runs; pip's failures are
named with their last lines."""

import hashlib
import subprocess
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.supply import wheelhouse
from tests.support.sites import REPO


def test_requirements_pin_each_wheel_by_sha256(tmp_path: Path) -> None:
    wheels = {"PyYAML-6.0.3-cp311-cp311-manylinux_2_17_x86_64.whl": b"a",
              "grafana_foundation_sdk-1769699998!10.1.0-py3-none-any.whl": b"b",
              "kit-0.1.0-py3-none-any.whl": b"c"}
    for name, data in wheels.items():
        (tmp_path / name).write_bytes(data)
    text = wheelhouse.requirements_text(sorted(tmp_path.iterdir()))
    assert text.splitlines() == [
        f"grafana_foundation_sdk==1769699998!10.1.0 --hash=sha256:"
        f"{hashlib.sha256(b'b').hexdigest()}",
        f"kit==0.1.0 --hash=sha256:{hashlib.sha256(b'c').hexdigest()}",
        f"PyYAML==6.0.3 --hash=sha256:{hashlib.sha256(b'a').hexdigest()}",
    ]
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(KitError, match="notes.txt is not a wheel"):
        wheelhouse.requirements_text([tmp_path / "notes.txt"])


def test_the_source_is_the_kit_that_runs_and_kit_is_no_constraint() -> None:
    assert wheelhouse.kit_source() == REPO
    constraints = wheelhouse.installed_constraints().splitlines()
    assert not any(line.lower().startswith("kit==") for line in constraints)
    assert any(line.lower().startswith("pyyaml==") for line in constraints)


def test_a_pip_failure_names_its_last_lines(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def pip(argv, **_):
        calls.append(argv)
        if "download" in argv:
            return subprocess.CompletedProcess(argv, 1, "", "noise\nERROR: No matching "
                                               "distribution found for docker[ssh]>=7.0\n")
        Path(argv[argv.index("-w") + 1], "kit-0.1.0-py3-none-any.whl").write_bytes(b"w")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", pip)
    with pytest.raises(KitError, match="downloading kit's dependencies: pip failed") as error:
        wheelhouse.build_wheelhouse(tmp_path / "wheels")
    assert "No matching distribution found for docker[ssh]" in error.value.message
    assert "--without-kit" in error.value.fix
    build = calls[0]
    assert build[-1] == str(tmp_path / "kit-source")  # a copy of the source, never it
