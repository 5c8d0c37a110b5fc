"""Credential commands on files (no engine): exact edits, backups, refusals, kill -9 safety."""

import os
import random
import signal
import time
from pathlib import Path

import bcrypt
import pytest

from kit.credentials.material import key_digest, parse_htpasswd
from kit.credentials.store import with_password, write
from kit.layout import SiteLayout
from kit.site_lock import site_lock
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.sites import tree

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # nothing running to reload


def kit(*args: str, stdin: str | None = None):
    return run_kit(*args, stdin=stdin, env=NO_ENGINE)


@pytest.fixture
def rendered(site: Path) -> Path:
    assert kit("render", str(site / "site.yaml")).exit_code == 0
    return site


def entries(site: Path) -> dict[str, str]:
    layout = SiteLayout(site)
    return parse_htpasswd(layout.htpasswd.read_text(), layout.htpasswd)


@pytest.mark.real_bcrypt_cost
def test_rotate_keeps_other_lines_byte_for_byte_and_backs_up(rendered: Path) -> None:
    spec = str(rendered / "site.yaml")
    assert kit("users", "add", spec, "alice", "--password-stdin", "--offline",
               stdin="alice-password-1\n").exit_code == 0
    layout = SiteLayout(rendered)
    before = layout.htpasswd.read_text().splitlines()
    result = kit("rotate-password", spec, "ops", "--password-stdin", "--offline",
                 stdin="a-brand-new-password\n")
    assert result.exit_code == 0, result.output
    after = layout.htpasswd.read_text().splitlines()
    assert [line for line in after if not line.startswith("ops:")] == [
        line for line in before if not line.startswith("ops:")
    ]
    ops = entries(rendered)["ops"]
    assert bcrypt.checkpw(b"a-brand-new-password", ops.encode()) and ops.startswith("$2b$12$")
    backup = layout.state_dir / "backup" / "htpasswd"
    assert backup.read_text().splitlines() == before
    assert backup.stat().st_mode & 0o777 == 0o600
    assert "not reloaded (--offline)" in result.output and "next `kit up`" in result.output


def test_rotation_changes_the_auth_epoch(rendered: Path) -> None:
    layout = SiteLayout(rendered)
    epoch = layout.auth_state.read_text()
    kit("rotate-password", str(rendered / "site.yaml"), "ops", "--password-stdin", "--offline",
        stdin="another-good-password\n")
    assert layout.auth_state.read_text() != epoch


def test_keys_store_only_digests(rendered: Path) -> None:
    spec = str(rendered / "site.yaml")
    result = kit("keys", "add", spec, "ci-bot", "--offline")
    assert result.exit_code == 0, result.output
    key = result.output.split("key ci-bot: ")[1].split()[0]
    layout = SiteLayout(rendered)
    stored = layout.keys_map.read_text() + layout.keys_db.read_text()
    assert key not in stored and key_digest(key) in layout.keys_map.read_text()
    assert key not in "".join(p.read_text(errors="ignore") for p in rendered.rglob("*")
                              if p.is_file())
    assert kit("keys", "revoke", spec, "ci-bot", "--offline").exit_code == 0
    assert key_digest(key) not in layout.keys_map.read_text()


ADVERSARIAL = [
    (["users", "add", "{spec}", "a:b", "--password-stdin"], "long-enough-password\n",
     "user name 'a:b' is not allowed"),
    (["users", "add", "{spec}", "a\nb", "--password-stdin"], "long-enough-password\n",
     "is not allowed"),
    (["users", "add", "{spec}", "carol", "--password-stdin"], "\n", "no password"),
    (["users", "add", "{spec}", "carol", "--password-stdin"], "x" * 100 + "\n",
     "longer than 72 bytes"),
    (["users", "add", "{spec}", "carol", "--password-stdin"], "short\n", "at least 12"),
    (["users", "add", "{spec}", "carol", "--password-stdin"], "aaaaaaaaaaaaaaaa\n",
     "repeats too few"),
    (["users", "add", "{spec}", "ops", "--password-stdin"], "long-enough-password\n",
     "exists already"),
    (["users", "remove", "{spec}", "ops"], None, "listed in the spec"),
    (["users", "remove", "{spec}", "kit-probe"], None, "probe identity"),
    (["users", "remove", "{spec}", "nobody"], None, "there is no user"),
    (["rotate-password", "{spec}", "nobody", "--password-stdin"], "long-enough-password\n",
     "there is no user"),
    (["rotate-password", "{spec}", "ops", "--password-stdin"],
     "long-enough-password\nwrong-current-password\n", "current password of ops is wrong"),
    (["keys", "add", "{spec}", "my key"], None, "key name 'my key' is not allowed"),
    (["keys", "add", "{spec}", "k;ey"], None, "is not allowed"),
    (["keys", "revoke", "{spec}", "nope"], None, "there is no key"),
    (["keys", "add", "{spec}", "a", "b", "c"], None, "expected [SPEC] NAME"),
]


@pytest.mark.parametrize("args,stdin,message", ADVERSARIAL, ids=[a[2] for a in ADVERSARIAL])
def test_adversarial_credentials_are_refused_and_change_nothing(
    rendered: Path, args: list[str], stdin: str | None, message: str
) -> None:
    before = tree(rendered)
    spec = str(rendered / "site.yaml")
    result = kit(*[a.replace("{spec}", spec) for a in args], stdin=stdin)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert tree(rendered) == before


def test_commands_before_render_say_what_to_do(site: Path) -> None:
    result = kit("users", "add", str(site / "site.yaml"), "zed", "--generate")
    assert result.exit_code == 2 and "run `kit render`" in result.output


def _rotate_in_child(site: Path, password: str) -> None:
    """A forked child doing what `kit rotate-password` does to the files (no reload: no engine)."""
    layout = SiteLayout(site)
    with site_lock(site, "rotate-password"):
        write(layout, with_password(layout, "ops", password, must_exist=True))
    os._exit(0)


def test_racing_rotations_killed_at_random_leave_a_whole_file(rendered: Path) -> None:
    """Two rotations race; one is SIGKILLed at a random moment, 50 times: htpasswd stays whole
    (old or new, never partial or merged) and nginx -t still accepts the site."""
    layout = SiteLayout(rendered)
    original = entries(rendered)
    passwords: list[bytes] = []
    rng = random.Random(11)
    killed = 0
    for round_number in range(50):
        children = []
        for racer in range(2):
            password = f"round-{round_number}-racer-{racer}-pw"
            passwords.append(password.encode())
            pid = os.fork()
            if pid == 0:
                _rotate_in_child(rendered, password)
            children.append(pid)
        time.sleep(rng.uniform(0, 0.02))
        victim = children[rng.randrange(2)]
        try:
            os.kill(victim, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
        for pid in children:
            os.waitpid(pid, 0)
        found = entries(rendered)
        assert set(found) == {"kit-probe", "ops"}
        assert found["kit-probe"] == original["kit-probe"]
        ops = found["ops"].encode()
        assert ops == original["ops"].encode() or any(bcrypt.checkpw(p, ops) for p in passwords)
    assert killed >= 10
    reason = nginx_ns.available()
    if reason is None:
        result = nginx_ns.nginx_t(layout.nginx_dir, ["llama8b"])
        assert result.returncode == 0, result.stderr
