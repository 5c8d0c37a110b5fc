"""One owner for a live credential change: lock, snapshot, write, reload, prove — or undo.

Every credential verb runs through `live_change`. Under the site's credential lock it snapshots the
files; the caller computes the new ones (every refusal comes before anything is written); the engine
is reached before the first write, so when it cannot be the files stay as they were; then the files
are installed, the running nginx reloads in place (kit/front_door/reload.py, the reload `kit up`
uses) and logins through the front door prove the change live. Any failure after the first write — a
write error, `nginx -t`, the reload, the proof, an interrupt — restores the previous files byte for
byte (with a fresh auth epoch, so no verdict cached meanwhile survives) and reloads nginx with them.
`--offline` (no connection) changes the files only.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kit.credentials.policy import PolicyChange
from kit.credentials.store import (
    Credentials,
    Snapshot,
    check_current,
    existing,
    restore,
    snapshot,
    with_new_key,
    with_password,
    with_policy,
    without_key,
    without_user,
)
from kit.credentials.store import write as write_files
from kit.engine.desired import PROXY_SERVICE
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState
from kit.engine.remote_files import deliver
from kit.engine.url import resolve
from kit.errors import KitError
from kit.front_door.client import basic_header, probe_password
from kit.front_door.reload import Connection, reload, running_proxy
from kit.layout import PROBE_USER, SiteLayout
from kit.site import desired_for
from kit.site_lock import site_lock
from kit.spec.model import Spec

OFFLINE = "--offline"
NO_POLICY = PolicyChange({})


@dataclass(frozen=True)
class Expectation:
    """A login that must give `status` once the change is live (e.g. old password → 401)."""

    label: str
    authorization: str
    status: int


@dataclass(frozen=True)
class ReloadOutcome:
    proxy: str | None  # the reloaded nginx container; None when none was reloaded
    proof: tuple[str, ...] = ()  # one line per expectation met, with how long it took
    note: str = ""  # why nothing was reloaded, and when the change takes effect


@dataclass
class LiveChange:
    """What the body of `live_change` uses: `write` the new files, `expect` logins."""

    spec: Spec
    layout: SiteLayout
    connection: Connection | None  # None: --offline, the engine is never asked
    before: Snapshot
    expectations: list[Expectation] = field(default_factory=list)
    engine: Engine | None = None
    proxy: ContainerState | None = None
    written: bool = False
    outcome: ReloadOutcome = ReloadOutcome(None)

    def expect(self, label: str, authorization: str, status: int) -> None:
        self.expectations.append(Expectation(label, authorization, status))

    def write(self, new: Credentials) -> None:
        if self.connection is not None:
            self._reach(self.connection)
        self.written = True
        try:
            write_files(self.layout, new)
        except OSError as error:
            raise KitError(
                f"writing the credential files failed: {error.filename}: {error.strerror}",
                fix=f"make {self.layout.root} writable with free space, then run this again",
            ) from None

    def _reach(self, connection: Connection) -> None:
        try:
            self.engine = connection.engine()
            self.proxy = running_proxy(self.engine, self.spec.site)
        except KitError as error:
            raise KitError(
                f"{error.message}\nnothing was changed: the credential files are as they were, "
                "and a front door that is running keeps accepting the old credentials",
                fix=(f"{error.fix}; " if error.fix else "") + f"or pass {OFFLINE} to change the "
                "files only (in effect at the next `kit up`)",
            ) from None

    def go_live(self) -> None:
        if self.connection is None:
            self.outcome = ReloadOutcome(
                None, note=f"nginx was not reloaded ({OFFLINE}): a running front door may "
                "accept the old credentials until the next `kit up`, which reloads it")
        elif self.engine is None or self.proxy is None:
            self.outcome = ReloadOutcome(
                None, note=f"no nginx of site {self.spec.site} is running: "
                "the change takes effect when it starts (kit up)")
        else:
            self._reload(self.engine, self.proxy)
            self.outcome = ReloadOutcome(self.proxy.name, self._prove(self.connection))

    def undo(self) -> str:
        """Put the previous files back and reload; what is in effect now, in plain words."""
        try:
            restore(self.layout, self.before)
        except OSError as error:
            return (f"restoring the previous credential files failed too ({error.strerror}): "
                    f"copies of them are in {self.layout.state_dir / 'backup'}")
        if self.engine is None or self.proxy is None:
            return "the previous credential files were restored"
        try:
            self._reload(self.engine, self.proxy)
        except KitError as error:
            return ("the previous credential files were restored, but reloading them failed "
                    f"too (run `kit up` to bring {self.proxy.name} in line): {error.message}")
        return (f"the previous credential files were restored and {self.proxy.name} reloaded "
                "them: the old credentials stay in effect")

    def _reload(self, engine: Engine, proxy: ContainerState) -> None:
        """Reload nginx with the files now in the site folder (on a remote engine, delivered
        into its volumes first: kit/engine/remote_files.py)."""
        desired = desired_for(self.spec, self.layout)
        deliver(engine, desired, self.layout.root)
        reload(engine, desired.service(PROXY_SERVICE), proxy, self.layout.applied)

    def _prove(self, connection: Connection) -> tuple[str, ...]:
        started = time.monotonic()
        lines = []
        for expectation in self.expectations:
            while True:
                status = connection.login(self.spec, self.layout, expectation.authorization)
                elapsed = time.monotonic() - started
                if status == expectation.status:
                    lines.append(f"{expectation.label}: {status} after {elapsed:.2f} s")
                    break
                if elapsed > connection.proof_seconds:
                    raise KitError(
                        f"{expectation.label}: got {status}, expected {expectation.status} "
                        f"{connection.proof_seconds:.0f} s after the reload",
                        fix="check `kit logs SPEC nginx`; nginx may not verify these hashes",
                    )
                time.sleep(0.05)
        return tuple(lines)


@contextmanager
def live_change(
    spec: Spec, layout: SiteLayout, connection: Connection | None
) -> Iterator[LiveChange]:
    """The body computes and `write`s the new files; on leaving, they go live or are undone."""
    stack = None if connection is None else (resolve(spec.engine), spec.site)
    with site_lock(layout.root, "credential change", stack=stack):
        change = LiveChange(spec, layout, connection, snapshot(layout))
        try:
            yield change
            change.go_live()
        except BaseException as error:
            if not change.written:
                raise
            undone = change.undo()
            if isinstance(error, KitError):
                raise type(error)(f"{error.message}\n{undone}", fix=error.fix) from None
            raise


def add_user(
    spec: Spec, layout: SiteLayout, user: str, password: str, connection: Connection | None,
    policy: PolicyChange | None = None,
) -> ReloadOutcome:
    """A new user (with `policy`), proven by its login."""
    with live_change(spec, layout, connection) as change:
        new = with_password(layout, user, password, must_exist=False)
        change.write(with_policy(layout, new, "user", user, policy or NO_POLICY, fresh=True))
        change.expect(f"login of {user}", basic_header(user, password), 200)
    return change.outcome


def rotate_password(
    spec: Spec, layout: SiteLayout, user: str, password: str, current: str | None,
    connection: Connection | None,
) -> ReloadOutcome:
    """The new password must get 200 (and the current one, when given, 401) once live."""
    with live_change(spec, layout, connection) as change:
        check_current(layout, user, current, password)
        change.write(with_password(layout, user, password, must_exist=True))
        change.expect("new password", basic_header(user, password), 200)
        if current is not None:
            change.expect("old password", basic_header(user, current), 401)
    return change.outcome


def remove_user(
    spec: Spec, layout: SiteLayout, user: str, connection: Connection | None
) -> ReloadOutcome:
    with live_change(spec, layout, connection) as change:
        change.write(without_user(layout, user, spec.auth.users))
    return change.outcome


def add_key(
    spec: Spec, layout: SiteLayout, name: str, connection: Connection | None,
    policy: PolicyChange | None = None,
) -> tuple[str, ReloadOutcome]:
    """A new key (with `policy`), proven when nginx accepts keys at all (auth.api_keys)."""
    with live_change(spec, layout, connection) as change:
        key, new = with_new_key(layout, name)
        change.write(with_policy(layout, new, "key", name, policy or NO_POLICY, fresh=True))
        if spec.auth.api_keys:
            change.expect(f"key {name}", f"Bearer {key}", 200)
    return key, change.outcome


def revoke_key(
    spec: Spec, layout: SiteLayout, name: str, connection: Connection | None
) -> ReloadOutcome:
    with live_change(spec, layout, connection) as change:
        change.write(without_key(layout, name))
    return change.outcome


def set_policy(
    spec: Spec, layout: SiteLayout, kind: str, name: str, policy: PolicyChange,
    connection: Connection | None,
) -> ReloadOutcome:
    """Change the policy of key or user `name`: live once nginx's new workers (all of them: the
    reload waits until no old one accepts) compiled it, proven by kit's probe still let in."""
    with live_change(spec, layout, connection) as change:
        change.write(with_policy(layout, existing(layout, kind, name), kind, name, policy,
                                 fresh=False))
        change.expect("the front door with the new policy",
                      basic_header(PROBE_USER, probe_password(layout)), 200)
    return change.outcome
