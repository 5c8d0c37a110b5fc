"""A fleet: one folder per server (DIR/<server>/site.yaml), one verb run over all of them.

Each server is worked on in its own thread, at most FLEET_PARALLEL at once, and reported as one
row (result, time, cause): a server that fails is named, the others still run and are
reported, and the fleet's exit status is non-zero when any failed. `status` is gathered in this
process (one table, one import of kit); every other verb runs as `kit VERB SPEC …` for that
server, exactly as an operator would run it there, so its checks, undo and messages are the
single-server ones. A credential change is never left ambiguous: each row says whether the new
credential is live there or the old one still is.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kit.errors import BadInput, ExitCode, KitError
from kit.spec.model import DEFAULT_SPEC
from kit.table import text_table

if TYPE_CHECKING:  # the usage wing loads only for `kit fleet DIR usage`
    from kit.usage.period import Period
    from kit.usage.totals import PeriodUsage

FLEET_PARALLEL = 8  # servers worked on at once (each holds up to 8 SSH sessions of its own)
# What a credential verb's stderr says when the previous files are in effect after a failure,
# and its stdout when nginx reloaded the change (kit/commands/options.report).
OLD_IN_EFFECT = ("nothing was changed", "the old credentials stay in effect")
RELOADED = "in place (no restart"


@dataclass(frozen=True)
class ServerResult:
    server: str
    ok: bool
    seconds: float
    result: str  # one line: what happened there
    cause: str = ""  # why it failed (kit's error message, first line), empty when ok
    output: str = ""  # the verb's own stdout, for verbs whose output is the point


def fleet_specs(folder: Path) -> list[Path]:
    """Every DIR/<server>/site.yaml, by server name; BadInput when there is none."""
    if not folder.is_dir():
        raise BadInput(f"{folder} is not a folder", fix="kit fleet DIR VERB: DIR holds one "
                       "folder per server, each with its site.yaml")
    specs = sorted(p / DEFAULT_SPEC for p in folder.iterdir() if (p / DEFAULT_SPEC).is_file())
    if not specs:
        raise BadInput(f"{folder} has no <server>/{DEFAULT_SPEC}",
                       fix=f"one folder per server: {folder}/<server>/{DEFAULT_SPEC} "
                       f"(kit init {folder}/<server>)")
    return specs


def one_writer_per_stack(specs: list[Path]) -> None:
    """BadInput, before anything runs, when two servers' specs resolve to one stack (same engine,
    same site name: a copied folder without its own `engine:`), naming both folders; run in
    parallel they would drive one set of containers. A spec that does not load is left to its
    own row."""
    from kit.engine.url import resolve
    from kit.plan.host import load_spec
    from kit.site_lock import stack_key

    stacks: dict[str, list[Path]] = {}
    described: dict[str, str] = {}
    for spec_path in specs:
        try:
            spec = load_spec(spec_path, check_host=False, check_capacity=False)
        except KitError:
            continue
        key = stack_key(resolve(spec.engine), spec.site)
        stacks.setdefault(key.identity, []).append(spec_path)
        described[key.identity] = key.what
    clashes = [(described[identity], paths) for identity, paths in stacks.items()
               if len(paths) > 1]
    if clashes:
        raise BadInput(
            "two or more servers are one stack (same engine, same site name); run together they "
            "would drive the same containers:\n" + "\n".join(
                f"  {what}: {', '.join(str(p.parent) for p in paths)}" for what, paths in clashes),
            fix="give each folder the `engine:` of the server it is for (a copied folder has "
            "none, so it runs on DOCKER_HOST), or its own `site:` name; nothing was run")


def server_name(spec: Path) -> str:
    return spec.parent.name


Row = TypeVar("Row")


def run_all(specs: list[Path], work: Callable[[Path], Row]) -> list[Row]:
    """`work` on every server, FLEET_PARALLEL at a time; results in the order of `specs`."""
    with ThreadPoolExecutor(max_workers=min(FLEET_PARALLEL, len(specs))) as pool:
        return list(pool.map(work, specs))


def run_verb(spec: Path, verb: list[str], args: list[str], stdin: str | None,
             credential: str | None = None) -> ServerResult:
    """`kit VERB SPEC ARGS` for one server, as a separate process; its result as a row.

    `credential` (e.g. "password"): the row says where the new one is live and where the old
    one still is."""
    started = time.monotonic()
    done = subprocess.run(  # never the fleet's own stdin: eight servers cannot share a prompt
        [sys.executable, "-m", "kit", *verb, str(spec), *args], input=stdin or "",
        capture_output=True, text=True)
    seconds = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode == 0:
        result = lines[-1] if lines else "done"
        if credential:
            result = (f"new {credential} live" if RELOADED in done.stdout else
                      f"new {credential} in the files; live at its next `kit up`")
        return ServerResult(server_name(spec), True, seconds, result, output=done.stdout)
    errors = [line.removeprefix("error: ") for line in done.stderr.splitlines()
              if line.strip()]
    cause = errors[0] if errors else f"exit {done.returncode}"
    if credential:  # bad input (exit 2) writes nothing
        old = done.returncode == ExitCode.BAD_INPUT or any(
            marker in done.stderr for marker in OLD_IN_EFFECT)
        result = (f"old {credential} still in effect" if old else
                  f"UNKNOWN which {credential} is in effect (see the cause)")
    else:
        result = f"FAILED (exit {done.returncode})"
    return ServerResult(server_name(spec), False, seconds, result, cause, done.stdout)


@dataclass(frozen=True)
class ServerStatus:
    server: str
    engine: str
    seconds: float
    containers: str = "-"  # running/total
    health: str = "-"  # healthy/with a healthcheck
    drift: str = "-"
    last_probe: str = "-"
    cause: str = ""  # why the server could not be asked; empty when it answered

    @property
    def ok(self) -> bool:
        return not self.cause


def server_status(spec: Path) -> ServerStatus:
    """One server's status row, gathered here; a failure to ask it is the row's cause."""
    from kit.engine.docker_api import connect
    from kit.engine.url import resolve
    from kit.site import Site
    from kit.views.status import gather

    started = time.monotonic()
    engine = "?"
    try:
        site = Site.load(spec, check_host=False)
        engine = resolve(site.spec.engine)
        status = gather(site, connect(engine))
    except KitError as error:
        return ServerStatus(server_name(spec), engine, time.monotonic() - started,
                            cause=error.message.splitlines()[0])
    containers = status.containers
    with_health = [c for c in containers if c.health]
    probe = status.last_probe
    verdict = "none" if probe is None else ("passed" if probe.get("ok") else "FAILED")
    return ServerStatus(
        server_name(spec), engine, time.monotonic() - started,
        containers=f"{sum(c.running for c in containers)}/{len(containers)} running",
        health=f"{sum(c.health == 'healthy' for c in with_health)}/{len(with_health)} healthy",
        drift=f"{len(status.drift)} change(s)" if status.drift else "none",
        last_probe=verdict,
    )


@dataclass(frozen=True)
class ServerUsage:
    server: str
    seconds: float
    usage: PeriodUsage | None  # None: the server could not be read (cause)
    cause: str = ""


def server_usage(spec: Path, period: Period, now: datetime) -> ServerUsage:
    """One server's usage over `period`, read here (kit.usage.totals.site_usage); a failure to
    read it is the row's cause."""
    from kit.engine.docker_api import connect
    from kit.site import Site
    from kit.usage.totals import site_usage

    started = time.monotonic()
    try:
        site = Site.load(spec, check_host=False)
        found = site_usage(site, connect(site.engine_url), period, now)
    except KitError as error:
        return ServerUsage(server_name(spec), time.monotonic() - started, None,
                           error.message.splitlines()[0])
    return ServerUsage(server_name(spec), time.monotonic() - started, found)


def status_table(rows: list[ServerStatus]) -> str:
    header = ("SERVER", "ENGINE", "CONTAINERS", "HEALTH", "DRIFT", "LAST PROBE", "TIME", "CAUSE")
    return text_table([header, *[
        (r.server, r.engine, r.containers, r.health, r.drift, r.last_probe,
         f"{r.seconds:.1f}s", r.cause or "-") for r in rows
    ]])


def results_table(rows: list[ServerResult]) -> str:
    return text_table([("SERVER", "RESULT", "TIME", "CAUSE"), *[
        (r.server, r.result, f"{r.seconds:.1f}s", r.cause or "-") for r in rows
    ]])


def failed_summary(failed: list[str], total: int) -> KitError:
    return KitError(f"{len(failed)} of {total} server(s) failed: {', '.join(failed)}",
                    fix="see each server's cause above; run the verb on one server with "
                    "`kit VERB DIR/<server>/site.yaml` for its full output")
