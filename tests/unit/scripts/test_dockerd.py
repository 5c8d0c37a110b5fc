"""scripts/dockerd.sh's NVIDIA hook stub and GPU check, without Docker (a fake `docker` CLI),
and the README's no-GPU path against scripts/try-without-gpu.sh (run for real by
tests/e2e/test_try_without_gpu.py)."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.readme import shell_blocks
from tests.support.sites import REPO

DOCKERD = REPO / "scripts" / "dockerd.sh"
TRY = REPO / "scripts" / "try-without-gpu.sh"
NO_DRIVER = ('docker: Error response from daemon: could not select device driver "" with '
             "capabilities: [[gpu]].")


def dockerd_sh(*args: str, lib: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "KIT_TEST_LIB": str(lib), "KIT_TEST_STATE": str(lib / "state")}
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run(["bash", str(DOCKERD), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def fake_docker(folder: Path, exit_code: int, message: str = "") -> Path:
    """A `docker` that records its arguments and answers like an engine would."""
    folder.mkdir()
    (folder / "docker").write_text(
        f'#!/bin/sh\necho "$@" >>{folder}/calls\necho \'{message}\' >&2\nexit {exit_code}\n')
    (folder / "docker").chmod(0o755)
    return folder


def test_hook_writes_a_stub_that_accepts_the_hook_call_wherever_the_engine_came_from(
    tmp_path: Path,
) -> None:
    lib = tmp_path / "lib"
    printed = dockerd_sh("hook", lib=lib)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == str(lib / "bin")
    stub = lib / "bin" / "nvidia-container-runtime-hook"
    called = subprocess.run([str(stub), "prestart"], input='{"ociVersion": "1.0.2"}',
                            capture_output=True, text=True)
    assert called.returncode == 0 and called.stdout == ""
    inode = stub.stat().st_ino
    assert dockerd_sh("hook", lib=lib).returncode == 0
    assert stub.stat().st_ino == inode  # the same stub is left as it is


def test_hook_written_by_many_callers_at_once_is_whole(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: dockerd_sh("hook", lib=lib), range(8)))
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results]
    assert sorted(p.name for p in (lib / "bin").iterdir()) == ["nvidia-container-runtime-hook"]


def test_gpus_passes_when_a_gpu_reserving_container_starts(tmp_path: Path) -> None:
    fake = fake_docker(tmp_path / "fake", 0)
    checked = dockerd_sh("gpus", "kit-test/vllm-standin:latest", lib=tmp_path / "lib",
                         path=str(fake))
    assert checked.returncode == 0, checked.stderr
    assert (fake / "calls").read_text().split() == [
        "run", "--rm", "--network", "none", "--gpus", "device=0", "--entrypoint", "true",
        "kit-test/vllm-standin:latest"]


def test_gpus_on_an_engine_without_the_nvidia_driver_names_the_stub_and_the_fix(
    tmp_path: Path,
) -> None:
    fake = fake_docker(tmp_path / "fake", 125, NO_DRIVER)
    lib = tmp_path / "lib"
    checked = dockerd_sh("gpus", "kit-test/vllm-standin:latest", lib=lib, path=str(fake))
    assert checked.returncode == 1
    assert "cannot start a container that reserves a GPU" in checked.stderr
    assert NO_DRIVER in checked.stderr
    assert f"PATH={lib / 'bin'}:" in checked.stderr and "systemctl restart docker" in checked.stderr
    assert (lib / "bin" / "nvidia-container-runtime-hook").exists()  # the folder it names


def test_gpus_passes_any_other_engine_error_on_without_a_wrong_fix(tmp_path: Path) -> None:
    fake = fake_docker(tmp_path / "fake", 125, "Unable to find image 'x:1' locally")
    checked = dockerd_sh("gpus", "x:1", lib=tmp_path / "lib", path=str(fake))
    assert checked.returncode == 1
    assert "Unable to find image" in checked.stderr and "systemctl" not in checked.stderr


def test_the_readme_no_gpu_path_uses_the_script_and_its_default_port() -> None:
    install, script, curl, sdk, down = shell_blocks("Try it without a GPU")
    assert "pip install" in install and script.strip() == "scripts/try-without-gpu.sh"
    default_port = re.search(r'HTTPS_PORT="\$\{KIT_TRY_PORT:-(\d+)\}"', TRY.read_text())[1]
    assert f"localhost:{default_port}/" in curl and f"localhost:{default_port}/" in sdk
    assert down.strip() == "kit down kit-try/site.yaml"


@pytest.mark.parametrize("name", ["Kit-try", "kit_try", "kit-try\nx", "9kit", "k" * 32, "kit try",
                                  "../kit"])
def test_try_refuses_a_site_name_kit_would_refuse_before_anything(tmp_path: Path,
                                                                   name: str) -> None:
    """KIT_TRY_SITE (two people on one engine): matched whole by kit's own allow-list, exit 2
    naming the variable, before the engine is asked anything or a file is written."""
    fake = fake_docker(tmp_path / "fake", 0)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "KIT_TRY_SITE": name}
    ran = subprocess.run(["bash", str(TRY), str(tmp_path / "try")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert "is not a site name" in ran.stderr and "KIT_TRY_SITE=" in ran.stderr
    assert not (fake / "calls").exists() and not (tmp_path / "try").exists()
