"""The README's no-GPU path against scripts/try-without-gpu.sh, without Docker (a fake `docker`
CLI; run for real by tests/e2e/test_try_without_gpu.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.fake_docker import fake_docker
from tests.support.readme import shell_blocks
from tests.support.sites import REPO

TRY = REPO / "scripts" / "try-without-gpu.sh"


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
