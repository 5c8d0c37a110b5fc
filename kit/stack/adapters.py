"""`kit adapters add|remove|list` (docs/adapters.md): a LoRA adapter hot-loaded on every replica
of a service, or unloaded, without a restart; and the proof that a replica serves every adapter
its command declares before a rolling update puts it back in nginx.

`add`: the adapter checked as `kit validate` checks it (the spec with the new entry parsed with
the host checks: its files, base, rank, sha256, a name no other model has) before any replica
sees it; loaded on every replica at once through vLLM's /v1/load_lora_adapter (curl inside the
container, as kit sleep reaches /sleep: the front door refuses the route); each replica gated
with a 1-token completion on it; only then site.yaml gets the entry (an in-place edit,
kit/spec/edit.py), the site is rendered and nginx reloaded: the door routes it. A failure on any
replica unloads it from every replica that loaded it, and site.yaml and the door stay as they
were. `remove`: site.yaml, render and reload first (the door stops routing it), then unloaded.

The render writes the service's adapters into vLLM's --config file (lora/<service>/
adapters.yaml, mounted read-only in every replica; no part of a replica's identity), so a replica
that starts later, created or restarted by the engine after a crash, loads the new set before it
answers /health; no replica is recreated. `remove` waits for the requests on the adapter already
inside each replica's vLLM (vllm:lora_requests_info) before it unloads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from kit.converge.adapter_load import ADAPTER_DRAIN_S, drain_and_unload, load_and_gate, unload_all
from kit.engine.desired import PROXY_SERVICE
from kit.engine.docker_api import Engine
from kit.engine.observe import ContainerState
from kit.engine.remote_files import deliver, site_volumes
from kit.errors import BadInput, KitError
from kit.files import rewrite_in_place
from kit.front_door.reload import reload, running_proxy
from kit.plan.adapters import service_adapters
from kit.plan.build import adapter_paths
from kit.plan.host import host_checks
from kit.render.site_files import render_site
from kit.site import Site
from kit.spec.edit import edit_adapters
from kit.spec.load import parse_spec
from kit.spec.model import Service
from kit.spec.replicas import compose_names
from kit.table import text_table
from kit.views.status import ServedAdapters, replica_adapters


@dataclass(frozen=True)
class AdapterChange:
    """What `kit adapters add` / `remove` did, for the verb to print."""

    verb: str
    service: str
    adapter: str
    replicas: tuple[tuple[str, str], ...]  # (replica, what happened)
    seconds: float  # from the command's start to the door routing (or no longer routing) it

    def lines(self) -> list[str]:
        done = "loaded and routable" if self.verb == "add" else "unroutable and unloaded"
        return ([f"{self.service}: {host}: {detail}" for host, detail in self.replicas]
                + [f"adapter {self.adapter} {done} on {len(self.replicas)} replica(s) of "
                   f"{self.service} in {self.seconds:.1f}s"])


def adapter_service(site: Site, name: str) -> Service:
    """The spec's service `name`, whose vLLM runs with LoRA (it declares adapters, so kit
    rendered --enable-lora and the runtime routes' switch)."""
    names = [service.name for service in site.spec.services]
    if name not in names:
        raise BadInput(f"no service {name!r} in {site.spec_path}",
                       fix=f"name one of: {', '.join(names)}")
    service = site.spec.service(name)
    if not service.adapters:
        raise BadInput(f"service {name!r} declares no adapters, so its vLLM runs without LoRA "
                       "(no --enable-lora, no runtime load route): nothing can be hot-loaded",
                       fix=f"declare the adapter under services[{names.index(name)}].adapters "
                       "in site.yaml and run kit up (it restarts the replicas, one at a time)")
    return service


def add_adapter(site: Site, engine: Engine, service_name: str, entry: dict[str, str],
                report: Callable[[str], None] = lambda _: None) -> AdapterChange:
    """Load adapter `entry` ({name, path[, revision, sha256]}) on every replica of the service,
    gate each, then make the door route it; KitError (nothing changed) when any replica fails."""
    started = time.monotonic()
    adapter_service(site, service_name)
    original = site.spec_path.read_bytes()
    text = edit_adapters(original.decode(), service_name, add=entry)
    new_spec = parse_spec(text, site.spec_path, host=host_checks())  # validate's checks
    service = new_spec.service(service_name)
    path = adapter_paths(new_spec, service)[entry["name"]]
    replicas = _replicas(site, engine, service)
    _check_rank(site, service, entry["name"])
    report(f"adapter {entry['name']} checked (files, base, rank"
           f"{', sha256' if entry.get('sha256') else ''}); loading on {len(replicas)} replica(s)")
    new_site = replace(site, spec=new_spec)
    # site.yaml and the render are written while the replicas load (nginx reads them only when
    # reloaded, below, and the site lock keeps every other kit verb out): undone on a failure
    with ThreadPoolExecutor(max_workers=len(replicas) + 1) as pool:
        rendering = pool.submit(_write_and_render, new_site, text.encode())
        loads = list(pool.map(lambda replica: load_and_gate(
            engine, replica[0], replica[1], entry["name"], path, service.task), replicas))
        render_error = rendering.exception()
    report(f"loaded and gated on {len(loads) - sum(not load.ok for load in loads)} of "
           f"{len(loads)} replica(s) after {time.monotonic() - started:.1f}s")
    failed = [load for load in loads if not load.ok]
    loaded = [load.container for load in loads if load.loaded]
    if failed or render_error is not None:
        undone = unload_all(engine, loaded, entry["name"])
        _write_and_render(site, original)  # as it was; nginx never loaded the new files
        if render_error is not None:
            raise render_error
        raise KitError(
            f"adapter {entry['name']} failed on {', '.join(load.host for load in failed)}: "
            + "; ".join(f"{load.host}: {load.detail}" for load in failed)
            + f"; unloaded again from {', '.join(undone) or 'no replica'}; site.yaml and the "
            "front door unchanged", fix="fix the adapter (or the replica: kit logs) and run "
            "kit adapters add again")
    try:
        _reload(new_site, engine, report)
    except BaseException:
        unload_all(engine, loaded, entry["name"])
        _write_and_render(site, original)
        raise
    return AdapterChange("add", service_name, entry["name"],
                         tuple((load.host, load.detail) for load in loads),
                         time.monotonic() - started)


def remove_adapter(site: Site, engine: Engine, service_name: str, name: str,
                   report: Callable[[str], None] = lambda _: None,
                   drain_timeout: float = ADAPTER_DRAIN_S) -> AdapterChange:
    """Stop routing adapter `name` at the door (site.yaml, render, reload), wait for the
    requests on it already inside each replica's vLLM, then unload it from every running
    replica (kit.converge.adapter_load.drain_and_unload); KitError naming the replicas it is still
    loaded on."""
    started = time.monotonic()
    adapter_service(site, service_name)
    text = edit_adapters(site.spec_path.read_text(encoding="utf-8"), service_name, remove=name)
    new_spec = parse_spec(text, site.spec_path, host=host_checks())
    new_site = replace(site, spec=new_spec)
    _write_and_render(new_site, text.encode())
    _reload(new_site, engine, report)
    running = _replicas(site, engine, site.spec.service(service_name), required=False)
    try:
        done = drain_and_unload(engine, running, name, drain_timeout)
    except KitError as error:
        raise KitError(f"{error.message}; it is no longer declared in {site.spec_path}",
                       fix=error.fix) from None
    return AdapterChange("remove", service_name, name, tuple(done),
                         time.monotonic() - started)


def adapter_table(site: Site, engine: Engine, service_name: str | None = None) -> str:
    """`kit adapters list`: per running replica of each service with adapters, each adapter
    declared or served and its state (the one reading `kit status` shows too)."""
    if service_name is not None:
        adapter_service(site, service_name)
    states = replica_adapters(site, engine, site.observe(engine, with_images=False).containers)
    shown = None if service_name is None else set(compose_names(
        service_name, site.spec.service(service_name).replica_count))
    rows = [["REPLICA", "ADAPTER", "STATE"]]
    for state in states:
        if shown is None or state.container in shown:
            rows += _rows(state)
    if len(rows) == 1:
        return "no running replica of a service with adapters"
    return text_table(rows)


def _rows(state: ServedAdapters) -> list[list[str]]:
    if state.served is None:
        return [[state.container, "-", "unknown: its /v1/models did not answer"]]
    names = sorted(set(state.served) | set(state.missing))
    return [[state.container, name,
             "DRIFT: declared, not loaded (requests for it fail here)" if name in state.missing
             else "DRIFT: loaded, not declared (the door does not route it)"
             if name in state.undeclared else "loaded"] for name in names]


def _replicas(site: Site, engine: Engine, service: Service,
              *, required: bool = True) -> list[tuple[str, ContainerState]]:
    """(compose name, container) of each running replica; with `required`, every replica must
    run (a stopped one would start without a hot-loaded adapter)."""
    observed = site.observe(engine, with_images=False)
    replicas = []
    for host in compose_names(service.name, service.replica_count):
        running = observed.running(host)
        if running is None and not required:
            continue
        if running is None:
            raise KitError(f"{host} is not running, so kit cannot load the adapter there",
                           fix=f"run kit up {site.spec_path}, then this again")
        replicas.append((host, running))
    return replicas


def _check_rank(site: Site, service: Service, name: str) -> None:
    """The running vLLM holds ranks up to the --max-lora-rank it started with: a larger adapter
    needs a restart (the spec's entry and kit up), not a hot load."""
    info = service_adapters(service, site.spec.models_root, site.spec.hf_cache)[
        [a.name for a in service.adapters].index(name)]
    started_with = site.desired.service(compose_names(service.name, service.replica_count)[0]
                                        ).argument("--max-lora-rank")
    if info.rank and started_with and started_with.isdigit() and info.rank > int(started_with):
        raise BadInput(f"adapter {name} has rank {info.rank}; {service.name}'s vLLM runs with "
                       f"--max-lora-rank {started_with} and cannot hold it without a restart",
                       fix="declare it in site.yaml and run kit up (the replicas restart with a "
                       "larger --max-lora-rank, one at a time)")


def _write_and_render(site: Site, spec_text: bytes) -> None:
    """site.yaml as `spec_text` (its spec), and the site rendered from it."""
    rewrite_in_place(site.spec_path, spec_text)
    render_site(site)


def _reload(site: Site, engine: Engine, report: Callable[[str], None]) -> None:
    """The running front door reloaded with the site's rendered files: it routes exactly the
    adapters the spec declares."""
    started = time.monotonic()
    desired = site.desired
    if site_volumes(desired):
        deliver(engine, desired, site.layout.root)
    proxy = running_proxy(engine, site.project)
    if proxy is None:
        raise KitError("the front door is not running, so it cannot route the change",
                       fix=f"run kit up {site.spec_path}")
    reload(engine, desired.service(PROXY_SERVICE), proxy, site.layout.applied)
    report(f"front door reloaded ({time.monotonic() - started:.1f}s)")
