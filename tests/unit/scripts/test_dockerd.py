"""scripts/dockerd.sh's NVIDIA hook stub and GPU check, without Docker (a fake `docker` CLI)."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.fake_docker import fake_docker
from tests.support.sites import REPO

DOCKERD = REPO / "scripts" / "dockerd.sh"
NO_DRIVER = ('docker: Error response from daemon: could not select device driver "" with '
             "capabilities: [[gpu]].")


def dockerd_sh(*args: str, lib: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "KIT_TEST_LIB": str(lib), "KIT_TEST_STATE": str(lib / "state")}
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run(["bash", str(DOCKERD), *args], env=env, capture_output=True, text=True,
                          timeout=60)


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
