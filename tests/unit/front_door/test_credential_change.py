"""A live credential change against the fake engine: proven when it works, and at each failure
point (write, `nginx -t`, reload, proof, interrupt) the previous files back byte for byte and
nginx reloaded with them. The CLI: no engine → exit 1 and nothing changed; --offline → the files
change, effective at the next `kit up`; bad names and corrupt files → exit 2."""

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from kit.credentials import store as credential_files
from kit.credentials.policy import PolicyChange
from kit.credentials.store import snapshot, users
from kit.engine.desired import PROXY_SERVICE, load_desired
from kit.engine.observe import read_proxy_loaded
from kit.errors import BadInput, ExitCode, KitError
from kit.front_door.credential_change import (
    add_key,
    add_user,
    revoke_key,
    rotate_password,
    set_policy,
)
from kit.front_door.reload import Connection
from kit.layout import SiteLayout
from kit.plan.build import NGINX_TEST
from kit.plan.host import load_spec
from kit.spec.model import Spec
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine
from tests.support.fake_stack import converge
from tests.support.sites import tree

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
PASSWORD = "a-good-long-password"
RELOADS = [("exec", " ".join(NGINX_TEST)), ("signal", "SIGHUP")]


def kit(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    return run_kit(*args, stdin=stdin, env=env or NO_ENGINE)


def nginx_login(spec: Spec, layout: SiteLayout, authorization: str) -> int:
    """What nginx answers, from the files on disk: a Basic login or a Bearer key."""
    scheme, _, value = authorization.partition(" ")
    if scheme == "Bearer":
        digest = hashlib.sha256(value.encode()).hexdigest()
        return 200 if f'"{digest}"' in layout.keys_map.read_text() else 401
    user, _, password = base64.b64decode(value).decode().partition(":")
    hashed = users(layout).get(user)
    return 200 if hashed and bcrypt.checkpw(password.encode(), hashed.encode()) else 401


@dataclass
class Live:
    """A rendered site whose stack runs on the fake engine."""

    spec: Spec
    layout: SiteLayout
    engine: FakeEngine

    def connection(self, login: Callable[[Spec, SiteLayout, str], int] = nginx_login):
        return Connection(lambda: self.engine, login, proof_seconds=0.3)

    def reloads(self) -> list[tuple[str, str]]:
        return [call for call in self.engine.calls if call[0] in ("exec", "signal")]

    def credential_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes()
                for p in (self.layout.htpasswd, self.layout.keys_db, self.layout.keys_map)}


@pytest.fixture
def live(site: Path) -> Live:
    assert kit("render", str(site / "site.yaml")).exit_code == 0
    layout = SiteLayout(site)
    spec = load_spec(site / "site.yaml")
    desired = load_desired(layout, spec.site)
    engine = FakeEngine({s.config.image: f"sha256:{s.name}" for s in desired.services})
    converge(engine, desired, layout.applied)
    assert kit("keys", "add", str(site / "site.yaml"), "bot", "--offline").exit_code == 0
    engine.calls.clear()
    return Live(spec, layout, engine)


def test_a_change_is_reloaded_proven_and_recorded(live: Live) -> None:
    outcome = add_user(live.spec, live.layout, "alice", PASSWORD, live.connection())
    assert outcome.proxy == "test01-nginx-1"
    assert outcome.proof[0].startswith("login of alice: 200 after")
    assert live.reloads() == RELOADS
    desired = load_desired(live.layout, live.spec.site).service(PROXY_SERVICE)
    assert read_proxy_loaded(live.layout.applied).files_digest == desired.site_files_digest


def fail_nginx_t(live: Live) -> None:
    live.engine.exec_results[tuple(NGINX_TEST)] = [(1, "nginx: [emerg] unexpected \"}\""), (0, "")]


def fail_reload(live: Live) -> None:
    live.engine.reload_errors.append("[emerg] bind() to 0.0.0.0:443 failed (98: in use)")


FAILURES = {  # how it fails → (what the error says, the calls the engine saw)
    "nginx -t": (fail_nginx_t, "rejected the new config", [RELOADS[0], *RELOADS]),
    "reload": (fail_reload, "did not apply the new config", [*RELOADS, *RELOADS]),
}


@pytest.mark.parametrize("point", FAILURES)
def test_a_failed_reload_restores_the_files_and_reloads_them(live: Live, point: str) -> None:
    provoke, message, calls = FAILURES[point]
    provoke(live)
    before = live.credential_files()
    with pytest.raises(KitError) as failed:
        add_user(live.spec, live.layout, "alice", PASSWORD, live.connection())
    assert message in failed.value.message
    assert "restored and test01-nginx-1 reloaded them" in failed.value.message
    assert live.credential_files() == before
    assert live.reloads() == calls


def test_a_failed_change_on_a_site_without_keys_leaves_no_keys_file(live: Live) -> None:
    """Seen in a parallel e2e run: a rotation that failed its proof on a site with no Bearer key
    yet put back an empty keys.json, and every later credential command was exit 2 on it."""
    live.layout.keys_db.unlink()
    with pytest.raises(KitError, match="the old credentials stay in effect"):
        rotate_password(live.spec, live.layout, "ops", PASSWORD, None,
                        live.connection(lambda *_: 401))
    assert not live.layout.keys_db.exists()
    assert kit("keys", "add", str(live.layout.root / "site.yaml"), "ci", "--offline").exit_code == 0


def test_a_failed_proof_restores_the_files_and_reloads_them(live: Live) -> None:
    before = live.credential_files()
    epoch = live.layout.auth_state.read_bytes()
    with pytest.raises(KitError) as failed:
        rotate_password(live.spec, live.layout, "ops", PASSWORD, None,
                        live.connection(lambda *_: 401))  # nginx cannot verify the new hash
    assert "new password: got 401, expected 200" in failed.value.message
    assert "the old credentials stay in effect" in failed.value.message
    assert live.credential_files() == before
    assert live.layout.auth_state.read_bytes() != epoch  # verdicts cached meanwhile expire
    assert live.reloads() == RELOADS + RELOADS
    desired = load_desired(live.layout, live.spec.site).service(PROXY_SERVICE)
    assert read_proxy_loaded(live.layout.applied).files_digest == desired.site_files_digest


def test_a_failed_write_restores_what_was_written(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills after keys.json and keys.map were replaced, before htpasswd."""
    real_write = credential_files.atomic_write
    failures = [live.layout.htpasswd]

    def atomic_write(path: Path, *args) -> None:
        if failures and path == failures[0]:
            failures.pop()
            raise OSError(28, "No space left on device", str(path))
        real_write(path, *args)

    monkeypatch.setattr(credential_files, "atomic_write", atomic_write)
    before = live.credential_files()
    with pytest.raises(KitError) as failed:
        revoke_key(live.spec, live.layout, "bot", live.connection())
    assert f"{live.layout.htpasswd}: No space left on device" in failed.value.message
    assert live.credential_files() == before
    assert live.reloads() == RELOADS  # the restored epoch and keys reloaded


def test_an_interrupt_during_the_proof_restores_and_propagates(live: Live) -> None:
    def interrupted(*_) -> int:
        raise KeyboardInterrupt

    before = live.credential_files()
    with pytest.raises(KeyboardInterrupt):
        add_key(live.spec, live.layout, "ci", live.connection(interrupted))
    assert live.credential_files() == before
    assert live.reloads() == RELOADS + RELOADS


def test_when_the_restored_files_cannot_be_reloaded_it_says_so(live: Live) -> None:
    live.engine.reload_errors += ["[emerg] first", "[emerg] second"]
    before = live.credential_files()
    with pytest.raises(KitError) as failed:
        add_user(live.spec, live.layout, "alice", PASSWORD, live.connection())
    first, restored = failed.value.message.split("\nthe previous credential files were ")
    assert first.endswith("[emerg] first")
    assert restored.startswith("restored, but reloading them failed too (run `kit up` to bring "
                               "test01-nginx-1 in line)")
    assert restored.endswith("[emerg] second")
    assert live.credential_files() == before


def test_an_unreachable_engine_changes_nothing(live: Live) -> None:
    def unreachable() -> FakeEngine:
        raise KitError("cannot reach the Docker engine at unix:///x while connecting: "
                       "there is no socket at that path", fix="is dockerd running?")

    before = tree(live.layout.root)
    with pytest.raises(KitError) as failed:
        add_user(live.spec, live.layout, "alice", PASSWORD, Connection(unreachable, nginx_login))
    assert failed.value.exit_code == ExitCode.FAILED
    assert "nothing was changed" in failed.value.message
    assert "--offline" in failed.value.fix
    assert tree(live.layout.root) == before


def test_a_stack_that_is_down_takes_the_change_at_the_next_up(live: Live) -> None:
    live.engine.stop("test01-nginx-1")
    live.engine.calls.clear()
    outcome = revoke_key(live.spec, live.layout, "bot", live.connection())
    assert outcome.proxy is None and "no nginx of site test01 is running" in outcome.note
    assert "bot" not in live.layout.keys_db.read_text()
    assert live.reloads() == []


def test_a_refusal_writes_nothing_and_asks_no_engine(live: Live) -> None:
    before = snapshot(live.layout)
    with pytest.raises(BadInput, match="exists already"):
        add_user(live.spec, live.layout, "ops", PASSWORD, live.connection())
    assert snapshot(live.layout) == before and live.engine.calls == []


# --------------------------------------------------------------------------- the CLI

CHANGES = {
    "rotate-password": (["rotate-password", "{spec}", "ops", "--password-stdin"], f"{PASSWORD}\n"),
    "keys revoke": (["keys", "revoke", "{spec}", "bot"], None),
    "users remove": (["users", "remove", "{spec}", "alice"], None),
    "users add": (["users", "add", "{spec}", "carol", "--password-stdin"], f"{PASSWORD}\n"),
}


@pytest.fixture
def rendered(site: Path) -> Path:
    """A rendered site with a key `bot` and a user `alice` beside the spec's `ops`."""
    spec = str(site / "site.yaml")
    assert kit("render", spec).exit_code == 0
    assert kit("keys", "add", spec, "bot", "--offline").exit_code == 0
    assert kit("users", "add", spec, "alice", "--offline", "--password-stdin",
               stdin=f"{PASSWORD}\n").exit_code == 0
    return site


def command(site: Path, verb: str) -> tuple[list[str], str | None]:
    args, stdin = CHANGES[verb]
    return [a.replace("{spec}", str(site / "site.yaml")) for a in args], stdin


@pytest.mark.parametrize("verb", CHANGES)
def test_cli_with_no_engine_fails_and_changes_nothing(rendered: Path, verb: str) -> None:
    before = tree(rendered)
    args, stdin = command(rendered, verb)
    result = kit(*args, stdin=stdin)
    assert result.exit_code == 1, result.output
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in result.output
    assert "there is no socket at that path" in result.output
    assert "nothing was changed" in result.output and "--offline" in result.output
    assert "Error" not in result.output and "(2," not in result.output  # no Python repr
    assert tree(rendered) == before


@pytest.mark.parametrize("verb", CHANGES)
def test_cli_offline_changes_the_files_for_the_next_up(rendered: Path, verb: str) -> None:
    layout = SiteLayout(rendered)
    before = snapshot(layout)
    args, stdin = command(rendered, verb)
    result = kit(*args, "--offline", stdin=stdin)
    assert result.exit_code == 0, result.output
    assert "nginx was not reloaded (--offline)" in result.output
    assert "next `kit up`" in result.output
    assert snapshot(layout) != before


NEWLINE_NAMES = [
    ["users", "add", "{spec}", "eve\n", "--password-stdin"],
    ["rotate-password", "{spec}", "ops\n", "--password-stdin"],
    ["users", "remove", "{spec}", "alice\n"],
    ["keys", "add", "{spec}", "ci\n"],
    ["keys", "revoke", "{spec}", "bot\n"],
]


@pytest.mark.parametrize("args", NEWLINE_NAMES, ids=lambda a: " ".join(a[:2]))
def test_cli_a_name_with_a_final_newline_is_refused(rendered: Path, args: list[str]) -> None:
    before = tree(rendered)
    spec = str(rendered / "site.yaml")
    result = kit(*[a.replace("{spec}", spec) for a in args], "--offline", stdin=f"{PASSWORD}\n")
    assert result.exit_code == 2, result.output
    assert "is not allowed" in result.output
    assert tree(rendered) == before
    assert kit("users", "list", spec).exit_code == 0


CORRUPT_KEYS = {
    "not JSON": "{not json",
    "not an object": "[]",
    "a name nginx would misread": '{"a\\" \\"b": {"sha256": "' + "0" * 64 + '", "created": "x"}}',
    "no digest": '{"bot": {"created": "2026-01-01"}}',
}


READ_KEYS = [["keys", "list", "{spec}"], ["keys", "add", "{spec}", "ci", "--offline"],
             ["render", "{spec}"]]


@pytest.mark.parametrize("verb", READ_KEYS, ids=lambda v: " ".join(v[:2]))
@pytest.mark.parametrize("content", CORRUPT_KEYS.values(), ids=list(CORRUPT_KEYS))
def test_cli_a_corrupt_keys_file_is_exit_2_with_the_file_and_the_fix(
    rendered: Path, verb: list[str], content: str
) -> None:
    layout = SiteLayout(rendered)
    layout.keys_db.write_text(content)
    before = tree(rendered)
    result = kit(*[a.replace("{spec}", str(rendered / "site.yaml")) for a in verb])
    assert result.exit_code == 2, result.output
    assert f"{layout.keys_db} is unreadable" in result.output
    assert f"cp {layout.state_dir / 'backup' / 'keys.json'}" in result.output
    assert tree(rendered) == before


def test_cli_a_corrupt_htpasswd_line_is_named_with_its_fix(rendered: Path) -> None:
    layout = SiteLayout(rendered)
    layout.htpasswd.write_text(layout.htpasswd.read_text() + "eve\n")
    for args in (["users", "list"], ["render"]):
        result = kit(*args, str(rendered / "site.yaml"))
        assert result.exit_code == 2, result.output
        line = len(layout.htpasswd.read_text().splitlines())
        assert f"{layout.htpasswd}:{line}: not a 'user:hash' line" in result.output
        assert f"delete line {line}" in result.output


def test_cli_users_add_without_a_terminal_generates_and_prints_the_password(
    rendered: Path,
) -> None:
    result = kit("users", "add", str(rendered / "site.yaml"), "dave", "--offline")
    assert result.exit_code == 0, result.output
    password = result.output.split("password for dave: ")[1].split()[0]
    hashed = users(SiteLayout(rendered))["dave"]
    assert bcrypt.checkpw(password.encode(), hashed.encode())


def policy_files(layout: SiteLayout) -> dict[str, bytes | None]:
    return {path.name: path.read_bytes() if path.exists() else None
            for path in (layout.policy_db, layout.door_policy)}


def test_a_policy_change_is_reloaded_and_proven(live: Live) -> None:
    change = PolicyChange({"models": ["llama-3.1-8b"], "class": "batch"})
    outcome = set_policy(live.spec, live.layout, "key", "bot", change, live.connection())
    assert outcome.proof[0].startswith("the front door with the new policy: 200 after")
    assert live.reloads() == RELOADS
    assert json.loads(live.layout.policy_db.read_text()) == {
        "key:bot": {"class": "batch", "models": ["llama-3.1-8b"]}}
    assert '"key:bot"' in live.layout.door_policy.read_text()


@pytest.mark.parametrize("point", FAILURES)
def test_a_failed_policy_change_restores_the_policy(live: Live, point: str) -> None:
    set_policy(live.spec, live.layout, "key", "bot", PolicyChange({"class": "batch"}),
               live.connection())
    live.engine.calls.clear()
    provoke, message, calls = FAILURES[point]
    provoke(live)
    before = policy_files(live.layout)
    with pytest.raises(KitError) as failed:
        set_policy(live.spec, live.layout, "key", "bot", PolicyChange({}, ("class",)),
                   live.connection())
    assert message in failed.value.message
    assert policy_files(live.layout) == before
    assert live.reloads() == calls


def test_revoking_a_key_drops_its_policy(live: Live) -> None:
    set_policy(live.spec, live.layout, "key", "bot", PolicyChange({"class": "batch"}),
               live.connection())
    revoke_key(live.spec, live.layout, "bot", live.connection())
    assert not live.layout.policy_db.exists() or "bot" not in live.layout.policy_db.read_text()
    assert "bot" not in live.layout.door_policy.read_text()
