"""The README's "Try it without a GPU" path, run as it is written (tests/support/readme.py) on the
engine: scripts/try-without-gpu.sh, a stream through the front door with curl and with the
OpenAI SDK, then `kit down`. Only the ports differ (free ones, given to the script by
KIT_TRY_PORT / KIT_TRY_HTTP_PORT) and the site's name (KIT_TRY_SITE: tests running at once, or
two people on one engine, each have their own); `kit` is this checkout's.

The engine already holds other images under the public names the spec would default to
(issue 42): the suite's shared engine holds its test images there, which other tests use, so
they are not re-tagged here; instead the `docker` the script runs answers for those names as
for an unrelated image (no kit label) and refuses to tag or remove anything under them. The
real images under the public names are the same before and after."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import docker.errors
import pytest

from tests.support.docker_engine import PROJECT_LABEL
from tests.support.readme import shell_blocks
from tests.support.sites import REPO

pytestmark = pytest.mark.e2e

PUBLIC_NAMES = ("vllm/vllm-openai:v0.33.0", "nginx:1.27-alpine")
TRY_IMAGES = {"kit-try/vllm-standin:v0.33.0", "kit-try/nginx:1.26"}
# `docker` as the script sees it: the public names hold someone else's images (inspect answers
# without kit's label), which nothing may tag over or remove; everything else is the engine's.
GUARDED_DOCKER = """#!/bin/sh
for arg in "$@"; do
    case "$arg" in
    vllm/vllm-openai:v0.33.0 | nginx:1.27-alpine)
        echo "$*" >>"{calls}"
        if [ "$1" = image ] && [ "$2" = inspect ]; then
            echo '{{"org.opencontainers.image.title":"someone else"}}'
            exit 0
        fi
        echo "guarded docker: $* would change someone else's $arg" >&2
        exit 1 ;;
    esac
done
exec {docker} "$@"
"""


def test_the_readme_path_streams_through_the_door_and_comes_down(
    tmp_path: Path, docker_client, cleanup_project, free_port
) -> None:
    install, *typed = shell_blocks("Try it without a GPU")
    assert "pip install" in install  # done already: kit and openai are this run's
    site = f"kit-try-{secrets.token_hex(3)}"
    cleanup_project(site)
    public_before = {name: _image_id(docker_client, name) for name in PUBLIC_NAMES}
    https_port, http_port = free_port(), free_port()
    (tmp_path / "scripts").symlink_to(REPO / "scripts")  # the README's commands run from a clone
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kit").write_text(f'#!/bin/sh\nexec {sys.executable} -m kit "$@"\n')
    (bin_dir / "kit").chmod(0o755)
    calls = tmp_path / "public-name-calls"
    (bin_dir / "docker").write_text(GUARDED_DOCKER.format(calls=calls,
                                                          docker=shutil.which("docker")))
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "KIT_TRY_PORT": str(https_port), "KIT_TRY_HTTP_PORT": str(http_port),
           "KIT_TRY_SITE": site}
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
            running = docker_client.containers.list(filters={"label": f"{PROJECT_LABEL}={site}"})
            images = {c.attrs["Config"]["Image"] for c in running}
            assert images >= TRY_IMAGES and not images & set(PUBLIC_NAMES), images
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
                                             filters={"label": f"{PROJECT_LABEL}={site}"})
    assert not calls.exists(), calls.read_text()  # the script never named the public images
    assert {name: _image_id(docker_client, name) for name in PUBLIC_NAMES} == public_before


def _image_id(client, name: str) -> str | None:
    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        return None
