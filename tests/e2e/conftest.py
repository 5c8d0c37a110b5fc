"""Fixtures for end-to-end tests against a real Docker engine and the local test images.

The engine comes from scripts/dockerd.sh (or whatever engine already answers); the images from
tests/images/build.sh, run once per session (their names: tests/support/docker_engine.py).
Without an engine the tests are skipped with the reason (CI has one). Mark such tests with
@pytest.mark.e2e.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator

import docker
import pytest

from tests.support.docker_engine import (
    BUILD,
    DOCKERD,
    IMAGES,
    PROJECT_LABEL,
    pick_free_port,
    remove_project,
)
from tests.support.live_stack import stop_loads


@pytest.fixture(scope="session")
def docker_client():
    """docker.from_env(), or a skip (with the reason) when no engine answers."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine answers ({e}); start one with scripts/dockerd.sh start")
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_images(docker_client) -> dict[str, str]:
    """Builds (or re-tags, when nothing changed) the test images once a session, and proves that
    the engine gives containers GPUs (every kit service reserves some): an engine someone else
    started may lack even the test stub of the NVIDIA hook, and the fix is named once, here."""
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"tests/images/build.sh failed:\n{result.stderr}", pytrace=False)
    for name in IMAGES.values():
        docker_client.images.get(name)
    gpus = subprocess.run(["bash", str(DOCKERD), "gpus", IMAGES["vllm_standin"]],
                          capture_output=True, text=True, timeout=120)
    if gpus.returncode != 0:
        pytest.fail(f"the end-to-end tests need GPU reservations:\n{gpus.stderr}", pytrace=False)
    return dict(IMAGES)


@pytest.fixture(autouse=True)
def no_load_outlives_its_test() -> Iterator[None]:
    """A shared stack's loadgens stop with the test that started them, failed or not (after
    the test's own fixtures are torn down: autouse ones are the last)."""
    yield
    stop_loads()


@pytest.fixture
def free_port() -> Callable[..., int]:
    return pick_free_port


@pytest.fixture
def compose_project(docker_client) -> Iterator[str]:
    """A fresh compose project name; everything labelled with it is removed afterwards."""
    project = f"kite2e{secrets.token_hex(4)}"
    yield project
    remove_project(docker_client, project)


@pytest.fixture
def project_labels(compose_project) -> dict[str, str]:
    """Labels that put a container started by hand into `compose_project` (so it is removed)."""
    return {PROJECT_LABEL: compose_project}


@pytest.fixture
def cleanup_project(docker_client) -> Iterator[Callable[[str], None]]:
    """Register project names (e.g. a site name) whose resources must go after the test."""
    projects: list[str] = []
    yield projects.append
    for project in projects:
        remove_project(docker_client, project)
