"""Apply a credential change to a live site: write, reload nginx in place, prove, or roll back."""

import time
from collections.abc import Callable
from dataclasses import dataclass

from kit.access import Snapshot, credential_lock, restore
from kit.errors import KitError
from kit.layout import SiteLayout
from kit.proxy import EngineUnreachable, login_status, reload_proxy
from kit.spec import Spec

PROOF_SECONDS = 5.0


@dataclass(frozen=True)
class Expectation:
    """A login that must give `status` once the change is live (e.g. old password → 401)."""

    label: str
    authorization: str
    status: int


@dataclass(frozen=True)
class Applied:
    proxy: str | None  # the reloaded nginx container, None when none runs
    proof: list[str]  # one line per expectation met, with how long it took
    note: str = ""  # why nothing was reloaded


def apply(
    spec: Spec,
    layout: SiteLayout,
    change: Callable[[], Snapshot],
    expectations: Callable[[], list[Expectation]] = list,
) -> Applied:
    """Run `change` under the credential lock; make it live; undo it when it cannot be proven."""
    with credential_lock(layout):
        before = change()
        try:
            proxy = reload_proxy(spec, layout)
        except EngineUnreachable as error:
            return Applied(None, [], f"the Docker engine did not answer ({error.message})")
        if proxy is None:
            return Applied(None, [], f"no nginx of site {spec.site} is running")
        try:
            return Applied(proxy, _prove(spec, layout, expectations()))
        except KitError as error:
            restore(layout, before)
            reload_proxy(spec, layout)
            raise KitError(
                f"{error.message}\nthe previous credential files were restored and reloaded",
                fix=error.fix,
            ) from None


def _prove(spec: Spec, layout: SiteLayout, expectations: list[Expectation]) -> list[str]:
    started = time.monotonic()
    lines = []
    for expectation in expectations:
        while True:
            status = login_status(spec, layout, expectation.authorization)
            elapsed = time.monotonic() - started
            if status == expectation.status:
                lines.append(f"{expectation.label}: {status} after {elapsed:.2f} s")
                break
            if elapsed > PROOF_SECONDS:
                raise KitError(
                    f"{expectation.label}: got {status}, expected {expectation.status} "
                    f"{PROOF_SECONDS:.0f} s after the reload",
                    fix="check `kit logs SPEC nginx`; nginx may not verify these hashes",
                )
            time.sleep(0.05)
    return lines
