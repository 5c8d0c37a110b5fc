"""One writer per site (kit/site_lock.py): the holder named, a bounded wait, a killed holder
never blocking, one lock per folder and per (engine, site name), and the verbs that take it."""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.site_lock import site_lock, stack_key, state_file_key, state_file_lock
from tests.support.cli import run_kit
from tests.support.lock_holder import start_holder
from tests.support.sites import tree

ENGINE = "unix:///run/test-engine.sock"


def test_a_second_writer_is_told_who_holds_the_site(tmp_path: Path):
    holder = start_holder(tmp_path, "up", 30)
    try:
        started = time.monotonic()
        with pytest.raises(KitError) as refused, site_lock(tmp_path, "render", wait=0):
            pass
        message = str(refused.value)
        assert time.monotonic() - started < 2
        assert f"site folder {os.path.realpath(tmp_path)} is in use by `kit up` " \
               f"(pid {holder.pid} on {socket.gethostname()}, since 20" in message
        assert "--wait-lock SECONDS" in message and refused.value.exit_code == 1
    finally:
        holder.kill()
        holder.wait()


def test_the_wait_is_bounded_and_ends_when_the_holder_does(tmp_path: Path):
    holder = start_holder(tmp_path, "down", 1.5)
    said: list[str] = []
    started = time.monotonic()
    with site_lock(tmp_path, "up", wait=30, report=said.append):
        waited = time.monotonic() - started
    holder.wait()
    assert 0.5 < waited < 25, waited  # it waited for the holder, not for the whole bound
    assert len(said) == 1 and "in use by `kit down`" in said[0] and "waiting up to 30 s" in said[0]

    holder = start_holder(tmp_path, "down", 60)
    try:
        started = time.monotonic()
        with pytest.raises(KitError, match="still after waiting 0.8 s"), \
                site_lock(tmp_path, "up", wait=0.8):
            pass
        assert 0.8 <= time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_killed_with_sigkill_blocks_no_one(tmp_path: Path):
    holder = start_holder(tmp_path, "up", 60, (ENGINE, "test01"))
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    with site_lock(tmp_path, "up", stack=(ENGINE, "test01"), wait=0):
        assert time.monotonic() - started < 1


def test_two_folders_of_one_stack_exclude_each_other(tmp_path: Path):
    """Same engine and site name from another folder: one stack, one lock; another site name or
    engine is another stack."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    holder = start_holder(tmp_path / "a", "up", 30, (ENGINE, "test01"))
    try:
        with pytest.raises(KitError, match=f"stack test01 on {ENGINE} is in use by `kit up`"), \
                site_lock(tmp_path / "b", "up", stack=(ENGINE, "test01"), wait=0):
            pass
        with site_lock(tmp_path / "b", "up", stack=(ENGINE, "test02"), wait=0), \
                site_lock(tmp_path / "b", "up", stack=("ssh://ops@gpu02", "test01"), wait=0):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_one_folder_and_one_socket_by_any_name(tmp_path: Path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "docker.sock").touch()
    (tmp_path / "socket-link").symlink_to(tmp_path / "docker.sock")
    assert stack_key(f"unix://{tmp_path}/socket-link", "x") == \
        stack_key(f"unix://{tmp_path}/docker.sock", "x")
    holder = start_holder(tmp_path / "real", "render", 30)
    try:
        with pytest.raises(KitError, match="in use by `kit render`"), \
                site_lock(tmp_path / "link", "up", wait=0):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_the_holder_may_enter_again(tmp_path: Path):
    with site_lock(tmp_path, "up", stack=(ENGINE, "s"), wait=0), \
            site_lock(tmp_path, "render", wait=0):  # kit up → its render
        pass
    with site_lock(tmp_path, "render", wait=0):  # released by the outermost holder
        pass


def test_verbs_that_change_a_site_wait_then_fail_naming_the_holder(site: Path):
    """Each verb that changes a site gives up after --wait-lock (exit 1), naming the holder,
    before writing anything."""
    spec = site / "site.yaml"
    assert run_kit("render", spec).exit_code == 0
    before = tree(site)
    holder = start_holder(site, "up", 60)
    try:
        for args in (["render", spec], ["up", spec], ["down", spec],
                     ["users", "add", spec, "zed", "--generate", "--offline"],
                     ["users", "remove", spec, "ops", "--offline"],
                     ["rotate-password", spec, "ops", "--generate", "--offline"],
                     ["keys", "add", spec, "ci", "--offline"],
                     ["keys", "revoke", spec, "ci", "--offline"]):
            result = run_kit(*args, "--wait-lock", "0.3")
            assert result.exit_code == 1, (args, result.output)
            assert "is in use by `kit up`" in result.output, result.output
            assert "waiting up to 0.3 s" in result.output
        assert tree(site) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_state_file_is_one_lock_by_its_real_path_apart_from_its_folder(tmp_path: Path):
    """Two names of one state file take one lock, and it is not the site folder's: a verb
    adding to `.kit/usage-anchors.json` never waits for a `kit up` holding the folder."""
    anchors = tmp_path / ".kit" / "usage-anchors.json"
    (tmp_path / "other").symlink_to(tmp_path / ".kit", target_is_directory=True)
    anchors.parent.mkdir()
    assert state_file_key(tmp_path / "other" / "usage-anchors.json") == state_file_key(anchors)
    holder = start_holder(tmp_path, "up", 30)
    try:
        with state_file_lock(anchors, "audit verify", wait=0):
            pass
    finally:
        holder.kill()
        holder.wait()
