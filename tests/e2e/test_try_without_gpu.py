"""The README's "Try it without a GPU" path, run as it is written (tests/support/readme.py) on the
engine: scripts/try-without-gpu.sh, a stream through the front door with curl and with the
OpenAI SDK, then `kit down`. Only the ports differ (free ones, given to the script by
KIT_TRY_PORT / KIT_TRY_HTTP_PORT); `kit` is this checkout's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.docker_engine import PROJECT_LABEL
from tests.support.readme import shell_blocks
from tests.support.sites import REPO

pytestmark = pytest.mark.e2e

SITE = "kit-try"  # the project the script's spec names


def test_the_readme_path_streams_through_the_door_and_comes_down(
    tmp_path: Path, docker_client, cleanup_project, free_port
) -> None:
    install, *typed = shell_blocks("Try it without a GPU")
    assert "pip install" in install  # done already: kit and openai are this run's
    cleanup_project(SITE)
    https_port, http_port = free_port(), free_port()
    (tmp_path / "scripts").symlink_to(REPO / "scripts")  # the README's commands run from a clone
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kit").write_text(f'#!/bin/sh\nexec {sys.executable} -m kit "$@"\n')
    (bin_dir / "kit").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "KIT_TRY_PORT": str(https_port), "KIT_TRY_HTTP_PORT": str(http_port)}
    script_block = typed[0]
    runs, seconds = [], []
    for block in [script_block, *typed]:  # the script twice: a second run keeps what it made
        started = time.monotonic()
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c",
                              block.replace(":8443", f":{https_port}")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        seconds.append(time.monotonic() - started)
        assert ran.returncode == 0, f"{block}\n{ran.stdout}\n{ran.stderr}"
        runs.append(ran)
        if len(runs) == 1:
            key = (tmp_path / "kit-try" / "api-key").read_text()
    print("README blocks (the script twice):", ", ".join(f"{s:.1f} s" for s in seconds))
    first, again, curl, sdk, down = (ran.stdout for ran in runs)
    assert "all checks passed" in first and "all checks passed" in again  # kit up's gate
    assert "site.yaml exists: kept as it is" in runs[1].stderr
    assert (tmp_path / "kit-try" / "api-key").read_text() == key
    assert stat.S_IMODE((tmp_path / "kit-try" / "api-key").stat().st_mode) == 0o600
    events = [line for line in curl.splitlines() if line.startswith("data: ")]
    assert len(events) > 2 and events[-1] == "data: [DONE]", curl
    assert sdk.strip(), "the OpenAI SDK streamed no text"
    assert not docker_client.containers.list(all=True,
                                             filters={"label": f"{PROJECT_LABEL}={SITE}"})
