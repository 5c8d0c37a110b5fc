"""Before `kit up` creates or starts anything: what the action list is about to need.

Preflight runs only for what the actions create or start, so an unchanged stack costs one engine
round trip. Each check names the cause and the fix before anything is changed: model and cache
folders (bind sources), images (pulled with progress when missing), the engine's NVIDIA device
support and the GPU indices, and the host ports nginx publishes.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import cast

from kit.converge.reconcile import Action, CreateNetwork, starting_services
from kit.engine.desired import GpuRequest, Mount, NetworkState, ServiceState
from kit.engine.docker_api import Engine, show_pull
from kit.engine.observe import ObservedState
from kit.errors import BadInput, KitError
from kit.plan.host import model_below
from kit.site import Site
from kit.spec.model import Spec

SYSTEM_CHECK_SECONDS = 60
SYSTEM_CHECK_MOUNT = "/kit-bind-check"
# Run on a remote engine's host in a throwaway container of the service's image (python3 is in
# vLLM's) with the bind source mounted read-only at argv[1]: whether it is a system folder or
# holds a socket, known by what it holds, since kit cannot see that host's disk or resolve its
# symlinks. Exit 3 and one line saying why when it is; 0 otherwise.
SYSTEM_FOLDER_CHECK = """import os, stat, sys
root = sys.argv[1]
KERNEL = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
          "tracefs", "bpf", "mqueue", "hugetlbfs", "configfs", "fusectl", "pstore", "efivarfs",
          "binfmt_misc", "nsfs"}
def refuse(why):
    print(why); sys.exit(3)
try:
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == root and fields[fields.index("-") + 1] in KERNEL:
            refuse("is a kernel file system (" + fields[fields.index("-") + 1] + ")")
except OSError:
    pass
def has(*names):
    return all(os.path.lexists(os.path.join(root, name)) for name in names)
top = os.listdir(root)
if has("etc/passwd"):
    refuse("is the root of a system (it holds etc/passwd)")
if has("passwd", "shadow") or has("passwd", "group", "hostname"):
    refuse("is a system's /etc (it holds passwd)")
if has("containers", "image", "volumes") or has("docker/containers"):
    refuse("holds the Docker engine's data (containers, image, volumes)")
if has("bin", "lib", "share") or has("sh", "ls") or any(n.startswith(("ld-linux", "libc.so"))
                                                       for n in top):
    refuse("is a folder of the system's programs or libraries")
if any(n.startswith("vmlinuz") for n in top):
    refuse("is the system's /boot")
if has(".ssh"):
    refuse("is a home folder (it holds .ssh)")
seen = 0
def walk(folder, depth):
    global seen
    for entry in os.scandir(folder):
        seen += 1
        if seen > 20000:
            return
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISSOCK(mode):
            refuse("holds a socket, " + os.path.relpath(entry.path, root)
                   + " (a socket there could be the Docker engine's: root on the host)")
        if stat.S_ISDIR(mode) and depth < 3:
            walk(entry.path, depth + 1)
walk(root, 1)
"""


def preflight(
    engine: Engine,
    site: Site,
    observed: ObservedState,
    actions: list[Action],
    report: Callable[[str], None],
) -> None:
    check_subnets(engine, [a.network for a in actions if isinstance(a, CreateNetwork)])
    services = starting_services(actions)
    if services:
        check_cpus(engine, site.spec)
        check_services(engine, site.spec, site.desired.project, services, observed, report)


def check_cpus(engine: Engine, spec: Spec) -> None:
    """The cores the spec declares (`cpus:`, what the planner shared out among vLLM's API-server
    processes: docs/capacity.md) are the engine's host's: more would oversubscribe it."""
    if spec.cpus is None:
        return
    has = engine.host_cpus()
    if spec.cpus > has:
        raise BadInput(f"cpus: {spec.cpus} in the spec, but the engine's host "
                       f"({engine.address}) has {has} CPUs",
                       fix=f"write cpus: {has} (what nproc counts there), or remove cpus: so "
                           "every service runs one API-server process")


def check_services(engine: Engine, spec: Spec, project: str, services: list[ServiceState],
                   observed: ObservedState, report: Callable[[str], None]) -> None:
    """The checks for `services` about to start on `engine` (a site's, or a worker node's)."""
    if engine.is_local:
        check_bind_sources(spec, services)
    ensure_images(engine, services, observed, report, offline=spec.offline)
    if not engine.is_local:
        check_remote_bind_sources(engine, spec, services)
    check_not_system_folders(engine, spec, services)
    check_gpus(engine, project, services)
    if engine.is_local:
        check_ports(engine, spec, services, observed)


def check_subnets(engine: Engine, networks: list[NetworkState]) -> None:
    """A network with a subnet of its own (the metrics network) overlaps none the engine has:
    the engine would refuse it ("Pool overlaps…") with other changes already made."""
    asked = [n for n in networks if n.subnet]
    if not asked:
        return
    taken = [(found["Name"], str(pool.get("Subnet")))
             for found in engine.networks([])
             for pool in (found.get("IPAM") or {}).get("Config") or [] if pool.get("Subnet")]
    for network in asked:
        mine = ipaddress.ip_network(cast(str, network.subnet))  # asked: those with a subnet
        for name, subnet in taken:
            other = ipaddress.ip_network(subnet, strict=False)
            if name != network.name and mine.version == other.version and mine.overlaps(other):
                raise KitError(
                    f"network {network.name} needs subnet {network.subnet}, which overlaps "
                    f"{subnet} of network {name} on the engine",
                    fix="set observability.subnet in the spec to a private subnet no network "
                    "of this engine uses (e.g. 10.89.7.0/28; `docker network inspect` lists "
                    "theirs)")


def check_bind_sources(spec: Spec, services: list[ServiceState]) -> None:
    """Every host folder a container mounts exists (the engine would refuse to start it)."""
    keys = {str(spec.models_root): "models_root", str(spec.hf_cache): "hf_cache"}
    for service in services:
        for mount in service.config.mounts:
            if mount.type == "bind" and not Path(mount.source).exists():
                key = keys.get(mount.source)
                raise BadInput(
                    f"{mount.source} does not exist on this host (service {service.name} mounts "
                    f"it at {mount.target})",
                    fix=f"create it and put the model folders in it, or set {key} in the spec"
                    if key else "re-render the site: kit render",
                )


def check_remote_bind_sources(engine: Engine, spec: Spec, services: list[ServiceState]) -> None:
    """On a remote engine, host folders are that host's: each bind source, and the model
    folder its `vllm serve` command names inside it, exists there (the engine itself is asked)."""
    keys = {str(spec.models_root): "models_root", str(spec.hf_cache): "hf_cache"}
    for service in services:
        for mount in service.config.mounts:
            if mount.type == "bind":
                _check_present(engine, service, mount, keys)


def check_not_system_folders(engine: Engine, spec: Spec, services: list[ServiceState]) -> None:
    """The folders vLLM's containers bind (models_root, hf_cache), each once, as the engine's
    host sees them: the spec's checks (kit/names.py) see only paths, and this host's disk when
    the engine is local; a symlink or a socket on a remote host they cannot."""
    keys = {str(spec.models_root): "models_root", str(spec.hf_cache): "hf_cache"}
    checked: set[str] = set()
    for service in services:
        for mount in service.config.mounts:
            if mount.type == "bind" and mount.source in keys and mount.source not in checked:
                _check_not_system_folder(engine, service, mount.source, keys[mount.source])
                checked.add(mount.source)


def _check_not_system_folder(engine: Engine, service: ServiceState, source: str,
                             key: str) -> None:
    """BadInput when the engine's host says `source` is a system folder or holds a socket."""
    helper = f"{service.container_name}-kit-bind-check"
    engine.helper_start(helper, service.config.image,
                        ["python3", "-c", SYSTEM_FOLDER_CHECK, SYSTEM_CHECK_MOUNT],
                        binds=(Mount("bind", source, SYSTEM_CHECK_MOUNT, True),))
    code, log = engine.helper_wait(helper, SYSTEM_CHECK_SECONDS)
    why = log.strip().splitlines()[-1] if log.strip() else f"exit {code}"
    if code == 3:
        raise BadInput(f"{key} {source} on the engine's host {engine.address} {why}",
                       fix=f"set {key} to a folder of its own on that host, e.g. /srv/models "
                       "(kit never mounts a system folder into a container)")
    if code != 0:
        raise KitError(f"checking {key} {source} on the engine's host {engine.address} failed "
                       f"(exit {code}): {why[-300:]}",
                       fix=f"make sure {service.config.image} has python3 and {source} is "
                       "readable there")


def _check_present(engine: Engine, service: ServiceState, mount: Mount,
                   keys: dict[str, str]) -> None:
    """The bind source, and the model folder below it, exist on the engine's host."""
    model = model_below(service, mount.target)
    for source in [mount.source, *([f"{mount.source}/{model}"] if model else [])]:
        checked = Mount("bind", source, mount.target, True)
        if engine.bind_source_missing(f"{service.container_name}-kit-check",
                                      service.config.image, checked):
            key = keys.get(mount.source)
            raise BadInput(
                f"{source} does not exist on the engine's host {engine.address} "
                f"(service {service.name} mounts it at {mount.target})",
                fix=f"create it there and put the model folders in it, or set {key} "
                "in the spec to that host's folder" if key and source == mount.source
                else f"copy the model to {source} on that host, or fix "
                "services[].model / models_root in the spec",
            )


def ensure_images(
    engine: Engine,
    services: list[ServiceState],
    observed: ObservedState,
    report: Callable[[str], None],
    *,
    offline: bool = False,
) -> None:
    """Pull what the engine lacks; an offline site pulls nothing (its engine reaches no
    registry): every missing image is named with how to bring it."""
    missing = [image for image in dict.fromkeys(s.config.image for s in services)
               if observed.image_ids.get(image) is None]
    if offline and missing:
        raise KitError(
            f"offline: true, and the engine lacks {', '.join(missing)}: kit pulls nothing on "
            "an offline site",
            fix="on a connected machine `kit bundle SPEC --out FILE`, then `kit load FILE SPEC` "
            "here (docs/offline.md); or `docker save " + " ".join(missing) + " > images.tar` "
            "there and `docker load < images.tar` here",
        )
    for image in missing:
        report(f"image {image} is not on this host: pulling it")
        try:
            show_pull(image, engine.pull(image))
        except KitError as error:
            raise KitError(
                f"image {image} is not on this host and pulling it failed: {error.message}",
                fix=f"pull it where a registry is reachable and load it here "
                f"(docker save {image} | ssh <this host> docker load), or set images.* in "
                "the spec to an image this host has",
            ) from None


def check_gpus(engine: Engine, project: str, services: list[ServiceState]) -> None:
    """The engine can hand out every GPU the starting services reserve (driver and indices)."""
    with_gpus = [s for s in services if s.config.gpus]
    if not with_gpus:
        return
    requests: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for service in with_gpus:
        for gpu in service.config.gpus:
            requests.setdefault((gpu.driver, gpu.capabilities), set()).update(gpu.device_ids)
    engine.check_device_request(
        f"{project}-kit-gpu-check",
        with_gpus[0].config.image,
        tuple(
            GpuRequest(driver, tuple(sorted(ids, key=int)), capabilities)
            for (driver, capabilities), ids in requests.items()
        ),
    )


def check_ports(
    engine: Engine, spec: Spec, services: list[ServiceState], observed: ObservedState
) -> None:
    """Host ports the starting services publish are free (ports their own running container
    holds are freed when it is replaced)."""
    keys = {spec.proxy.https_port: "proxy.https_port", spec.proxy.http_port: "proxy.http_port"}
    for service in services:
        ours = {
            port for c in observed.of(service.name) if c.running for port in c.host_ports
        }
        for port in service.config.ports:
            if (port.host_ip, port.host_port) in ours or _can_bind(port.host_ip, port.host_port):
                continue
            holders = engine.publishers(port.host_port)
            who = f"container {', '.join(holders)}" if holders else "another process"
            key = keys.get(port.host_port, "the port")
            raise KitError(
                f"{port.host_ip}:{port.host_port} ({key}) is already in use by {who}",
                fix=f"stop {who}, or set {key} in the spec to a free port",
            )


def _can_bind(host_ip: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host_ip, port))
        except OSError as error:
            return error.errno != errno.EADDRINUSE  # no permission here says nothing about use
    return True
