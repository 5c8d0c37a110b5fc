"""A rolling update: the changed replicas of a service replaced one at a time, never more than
one out of service, no request dropped.

For each replica: take it out of the service's server list (nginx/replicas/<service>.conf)
and reload nginx (old workers finish the streams they carry); wait until vLLM runs and queues
nothing (vllm:num_requests_running + waiting) or the drain deadline passes; stop it (vLLM's
--shutdown-timeout, the engine's matching stop_grace_period); create the new one on the same
GPUs (no surge: they are pinned); wait for its health, then prove it directly with a real
1-token completion (and one on each LoRA adapter its command declares:
kit/converge/adapter_load.py); put it back and reload. A replica that fails stops the rollout:
it stays out of nginx, the others keep serving (the ones already replaced, new; the rest, old), and
kit up exits non-zero with the diagnosis. The next `kit render` (or `kit up`) lists every
replica again.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.converge.adapter_load import serve_declared
from kit.converge.reconcile import Action, RecreateContainer, RollReplicas
from kit.engine.desired import PROXY_SERVICE, REPLICA_SERVICE_LABEL, ServiceState, load_desired
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState, container_state
from kit.engine.replica_client import DRAIN_SECONDS, in_flight, wait_quiet
from kit.errors import KitError
from kit.files import atomic_write
from kit.front_door.reload import reload, running_proxy
from kit.front_door.replica_check import prove_replica
from kit.layout import SiteLayout
from kit.plan.build import OUT_OF_SERVICE
from kit.spec.vllm_flags import serving_task
from kit.state import json_object, read_state

DOWN = " down;"


@dataclass(frozen=True)
class Rollout:
    engine: Engine
    layout: SiteLayout
    project: str
    remove: Callable[[ContainerState], None]
    create: Callable[[ServiceState], str]  # → the new container's id
    wait: Callable[[tuple[ServiceState, ...]], None]
    report: Callable[[str], None]
    drain_seconds: float = DRAIN_SECONDS

    def run(self, action: RollReplicas) -> None:
        total = len(action.replicas)
        # A replica that is not running (`docker kill`) has no name in Docker's DNS: while its
        # server line is live, every reload fails `nginx -t`. Replaced first, it is out of the
        # list (`mark`) for the first reload and back, running, by the next.
        steps = sorted(action.replicas, key=lambda step: step.old.running)
        for done, step in enumerate(steps):
            try:
                self._replace(action.service, step)
            except KitError as error:
                raise KitError(
                    f"rolling update of {action.service} stopped at {step.service.name} "
                    f"({done} of {total} replaced); {step.service.name} stays out of nginx, the "
                    f"other replicas keep serving:\n{error.message}",
                    fix=error.fix,
                ) from None

    def _replace(self, service: str, step: RecreateContainer) -> None:
        host = step.service.name
        self._serve(service, host, serving=False)
        self.report(f"  {host}: out of nginx; draining")
        left = drain(self.engine, step.old, self.drain_seconds)
        self.report(f"  {host}: drained" if left == 0 else
                    f"  {host}: {left} request(s) still running after {self.drain_seconds:.0f}s; "
                    "stopping it (vLLM's --shutdown-timeout lets them finish)")
        self.remove(step.old)
        container_id = self.create(step.service)
        self.wait((step.service,))
        container = container_state(self.engine.inspect(container_id))
        verdict = prove_replica(self.engine, container, served_name(step.service),
                                serving_task(list(step.service.config.command)))
        if not verdict.ok:
            raise KitError(f"{host} is healthy but failed its gate: {verdict.detail}",
                           fix=f"read its log: kit logs {host}")
        adapters = serve_declared(self.engine, container, step.service,  # declared = loaded
                                  self.layout.lora_config(service))
        self._serve(service, host, serving=True)
        self.report(f"  {host}: back in nginx ({verdict.detail}"
                    f"{f'; {adapters}' if adapters else ''})")

    def _serve(self, service: str, host: str, *, serving: bool) -> None:
        """Mark `host` in (or out of) the service's server list, then reload nginx."""
        path = self.layout.replica_pool(service)
        atomic_write(path, mark(path.read_text(), host, serving=serving).encode())
        proxy = running_proxy(self.engine, self.project)
        if proxy is None:
            raise KitError("the front door stopped during the rolling update",
                           fix="see `kit status`, then run `kit up` again")
        # the digest of what nginx now loads: the next kit up reloads it unless it is the render
        current = load_desired(self.layout, self.project).service(PROXY_SERVICE)
        reload(self.engine, current, proxy, self.layout.applied)


def drain(engine: Engine, old: ContainerState, seconds: float = DRAIN_SECONDS) -> int:
    """Requests a replica out of nginx still runs or queues: 0 once it was idle for the quiet
    time, else what is left when `seconds` passed. When it cannot tell (vLLM run with
    --disable-log-stats has no vllm:* metrics) it waits for the deadline. A replica that is not
    healthy (crash-looping, still loading) carries no streams: nothing to wait for."""
    current = container_state(engine.inspect(old.id))
    if not current.running or current.health not in (None, "healthy"):
        return 0
    return wait_quiet({old.service: lambda: in_flight(engine, current)}, seconds).left.get(
        old.service) or 0


def mark(pool: str, host: str, *, serving: bool) -> str:
    """The server list with `host` in service, or out of it: commented out as well as `down`,
    because nginx resolves every server name it loads, and a replica that is not running
    (crash-looping, or being replaced) has no name in Docker's DNS: `nginx -t` would fail."""
    lines = []
    for line in pool.splitlines():
        server = line.removeprefix(OUT_OF_SERVICE)
        if server.startswith(f"server {host}:"):
            server = server.removesuffix(DOWN).removesuffix(";")
            line = f"{server};" if serving else f"{OUT_OF_SERVICE}{server}{DOWN}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def out_of_service(pool: str) -> set[str]:
    """The hosts `mark` took out of a server list (a rollout stopped before it put them back):
    running, maybe healthy, and carrying no request."""
    hosts = set()
    for line in pool.splitlines():
        server = line.removeprefix(OUT_OF_SERVICE)
        if server != line and server.startswith("server "):
            hosts.add(server.split()[1].rsplit(":", 1)[0])
    return hosts


def served_name(service: ServiceState) -> str:
    """The model name the replica's vLLM serves (its --served-model-name)."""
    name = service.argument("--served-model-name")
    assert name is not None, "kit renders --served-model-name for every vLLM service"
    return name


def downtime_notes(actions: list[Action], start_times: Path) -> list[str]:
    """What a single-replica model service's replacement costs, said before it starts: it
    serves nothing until the new container is healthy (as long as it took last time)."""
    last = read_start_times(start_times)
    notes = []
    for action in actions:
        if not (isinstance(action, RecreateContainer) and action.old.running
                and action.service.gpu_ids and REPLICA_SERVICE_LABEL not in action.service.labels):
            continue
        name = action.service.name
        took = (f"its last start took {last[name]:.0f}s" if name in last
                else "no earlier start of it is recorded")
        notes.append(f"{name} has one replica: it is down until its replacement is healthy "
                     f"({took}); meanwhile the front door answers 503 with Retry-After. Give it "
                     "more GPUs and tensor_parallel (replicas) to update without a gap")
    return notes


def read_start_times(path: Path) -> dict[str, float]:
    return read_state(path, _start_times, fix="delete it: kit up records the next starts") or {}


def _start_times(text: str) -> dict[str, float]:
    return {str(name): float(seconds) for name, seconds in json_object(text).items()}


def record_start_times(path: Path, seconds: dict[str, float]) -> None:
    """Remember how long each service took to become healthy, for the next notice."""
    times = {**read_start_times(path), **seconds}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(times, indent=1, sort_keys=True) + "\n").encode(), 0o600)
