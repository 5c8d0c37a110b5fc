"""`kit sleep` / `kit wake` and `kit status`'s awake/asleep: vLLM's sleep mode driven from inside
each replica's container (docs/sleep.md).

vLLM opens /sleep, /wake_up and /is_sleeping only in dev mode (a service with idle_sleep); they
are on its private port, which the front door never passes (kit/names.py), so kit reaches them as
the probe reaches a replica: curl in the container, through the engine. A service sleeps and
wakes as a set: every replica, since the front door sends a request to any of them. /health
cannot tell a sleeping engine (it answers 200), so the state is asked of /is_sleeping.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kit.engine.desired import WAKER_SERVICE
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState, ObservedState
from kit.engine.replica_client import in_flight, request_in_container, sleep_state
from kit.errors import BadInput, KitError
from kit.front_door.gate import Check
from kit.plan.waker import ask_argv
from kit.site import Site
from kit.spec.model import Service
from kit.spec.replicas import compose_names

# The first level-1 sleep of a real 8B model took 11.9 s (later ones 0.4 s), a wake 0.7 s; a
# larger model moves more weights. Generous: a slow answer is not a failure to sleep.
CHANGE_TIMEOUT_S = 300
ASK_TIMEOUT_S = 10
# Log lines searched for vLLM's cause of a failure: its access log (the waker's checks among
# others) may have added many since.
LOG_LINES = 400
# After a level-2 wake the weights are garbage until reloaded, and the prefix cache holds blocks
# computed with the old ones (vLLM's sleep-mode docs): both follow the wake.
LEVEL_2_AFTER_WAKE: tuple[tuple[str, dict[str, str]], ...] = (
    ("/collective_rpc", {"method": "reload_weights"}),
    ("/reset_prefix_cache", {}),
)


@dataclass(frozen=True)
class ReplicaSleep:
    """One replica's sleep state as its vLLM reports it: awake, asleep, or unknown (why)."""

    service: str
    replica: str  # the compose name (the container's host name)
    state: str  # "awake" | "asleep" | "unknown"
    detail: str = ""
    # the waker's account of the service (docs/sleep.md): since, wakes, last_wake, failure…
    account: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"service": self.service, "replica": self.replica, "state": self.state,
                **({"detail": self.detail} if self.detail else {}),
                **({"waker": self.account} if self.account else {})}

    def summary(self) -> str:
        """`kit status`'s line: the state, and the waker's since when, wakes and last wake."""
        text = f"sleep mode: {self.replica} {self.state.upper()}"
        if self.detail:
            text += f" ({self.detail})"
        account = self.account
        if account.get("since"):
            text += f" since {_clock(account['since'])}"
        if "wakes" in account:
            text += f", {account['wakes']} wake(s)"
        if account.get("last_wake"):
            text += (f", last {_clock(account['last_wake'])} "
                     f"({account.get('last_wake_seconds', 0):.2f} s)")
        if account.get("failure"):
            text += f"\n  its last wake FAILED: {account['failure']}"
            if account.get("cause"):
                text += f"\n  vLLM's log: {account['cause']}"
        return text


def _clock(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))


@dataclass(frozen=True)
class SleepOutcome:
    """What kit sleep / kit wake did to each replica (all of them did what was asked)."""

    verb: str
    service: str
    done: tuple[str, ...]  # replicas changed
    already: tuple[str, ...]  # replicas that were so before

    def lines(self) -> list[str]:
        state = "asleep" if self.verb == "sleep" else "awake"
        return ([f"{self.service}: {name} now {state}" for name in self.done]
                + [f"{self.service}: {name} was already {state}" for name in self.already])


def sleeping_service(site: Site, name: str) -> Service:
    """The spec's service `name`, which must have idle_sleep (vLLM runs in sleep mode)."""
    names = [service.name for service in site.spec.services]
    if name not in names:
        raise BadInput(f"no service {name!r} in {site.spec_path}",
                       fix=f"name one of: {', '.join(names)}")
    service = site.spec.service(name)
    if service.idle_sleep is None:
        raise BadInput(f"service {name!r} has no idle_sleep: its vLLM runs without sleep mode",
                       fix=f"add `idle_sleep: {{after: 15m}}` to services[{names.index(name)}] and "
                       "run kit up (vLLM then starts with --enable-sleep-mode)")
    return service


def change_sleep(site: Site, engine: Engine, name: str, verb: str) -> SleepOutcome:
    """Put every replica of service `name` to sleep (verb "sleep") or wake it ("wake"); a
    replica already so is left alone. Raises KitError naming the replica that could not."""
    service = sleeping_service(site, name)
    assert service.idle_sleep is not None
    observed = site.observe(engine, with_images=False)
    replicas = _running_replicas(site, observed, service)
    waker = _waker(observed)
    by_waker = _by_waker(engine, waker, name, verb, replicas) if waker is not None else None
    if by_waker is not None:  # it runs: it made the change, so it knew at once
        return by_waker
    to_change = [(host, container) for host, container in replicas
                 if _asleep(engine, host, container) != (verb == "sleep")]
    changing = {host for host, _ in to_change}
    already = [host for host, _ in replicas if host not in changing]
    if verb == "sleep":
        _all_idle(engine, to_change)  # before any sleeps: never one asleep alone among busy ones
    done = []
    for host, container in to_change:
        if verb == "sleep":
            _call(engine, host, container, f"/sleep?level={service.idle_sleep.level}", {})
        else:
            _call(engine, host, container, "/wake_up", {})
            if service.idle_sleep.level == 2:
                for path, body in LEVEL_2_AFTER_WAKE:
                    _call(engine, host, container, path, body)
        if _asleep(engine, host, container) != (verb == "sleep"):
            raise KitError(f"{host} answered {verb} but /is_sleeping still says "
                           f"{'awake' if verb == 'sleep' else 'asleep'}",
                           fix=f"see kit logs {site.spec_path}")
        done.append(host)
    return SleepOutcome(verb, name, tuple(done), tuple(already))


def sleep_container(engine: Engine, host: str, container: ContainerState, level: int) -> None:
    """One replica asleep (kit up, before another member of its swap group starts): left alone
    when it already is; KitError naming the cause when it could not."""
    if _asleep(engine, host, container):
        return
    _call(engine, host, container, f"/sleep?level={level}", {})
    if not _asleep(engine, host, container):
        raise KitError(f"{host} answered sleep but /is_sleeping still says awake",
                       fix="see kit logs")


def _all_idle(engine: Engine, replicas: list[tuple[str, ContainerState]]) -> None:
    for host, container in replicas:
        busy = in_flight(engine, container)
        if busy:
            raise KitError(f"{host} has {busy} request(s) in flight: a sleep now would hold or "
                           "drop them", fix="run kit sleep again once they finished (a sleep "
                           "by hand never cuts a stream)")


def sleep_states(engine: Engine, site: Site,
                 containers: tuple[ContainerState, ...]) -> tuple[ReplicaSleep, ...]:
    """Awake / asleep of every replica of the services with idle_sleep (none asked otherwise:
    a site without idle_sleep pays nothing), with the waker's account of each service (since
    when, wakes, last wake, a failed wake and vLLM's logged cause of it)."""
    if all(service.idle_sleep is None for service in site.spec.services):
        return ()
    waker = next((c for c in containers if c.service == WAKER_SERVICE and c.running), None)
    accounts = waker_accounts(engine, waker) if waker is not None else {}
    states = []
    for service in site.spec.services:
        if service.idle_sleep is None:
            continue
        account = accounts.get(service.name, {})
        for host in compose_names(service.name, service.replica_count):
            running = [c for c in containers if c.service == host and c.running]
            if not running:
                states.append(ReplicaSleep(service.name, host, "unknown", "not running", account))
                continue
            if account.get("failure") and "cause" not in account:
                account = {**account, "cause": _last_error(engine, running[0])}
            try:
                asleep = _asleep(engine, host, running[0], timeout=ASK_TIMEOUT_S)
            except KitError as error:
                states.append(ReplicaSleep(service.name, host, "unknown", error.message, account))
                continue
            states.append(ReplicaSleep(service.name, host, "asleep" if asleep else "awake",
                                       account=account))
    return tuple(states)


def failed_wakes(site: Site, connect: Callable[[], Engine]) -> list[Check]:
    """A failed check per service whose last wake failed (the waker's account, with vLLM's
    logged cause), for the gate of kit up and kit probe: a model that cannot wake is not
    serving, even while it sleeps. A site without idle_sleep: no engine call."""
    if all(service.idle_sleep is None for service in site.spec.services):
        return []
    engine = connect()
    states = sleep_states(engine, site, site.observe(engine, with_images=False).containers)
    failed = {state.service: state.account for state in states
              if state.account.get("failure")}
    return [Check(f"wake {name}", False, f"its last wake failed: {account['failure']}"
                  + (f"; vLLM's log: {account['cause']}" if account.get("cause") else "")
                  + f" (it stays asleep; see kit logs, then kit wake {name})")
            for name, account in failed.items()]


def waker_accounts(engine: Engine, waker: ContainerState) -> dict[str, dict]:
    """The waker's account of each service (its /state), {} when it does not answer."""
    status, body = _ask_waker(engine, waker, "/state", ASK_TIMEOUT_S)
    try:
        services = json.loads(body)["services"] if status == 200 else []
        return {entry["service"]: entry for entry in services}
    except (ValueError, KeyError, TypeError):
        return {}


def _waker(observed: ObservedState) -> ContainerState | None:
    return observed.running(WAKER_SERVICE)


def _ask_waker(engine: Engine, waker: ContainerState, path: str,
               timeout: float) -> tuple[int, str]:
    """(HTTP status, body) of the waker's answer inside its container; 0 when none came."""
    try:
        code, output = engine.exec(waker.id, ask_argv(path, timeout))
    except KitError as error:
        return 0, error.message
    status, _, body = output.partition("\n")
    if code != 0 or not status.isdigit():
        return 0, output.strip()[-200:]
    return int(status), body


def _by_waker(engine: Engine, waker: ContainerState, name: str, verb: str,
              replicas: list[tuple[str, ContainerState]]) -> SleepOutcome | None:
    """The change made by the waker; None when it did not answer (starting, stopped): then kit
    makes it itself, and the waker learns it at its next check of the replicas."""
    status, body = _ask_waker(engine, waker, f"/hand/{verb}/{name}", CHANGE_TIMEOUT_S)
    if status == 0:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    if status != 200 or not isinstance(answer, dict):
        message = (answer.get("error", {}).get("message") if isinstance(answer, dict) else None)
        causes = {cause for _, container in replicas if (cause := _last_error(engine, container))}
        raise KitError(f"{name}: the waker ({WAKER_SERVICE}) could not {verb} it: "
                       f"{message or body.strip()[:200] or 'no answer'}"
                       + (f" (vLLM's log: {'; '.join(sorted(causes))})" if causes else ""),
                       fix="see kit logs; the service keeps the state it had")
    hosts = tuple(host for host, _ in replicas)
    changed = answer.get("changed") is True
    return SleepOutcome(verb, name, hosts if changed else (), () if changed else hosts)


def asleep_services(site: Site, connect: Callable[[], Engine]) -> frozenset[str]:
    """The services with idle_sleep that have a replica asleep, for the gate and the probe
    (which must not send them a completion). A site without idle_sleep: no engine call."""
    if all(service.idle_sleep is None for service in site.spec.services):
        return frozenset()
    engine = connect()
    states = sleep_states(engine, site, site.observe(engine, with_images=False).containers)
    return frozenset(state.service for state in states if state.state == "asleep")


def _running_replicas(site: Site, observed: ObservedState,
                      service: Service) -> list[tuple[str, ContainerState]]:
    replicas = []
    for host in compose_names(service.name, service.replica_count):
        running = observed.running(host)
        if running is None:
            raise KitError(f"{host} is not running, so kit cannot reach its vLLM",
                           fix=f"run kit up {site.spec_path}")
        replicas.append((host, running))
    return replicas


def _asleep(engine: Engine, host: str, container: ContainerState,
            timeout: float = CHANGE_TIMEOUT_S) -> bool:
    asleep, why = sleep_state(engine, container, timeout)
    if asleep is None:
        fix = ("run kit up: it recreates the container" if "dev mode" in why
               else "see kit logs and kit status")
        raise KitError(f"{host}: {why}", fix=fix)
    return asleep


def _call(engine: Engine, host: str, container: ContainerState, path: str, body: dict) -> None:
    status, text = request_in_container(engine, container, path, body, CHANGE_TIMEOUT_S)
    if status != 200:
        cause = _last_error(engine, container)
        raise KitError(f"{host}: POST {path.split('?')[0]} answered {status or 'nothing'}"
                       f"{f': {text[:200]}' if text else ''}"
                       + (f" (its log: {cause})" if cause else ""),
                       fix="see kit logs; the replica keeps the state it had")


def _last_error(engine: Engine, container: ContainerState) -> str:
    """The last exception line vLLM logged (its traceback's cause), if any."""
    try:
        tail = engine.log_tail(container.id, LOG_LINES)
    except KitError:
        return ""
    causes = [line.split(") ", 1)[-1].strip() for line in tail.splitlines()
              if "Error: " in line or "Error(" in line]
    return causes[-1][:300] if causes else ""
