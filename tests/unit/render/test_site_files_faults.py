"""A render that fails at any step: the old site stays whole, the manifest true, no password lost.

Every os.write / os.fsync / os.link / os.replace call a render makes is failed in turn (a single
ENOSPC, a disk that stays full, or the process dying there). After each, the site is checked
byte for byte and mode for mode, then the next plain render must succeed without calling kit's
own files "edited by hand", and every user in htpasswd must have had its password printed.
"""

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest
from click.testing import Result

from kit.credentials.material import parse_htpasswd
from kit.credentials.store import with_password, write
from kit.files import digest
from kit.layout import PROBE_USER, SiteLayout
from tests.support.cli import run_kit
from tests.support.sites import REPO, snapshot

CALLS = ("open", "mkdir", "write", "fsync", "link", "replace")


class Killed(BaseException):
    """Stands for SIGKILL at that call: no except clause of kit's handles it."""


def render(spec: Path, *args: str) -> Result:
    return run_kit("render", str(spec), *args)


def passwords(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        if line.startswith("password for "):
            user, _, password = line.removeprefix("password for ").partition(": ")
            found[user] = password
    return found


def assert_consistent(
    site: Path, printed: dict[str, str], existing: set[str], gone: str | None = None
) -> None:
    """The manifest vouches for every generated file; each user kit generated a password for
    (every user but the `existing` ones) got it printed; the user dropped from the spec has no
    access."""
    layout = SiteLayout(site)
    manifest = json.loads(layout.manifest.read_text())["files"]
    for name, expected in manifest.items():
        assert digest((site / name).read_bytes()) == expected, name
    users = parse_htpasswd(layout.htpasswd.read_text(), layout.htpasswd)
    assert gone not in users
    for user, hashed in users.items():
        if user in existing or user == PROBE_USER:
            continue  # the probe's password is kept in .kit/
        assert user in printed, f"{user} is in htpasswd but its password was never printed"
        assert bcrypt.checkpw(printed[user].encode(), hashed.encode()), user
    assert not list(site.rglob(".*.tmp"))
    assert not (layout.state_dir / "render-journal.json").exists()
    assert not layout.new_passwords.exists(), "printed passwords are not kept"


@pytest.fixture
def update(site: Path) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """A rendered site and a spec change that touches config, env, users (one added, one
    dropped) and the manifest; plus the site's snapshot before that change."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("users: [ops]", "users: [ops, gone]"))
    assert render(spec).exit_code == 0
    spec.write_text(
        spec.read_text()
        .replace("users: [ops, gone]", "users: [ops, dev]")
        .replace("read_timeout: 900", "read_timeout: 600")
        .replace('extra_args: ["--enable-prefix-caching"]',
                 'extra_args: ["--enable-prefix-caching"]\n    env: {HF_TOKEN: hf_x}')
    )
    return spec, snapshot(site)


def counting(monkeypatch: pytest.MonkeyPatch, counts: dict[str, int]) -> None:
    for name in CALLS:
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)


def failing(
    monkeypatch: pytest.MonkeyPatch, name: str, k: int, fail: Callable[[], BaseException],
    *, stays: bool = False,
) -> None:
    """os.<name> fails at its k-th call (and every later one when `stays`)."""
    real, seen = getattr(os, name), [0]

    def call(*args, **kwargs):
        seen[0] += 1
        if seen[0] == k or (stays and seen[0] > k):
            raise fail()
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, call)


def call_counts(spec: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, int]:
    probe_site = tmp_path / "count"
    shutil.copytree(spec.parent, probe_site)
    counts: dict[str, int] = {}
    with monkeypatch.context() as patch:
        counting(patch, counts)
        assert render(probe_site / spec.name).exit_code == 0
    return counts


def no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fail_at_every_call(
    spec: Path, old: dict, mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *,
    existing: set[str], gone: str | None = None,
) -> None:
    """Render a copy of the site once per call the render makes, failing that call."""
    counts = call_counts(spec, monkeypatch, tmp_path)
    calls = ["write"] if mode == "disk-full" else list(CALLS)
    tried = 0
    for name in calls:
        for k in range(1, counts.get(name, 0) + 1):
            site = tmp_path / f"{mode}-{name}-{k}"
            shutil.copytree(spec.parent, site)
            with monkeypatch.context() as patch:
                failing(patch, name, k, Killed if mode == "killed" else no_space,
                        stays=mode == "disk-full")
                try:
                    first = render(site / spec.name)
                except Killed:
                    first = None  # whatever it left, the next render must make whole
            where = f"{mode} at {name} #{k}: {first and first.output}"
            if first is not None and first.exit_code != 0:
                assert first.exit_code == 1 and "cannot write" in first.output, where
                assert "No space left on device" in first.output, where
                assert not isinstance(first.exception, OSError), where
                assert snapshot(site) == old, f"old site changed: {where}"
            second = render(site / spec.name)
            assert second.exit_code == 0, f"{where}\nthen: {second.output}"
            assert "edited by hand" not in second.output, where
            printed = {**passwords(first.output if first else ""), **passwords(second.output)}
            assert_consistent(site, printed, existing, gone)
            assert "no change" in render(site / spec.name).output, where
            tried += 1
    assert tried == sum(counts.get(name, 0) for name in calls) >= 8


@pytest.mark.parametrize("mode", ["once", "disk-full", "killed"])
def test_a_render_failing_at_every_step_leaves_the_site_whole(
    update: tuple[Path, dict], mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec, old = update
    fail_at_every_call(spec, old, mode, monkeypatch, tmp_path, existing={"ops"}, gone="gone")


@pytest.mark.parametrize("mode", ["once", "killed"])
def test_a_first_render_failing_at_every_step_writes_nothing(
    site: Path, mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = site / "site.yaml"
    fail_at_every_call(spec, snapshot(site), mode, monkeypatch, tmp_path, existing=set())


def dies_before_printing(spec: Path, monkeypatch: pytest.MonkeyPatch) -> SiteLayout:
    """A render whose process ends after writing everything, before printing the passwords."""
    with monkeypatch.context() as patch:
        patch.setattr("kit.render.site_files.RenderResult.summary", lambda result: [])
        patch.setattr("kit.render.site_files.RenderResult.passwords_shown", lambda result: None)
        assert render(spec).exit_code == 0
    return SiteLayout(spec.parent)


def test_a_password_whose_render_died_is_printed_by_the_next_render(
    update: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the new htpasswd is in place but before the password was printed."""
    spec, _ = update
    layout = dies_before_printing(spec, monkeypatch)
    saved = json.loads(layout.new_passwords.read_text())
    assert stat.S_IMODE(layout.new_passwords.stat().st_mode) == 0o600
    assert [entry["user"] for entry in saved] == ["dev"]
    again = render(spec)
    assert again.exit_code == 0 and "no change" in again.output
    assert passwords(again.output) == {"dev": saved[0]["password"]}
    assert not layout.new_passwords.exists()
    assert "password for" not in render(spec).output


def test_a_saved_password_is_not_shown_once_it_was_changed(
    update: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, _ = update
    layout = dies_before_printing(spec, monkeypatch)
    write(layout, with_password(layout, "dev", "a-brand-new-passphrase", must_exist=True))
    assert "password for" not in render(spec).output


def test_a_killed_render_is_finished_by_the_next_one(update: tuple[Path, dict]) -> None:
    """SIGKILL right after the commit point (the journal is on disk): the next render rolls
    forward instead of calling kit's own files hand-edited."""
    spec, old = update
    code = (
        "import os, sys\n"
        "from kit.cli import main\n"
        "real = os.replace\n"
        "def replace(src, dst, *a, **k):\n"
        "    real(src, dst, *a, **k)\n"
        "    if str(dst).endswith('render-journal.json'):\n"
        "        os.kill(os.getpid(), 9)\n"
        "os.replace = replace\n"
        "sys.argv = ['kit', 'render', sys.argv[1]]\n"
        "main()\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(spec)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9
    layout = SiteLayout(spec.parent)
    assert (layout.state_dir / "render-journal.json").exists()
    halfway = snapshot(spec.parent)
    assert halfway.keys() - old.keys(), "staged files wait beside their targets"
    dry = render(spec, "--dry-run")
    assert dry.exit_code == 0 and "a render did not finish" in dry.output
    assert snapshot(spec.parent) == halfway
    finished = render(spec)
    assert finished.exit_code == 0, finished.output
    assert "an interrupted render was finished" in finished.output
    assert_consistent(spec.parent, passwords(finished.output), {"ops"}, "gone")


def render_read_only(spec: Path) -> subprocess.CompletedProcess:
    """`kit render` with the site folder mounted read-only (a private mount namespace)."""
    site = spec.parent
    read_only = f"mount --bind {site} {site} && mount -o remount,bind,ro {site}"
    able = subprocess.run(["unshare", "--mount", "sh", "-c", read_only], capture_output=True,
                          text=True, timeout=60)
    if able.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {able.stderr}")
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c",
         f'{read_only} && exec "{sys.executable}" -m kit render "$0"', str(spec)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


def test_a_read_only_site_folder_is_refused_with_the_path(update: tuple[Path, dict]) -> None:
    spec, old = update
    site = spec.parent
    result = render_read_only(spec)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"error: cannot write {site}/" in result.stderr
    assert "Read-only file system; nothing was changed" in result.stderr
    assert "fix: make the site folder" in result.stderr
    assert snapshot(site) == old


def test_an_unchanged_site_renders_on_a_read_only_folder(site: Path) -> None:
    spec = site / "site.yaml"
    assert render(spec).exit_code == 0
    old = snapshot(site)
    result = render_read_only(spec)
    assert result.returncode == 0, result.stderr
    assert "no change" in result.stdout
    assert snapshot(site) == old


@pytest.mark.parametrize("journal", [
    "{", "[]", '{"entries": [{"path": 5}]}',
    '{"entries": [{"path": "/etc/passwd", "staged": "x.tmp", "backup": null, "old": null,'
    ' "new": "0"}]}',
    '{"entries": [{"path": "../x", "staged": "x.tmp", "backup": null, "old": null, "new": "0"}]}',
])
def test_a_damaged_journal_is_refused_and_touches_nothing(site: Path, journal: str) -> None:
    spec = site / "site.yaml"
    assert render(spec).exit_code == 0
    layout = SiteLayout(site)
    (layout.state_dir / "render-journal.json").write_text(journal)
    before = snapshot(site.parent)
    result = render(spec)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "an interrupted render's journal) is unusable" in result.output
    assert "fix: delete it" in result.output
    assert snapshot(site.parent) == before
