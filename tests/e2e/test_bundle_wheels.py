"""kit's wheels as `kit bundle` gathers them (kit.supply.wheelhouse: kit built from this source,
its dependencies at the installed versions, each pinned by sha256) installed into a fresh
virtualenv with no network at all (`unshare -n`): `pip install --no-index --require-hashes`,
then the installed kit runs. A wheel changed by one byte is refused by pip.

Gathering needs the package index with the installed versions (CI has it); where pip cannot
reach one the test is skipped, saying so."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.supply.wheelhouse import build_wheelhouse

pytestmark = pytest.mark.e2e


def offline(*argv: str) -> subprocess.CompletedProcess:
    """`argv` in a new network namespace with no interface up (nothing can be reached), without
    PYTHONPATH (the tests' own kit would count as installed)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, timeout=600,
                          env=env)


def test_kit_installs_from_its_wheels_with_no_network(tmp_path: Path) -> None:
    started = time.monotonic()
    try:
        files = build_wheelhouse(tmp_path / "wheels")
    except KitError as error:
        if "Failed to establish a new connection" in error.message or \
                "No matching distribution" in error.message:
            pytest.skip(f"no package index with the installed versions here: {error.message}")
        raise
    gathered = time.monotonic() - started
    wheels = tmp_path / "wheels"
    requirements = (wheels / "requirements.txt").read_text().splitlines()
    assert len(requirements) == len(files) - 1 and any(r.startswith("kit==") for r in requirements)
    assert all(" --hash=sha256:" in line for line in requirements)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
               str(wheels), "--require-hashes", "-r", str(wheels / "requirements.txt")]
    tampered = tmp_path / "tampered"
    shutil.copytree(wheels, tampered)
    kit_wheel = next(tampered.glob("kit-*.whl"))
    data = bytearray(kit_wheel.read_bytes())
    data[len(data) // 2] ^= 1
    kit_wheel.write_bytes(bytes(data))
    refused = offline(*install[:5], str(tampered), *install[6:8], str(tampered /
                                                                       "requirements.txt"))
    assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr, \
        (refused.args, refused.stdout, refused.stderr)
    started = time.monotonic()
    installed = offline(*install)
    assert installed.returncode == 0, installed.stderr
    seconds = time.monotonic() - started
    ran = offline(str(venv / "bin" / "kit"), "--version")
    assert ran.returncode == 0 and "kit, version" in ran.stdout, ran.stderr
    schema = offline(str(venv / "bin" / "kit"), "schema")  # templates and data files are in
    assert schema.returncode == 0 and '"services"' in schema.stdout, schema.stderr
    print(f"{len(files) - 1} wheels gathered in {gathered:.1f} s, installed with no network in "
          f"{seconds:.1f} s")
