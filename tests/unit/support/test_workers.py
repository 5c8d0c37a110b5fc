"""How the suite splits for scripts/test.sh (tests/support/workers.py, docs/testing.md): the two
passes cover every test once, e2e tests keep their module's worker unless they name a group,
and parallel workers never pick the same free port."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.support import docker_engine
from tests.support.sites import REPO
from tests.support.workers import group_by_module, select_pass, worker_index


class Item:
    """What the collection hooks read of a pytest item."""

    def __init__(self, nodeid: str, *marks: pytest.MarkDecorator) -> None:
        self.nodeid, self.marks = nodeid, [mark.mark for mark in marks]

    def get_closest_marker(self, name: str):
        return next((mark for mark in self.marks if mark.name == name), None)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.mark)


def group(item: Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark else None


def collected(*args: str) -> set[str]:
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                             "-p", "no:cacheprovider", *args, "tests/e2e"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return {line for line in listed.stdout.splitlines() if "::" in line}


def test_the_serial_and_the_parallel_pass_together_run_every_e2e_test_once() -> None:
    serial, parallel = collected("--serial-tests", "only"), collected("--serial-tests", "skip")
    assert serial and parallel and not serial & parallel
    assert serial | parallel == collected()


def test_a_pass_keeps_its_own_and_returns_the_others() -> None:
    timed, other = Item("tests/e2e/test_t.py::a", pytest.mark.serial), Item("tests/unit/x.py::b")
    items = [timed, other]
    assert select_pass(items, "only") == [other] and items == [timed]
    items = [timed, other]
    assert select_pass(items, "skip") == [timed] and items == [other]
    items = [timed, other]
    assert select_pass(items, None) == [] and items == [timed, other]


def test_e2e_tests_join_their_module_unless_they_name_a_group() -> None:
    plain = Item("tests/e2e/test_a.py::test_one[x]", pytest.mark.e2e)
    named = Item("tests/e2e/test_a.py::test_two", pytest.mark.e2e, pytest.mark.xdist_group("w"))
    unit = Item("tests/unit/test_b.py::test_three")
    group_by_module([plain, named, unit])
    assert (group(plain), group(named), group(unit)) == ("tests/e2e/test_a.py", "w", None)


def test_workers_pick_ports_from_slices_of_their_own(monkeypatch) -> None:
    picked = {}
    for worker in ("gw0", "gw1", "gw11"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        picked[worker] = {docker_engine.pick_free_port() for _ in range(50)}
    assert all(len(ports) == 50 for ports in picked.values())  # no port twice in a row
    for worker, ports in picked.items():
        first = docker_engine.FIRST_PORT + int(worker[2:]) * docker_engine.WORKER_PORTS
        assert all(first <= port < first + docker_engine.WORKER_PORTS for port in ports)
    assert max(picked["gw11"]) < 32768  # below the kernel's ephemeral range


def test_a_port_in_use_is_not_picked(monkeypatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    with socket.socket() as holder:
        port = docker_engine.pick_free_port()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        others = {docker_engine.pick_free_port() for _ in range(docker_engine.WORKER_PORTS - 1)}
        assert port not in others


def test_more_workers_than_slices_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw12")
    with pytest.raises(RuntimeError, match="at most 12 pytest-xdist workers"):
        worker_index()
