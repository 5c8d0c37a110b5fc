"""`kit sleep` / `kit wake` and `kit status`'s awake/asleep: vLLM's sleep mode driven from inside
each replica's container (docs/sleep.md).

vLLM opens /sleep, /wake_up and /is_sleeping only in dev mode (a service with idle_sleep); they
are on its private port, which the front door never passes (kit/names.py), so kit reaches them as
the probe reaches a replica: curl in the container, through the engine. A service sleeps and
wakes as a set: every replica, since the front door sends a request to any of them. /health
cannot tell a sleeping engine (it answers 200), so the state is asked of /is_sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState
from kit.errors import BadInput, KitError
from kit.front_door.replica_check import in_flight, request_in_container, sleep_state
from kit.site import Site
from kit.spec.model import Service
from kit.spec.replicas import compose_names

# The first level-1 sleep of a real 8B model took 11.9 s (later ones 0.4 s), a wake 0.7 s; a
# larger model moves more weights. Generous: a slow answer is not a failure to sleep.
CHANGE_TIMEOUT_S = 300
ASK_TIMEOUT_S = 10
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

    def to_json(self) -> dict:
        return {"service": self.service, "replica": self.replica, "state": self.state,
                **({"detail": self.detail} if self.detail else {})}


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
    replicas = _running_replicas(site, engine, service)
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
    a site without idle_sleep pays nothing)."""
    states = []
    for service in site.spec.services:
        if service.idle_sleep is None:
            continue
        for host in compose_names(service.name, service.replica_count):
            running = [c for c in containers if c.service == host and c.running]
            if not running:
                states.append(ReplicaSleep(service.name, host, "unknown", "not running"))
                continue
            try:
                asleep = _asleep(engine, host, running[0], timeout=ASK_TIMEOUT_S)
            except KitError as error:
                states.append(ReplicaSleep(service.name, host, "unknown", error.message))
                continue
            states.append(ReplicaSleep(service.name, host, "asleep" if asleep else "awake"))
    return tuple(states)


def asleep_services(site: Site, connect: Callable[[], Engine]) -> frozenset[str]:
    """The services with idle_sleep that have a replica asleep, for the gate and the probe
    (which must not send them a completion). A site without idle_sleep: no engine call."""
    if all(service.idle_sleep is None for service in site.spec.services):
        return frozenset()
    engine = connect()
    states = sleep_states(engine, site, site.observe(engine, with_images=False).containers)
    return frozenset(state.service for state in states if state.state == "asleep")


def _running_replicas(site: Site, engine: Engine,
                      service: Service) -> list[tuple[str, ContainerState]]:
    observed = site.observe(engine, with_images=False)
    replicas = []
    for host in compose_names(service.name, service.replica_count):
        running = [c for c in observed.of(host) if c.running]
        if not running:
            raise KitError(f"{host} is not running, so kit cannot reach its vLLM",
                           fix=f"run kit up {site.spec_path}")
        replicas.append((host, running[0]))
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
        tail = engine.log_tail(container.id, 50)
    except KitError:
        return ""
    causes = [line.split(") ", 1)[-1].strip() for line in tail.splitlines()
              if "Error: " in line or "Error(" in line]
    return causes[-1][:300] if causes else ""
