"""How scripts/test.sh splits the suite (docs/testing.md): the pass a test belongs to (tests marked
`serial` run alone, the rest in pytest-xdist workers at once), the worker group of each e2e test,
and which worker this process is (what tests running at once must not share is split by it)."""

from __future__ import annotations

import os

import pytest

MAX_WORKERS = 12  # tests/support/docker_engine.py gives each its slice of ports


def worker_index() -> int:
    """This process's pytest-xdist worker number (gw3: 3); 0 in a run without workers."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    if index >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} pytest-xdist workers (KIT_TEST_WORKERS): "
                           "each has its own slice of free ports below the ephemeral range")
    return index


def select_pass(items: list[pytest.Item], choice: str | None) -> list[pytest.Item]:
    """The items of one pass of --serial-tests: `only` the ones marked serial, `skip` the
    others, None all of them; the ones left out are returned (to report as deselected)."""
    if choice is None:
        return []
    wanted = choice == "only"
    kept = [item for item in items if (item.get_closest_marker("serial") is not None) == wanted]
    left_out = [item for item in items if item not in kept]
    items[:] = kept
    return left_out


def group_by_module(items: list[pytest.Item]) -> None:
    """Every e2e test without an xdist_group of its own joins its module's: under
    `--dist loadgroup` a module runs on one worker, in order, and builds its module-scoped
    stacks once."""
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
