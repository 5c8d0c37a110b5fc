"""An in-memory Docker engine with kit.engine.docker_api.Engine's interface, for engine-free tests.

Same methods, same plain data (inspect-shaped dicts, (exit code, output), (pid, command)), and
KitError where the real adapter raises one, so the executor, the health wait, the front-door
reload and the credential change run unmodified against it. Tests script what a real engine
would do on its own (a container exiting, health changing, nginx refusing a reload) and read
`calls`, the order in which kit asked for things.

The one family of engine fakes: FakeEngine, and for what a test needs the engine to do on its
own, HealthyEngine (healthy at start), ReplicaEngine (each replica's vLLM answering kit's direct
check), NodeEngine (one server of a multi-node service) and ExecOnlyEngine (exec answers alone).
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from kit.engine.desired import ContainerConfig, GpuRequest, Mount, NetworkState, VolumeState
from kit.engine.door_ports import PortProblem
from kit.engine.replica_client import CURL
from kit.errors import KitError

NGINX_WORKER = "nginx: worker process"


@dataclass
class _Container:
    attrs: dict
    argv: list[str]
    healthcheck: bool
    processes: list[tuple[int, str]] = field(default_factory=list)
    log: list[tuple[float, str]] = field(default_factory=list)
    inspections: int = 0
    scheduled: list[tuple[int, dict]] = field(default_factory=list)  # (after n inspects, State)


class FakeEngine:
    """kit.engine.docker_api.Engine over dicts. Scripting: `images`, `exec_results`,
    `reload_errors`,
    `worker_log`, `dead_ports`, `fail(method, error)`, `schedule(container, after=n, **state)`,
    `write_log`."""

    def __init__(self, images: dict[str, str] | None = None, *, local: bool = True) -> None:
        self.address = "unix:///fake.sock" if local else "ssh://ops@fake-host"
        self.host_paths: set[str] | None = None  # paths on the engine's host (None: all exist)
        self._volume_root: Path | None = None  # made on first use of a volume's files
        self.images = dict(images or {})  # reference → image id (what `docker images` has)
        self.pullable: dict[str, str] = {}  # reference → id a pull would fetch
        self.calls: list[tuple[str, str]] = []  # (method, what it was about), in order
        self.exec_results: dict[tuple[str, ...], list[tuple[int, str]]] = {}  # used in turn
        self.reload_errors: list[str] = []  # [emerg] lines nginx logs instead of reloading
        self.cpus = 16  # the engine's host's CPUs (docker info's NCPU)
        self.worker_log: list[str] = []  # lines nginx's new workers log (at start, each reload)
        # how much earlier than the container's StartedAt dockerd may stamp its first log lines
        # (its log copier can read them before it records the start)
        self.start_log_skew = 0.0
        self.helpers: dict[str, tuple[list[str], tuple[Mount, ...], bool]] = {}  # running ones
        self.helper_results: dict[str, tuple[int, str]] = {}  # helper name → (code, log)
        self.run_helpers = False  # True: an unscripted helper really runs here, binds rebased
        # a helper's `files` unpacked (its scratch root), its environment, its running process
        self.last_helper: dict[str, tuple[list[str], tuple[Mount, ...], bool]] = {}
        self.helper_roots: dict[str, Path] = {}
        self.helper_env: dict[str, dict[str, str]] = {}
        self.helper_runs: dict[str, subprocess.Popen] = {}
        # helper name → path → (mode, content) of its files
        self.helper_files: dict[str, dict[str, tuple[int, bytes]]] = {}
        # host port → why it does not answer (the engine's forwarder died); others answer
        self.dead_ports: dict[int, PortProblem] = {}
        self.knocked: list[tuple[str, int, str | None]] = []  # (address, port, TLS name)
        # host port → containers this engine runs outside any stack the test made (another
        # project's nginx): named by `publishers` along with the running containers here
        self.other_publishers: dict[int, list[str]] = {}
        # container id → {absolute path: content}: the files `archive` copies out of it
        self.container_files: dict[str, dict[str, bytes]] = {}
        self.archive_chunk = 1000  # bytes per chunk of an archive's stream (many, to reassemble)
        self._failures: dict[str, KitError] = {}
        self._local = local
        self._containers: dict[str, _Container] = {}
        self._networks: dict[str, dict] = {}
        self._volumes: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._pids = itertools.count(100)

    # ----------------------------------------------------------------- scripting

    def fail(self, method: str, error: KitError) -> None:
        """Every later call of `method` raises `error` (as the real adapter raises KitError)."""
        self._failures[method] = error

    def schedule(self, container: str, *, after: int, **state) -> None:
        """On its `after`-th inspection, the container's State takes these values, as if it
        happened meanwhile (an exit: Status="exited", Running=False, ExitCode=1; `restarts=1`
        also counts a restart by the engine's restart policy)."""
        self._get(container).scheduled.append((after, state))

    def set_health(self, container: str, status: str) -> None:
        self._get(container).attrs["State"]["Health"] = {"Status": status}

    def write_log(self, container: str, text: str) -> None:
        self._get(container).log += [(time.time(), line) for line in text.splitlines()]

    def names(self) -> list[str]:
        return sorted(c.attrs["Name"].lstrip("/") for c in self._containers.values())

    # ----------------------------------------------------------------- facts

    @property
    def is_local(self) -> bool:
        return self._local

    def containers(self, labels: list[str]) -> list[dict]:
        self._call("containers", ",".join(labels))
        return [
            self._observed(c) for c in self._containers.values()
            if _matches(c.attrs["Config"]["Labels"], labels)
        ]

    def inspect(self, container_id: str) -> dict:
        self._call("inspect", container_id)
        return self._observed(self._get(container_id))

    def networks(self, labels: list[str]) -> list[dict]:
        self._call("networks", ",".join(labels))
        return [copy.deepcopy(n) for n in self._networks.values() if _matches(n["Labels"], labels)]

    def volumes(self, labels: list[str]) -> list[dict]:
        self._call("volumes", ",".join(labels))
        return [copy.deepcopy(v) for v in self._volumes.values() if _matches(v["Labels"], labels)]

    def image_id(self, ref: str) -> str | None:
        self._call("image_id", ref)
        return self.images.get(ref)

    def knock(self, address: str, port: int, server_name: str | None) -> PortProblem | None:
        self.knocked.append((address, port, server_name))
        return self.dead_ports.get(port)

    def publishers(self, host_port: int) -> list[str]:
        self._call("publishers", str(host_port))
        return list(self.other_publishers.get(host_port, ())) + [
            c.attrs["Name"].lstrip("/") for c in self._containers.values()
            if c.attrs["State"]["Running"] and any(
                binding["HostPort"] == str(host_port)
                for bindings in c.attrs["HostConfig"]["PortBindings"].values()
                for binding in bindings
            )
        ]

    # ----------------------------------------------------------------- images

    def pull(self, ref: str) -> Iterator[dict]:
        self._call("pull", ref)
        if ref not in self.pullable:
            raise KitError(f"pulling image {ref} failed: manifest for {ref} not found")
        yield {"id": "layer1", "status": "Pull complete", "progressDetail": {}}
        self.images[ref] = self.pullable[ref]

    def save_image(self, ref: str) -> Iterator[bytes]:
        """A saved image shaped as `docker save` writes it: its config (named by the image's id)
        and manifest.json with the reference in RepoTags, in small chunks."""
        self._call("save_image", ref)
        if ref not in self.images:
            raise KitError(f"saving image {ref} failed: No such image: {ref}")
        saved = saved_image(self.images[ref], [ref])
        return iter([saved[i:i + 700] for i in range(0, len(saved), 700)])

    def load_images(self, stream: BinaryIO) -> list[str]:
        """As `docker load`: every tag of the archive's manifest.json points at its image."""
        self._call("load_images", "")
        try:
            with tarfile.open(fileobj=io.BytesIO(stream.read())) as archive:
                manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore
        except (tarfile.TarError, KeyError, ValueError):
            raise KitError("loading images failed: unexpected EOF") from None
        loaded = []
        for image in manifest:
            for tag in image["RepoTags"] or ():
                self.images[tag] = "sha256:" + image["Config"].removesuffix(".json")
                loaded.append(tag)
        return loaded

    # ----------------------------------------------------------------- networks, volumes

    def create_network(self, network: NetworkState) -> None:
        self._call("create_network", network.name)
        if network.name in self._networks:
            raise _api_error(f"creating network {network.name}", "network already exists")
        self._networks[network.name] = {
            "Name": network.name, "Internal": network.internal, "Labels": dict(network.labels),
            # as the engine lists it: the asked subnet, or one it picked
            "IPAM": {"Config": [{"Subnet": network.subnet or f"172.{18 + len(self._networks)}"
                                 ".0.0/16"}]},
        }

    def remove_network(self, name: str) -> None:
        self._call("remove_network", name)
        if any(name in c.attrs["NetworkSettings"]["Networks"] for c in self._containers.values()):
            raise _api_error(f"removing network {name}",  # as the engine refuses it
                             f"error while removing network: network {name} has active endpoints")
        self._networks.pop(name, None)

    def create_volume(self, volume: VolumeState) -> None:
        self._call("create_volume", volume.name)
        self._volumes[volume.name] = {"Name": volume.name, "Labels": dict(volume.labels)}

    def remove_volume(self, name: str) -> None:
        self._call("remove_volume", name)
        self._volumes.pop(name, None)

    # ----------------------------------------------------------------- containers

    def create_container(
        self, name: str, config: ContainerConfig, labels: dict[str, str], aliases: list[str]
    ) -> str:
        self._call("create_container", name)
        doing = f"creating container {name}"
        if any(c.attrs["Name"] == f"/{name}" for c in self._containers.values()):
            raise _api_error(doing, f'Conflict. The container name "/{name}" is already in use')
        if config.image not in self.images:
            raise _api_error(doing, f"No such image: {config.image}")
        missing = [n for n in config.networks if n not in self._networks]
        if missing:
            raise _api_error(doing, f"network {missing[0]} not found")
        container_id = f"{next(self._ids):064x}"
        self._containers[container_id] = _Container(
            attrs={
                "Id": container_id,
                "Name": f"/{name}",
                "Image": self.images[config.image],
                "RestartCount": 0,
                "Config": {"Image": config.image, "Labels": dict(labels)},
                "State": {"Status": "created", "Running": False, "ExitCode": 0,
                          "StartedAt": "0001-01-01T00:00:00Z"},
                "HostConfig": {
                    "DeviceRequests": [_device_request(gpu) for gpu in config.gpus] or None,
                    "PortBindings": {
                        f"{p.container_port}/{p.protocol}": [
                            {"HostIp": p.host_ip, "HostPort": str(p.host_port)}]
                        for p in config.ports
                    },
                    "RestartPolicy": {"Name": config.restart},
                    "NetworkMode": config.network_mode or next(iter(config.networks), "default"),
                    "IpcMode": config.ipc_mode or "private",
                    "ExtraHosts": list(config.extra_hosts) or None,
                },
                "NetworkSettings": {"Networks": {
                    n: {"Aliases": list(aliases), "IPAddress": config.address(n) or ""}
                    for n in config.networks}},
            },
            argv=[*(config.entrypoint or ()), *config.command],
            healthcheck=config.healthcheck is not None,
        )
        return container_id

    def connect_network(self, container_id: str, network: str, aliases: list[str],
                        ipv4_address: str | None = None) -> None:
        self._call("connect_network", f"{network}")
        if network not in self._networks:
            raise _api_error(f"connecting to {network}", f"network {network} not found")
        self._get(container_id).attrs["NetworkSettings"]["Networks"][network] = {
            "Aliases": list(aliases), "IPAddress": ipv4_address or ""}

    def disconnect_network(self, container_id: str, network: str) -> None:
        self._call("disconnect_network", f"{network}")
        self._get(container_id).attrs["NetworkSettings"]["Networks"].pop(network, None)

    def start(self, container_id: str) -> None:
        self._call("start", container_id)
        container = self._get(container_id)
        state = container.attrs["State"]
        state.update(Status="running", Running=True, ExitCode=0,
                     StartedAt=datetime.now(UTC).isoformat().replace("+00:00", "Z"))
        if container.healthcheck:
            state["Health"] = {"Status": "starting"}
        for bindings in container.attrs["HostConfig"]["PortBindings"].values():
            for binding in bindings:  # a start publishes its ports anew: they answer again
                self.dead_ports.pop(int(binding["HostPort"]), None)
        if container.argv and container.argv[0].rsplit("/", 1)[-1] == "nginx":
            container.processes = [(next(self._pids), "nginx: master process " +
                                    " ".join(container.argv)), (next(self._pids), NGINX_WORKER)]
            container.log += [(time.time() - self.start_log_skew, line)
                              for line in self.worker_log]
        else:
            container.processes = [(next(self._pids), " ".join(container.argv))]

    def stop(self, container_id: str) -> None:
        self._call("stop", container_id)
        container = self._get(container_id)
        container.attrs["State"].update(Status="exited", Running=False, ExitCode=0)
        container.processes = []

    def remove(self, container: str) -> None:
        self._call("remove", container)
        self._end_helper(container)
        found = self._find(container)
        if found is not None:
            del self._containers[found.attrs["Id"]]

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        self._call("exec", " ".join(argv))
        self._running(container_id, f"running {argv[0]} in container")
        return self._scripted_exec(argv)

    def archive(self, container_id: str, path: str) -> Iterator[bytes] | None:
        """`container_files` under `path` as the engine's tar stream (a file: its name; a folder:
        its name, then its files in name order), in `archive_chunk` byte chunks; None when
        nothing is there. Running or not, like `docker cp`."""
        self._call("archive", path)
        files = self.container_files.get(self._get(container_id).attrs["Id"], {})
        base = path.rstrip("/")
        name = base.rpartition("/")[2]
        members = {name: files[base]} if base in files else {
            f"{name}/{key[len(base) + 1:]}": content for key, content in sorted(files.items())
            if key.startswith(base + "/")}
        if not members:
            return None
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            if base not in files:
                folder = tarfile.TarInfo(name)
                folder.type = tarfile.DIRTYPE
                tar.addfile(folder)
            for member, content in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        stream = buffer.getvalue()
        return (stream[at:at + self.archive_chunk]
                for at in range(0, len(stream), self.archive_chunk))

    def signal(self, container_id: str, signal: str) -> None:
        self._call("signal", signal)
        container = self._running(container_id, f"sending {signal} to container")
        if signal != "SIGHUP" or not container.processes[0][1].startswith("nginx: master"):
            return
        if self.reload_errors:  # nginx logs why and keeps its old workers and config
            container.log.append((time.time(), self.reload_errors.pop(0)))
            return
        master = container.processes[0]
        container.processes = [master, (next(self._pids), NGINX_WORKER)]
        container.log.append((time.time(), "signal process started"))
        container.log += [(time.time(), line) for line in self.worker_log]

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        self._call("processes", container_id)
        return list(self._running(container_id, "listing the processes of container").processes)

    def log_since(self, container_id: str, since: float) -> str:
        self._call("log_since", container_id)
        return "".join(f"{line}\n" for at, line in self._get(container_id).log if at >= since)

    def log_tail(self, container_id: str, lines: int) -> str:
        self._call("log_tail", container_id)
        return "".join(f"{line}\n" for _, line in self._get(container_id).log[-lines:])

    def log_stream(self, container_id: str, *, follow: bool, tail: int | str) -> Iterator[bytes]:
        self._call("log_stream", container_id)
        if container_id in self.helpers and self.run_helpers:
            yield from self._run_helper(container_id)
            return
        log = self._get(container_id).log
        shown = log if tail == "all" else log[len(log) - int(tail):]
        yield from (f"{line}\n".encode() for _, line in shown)

    def check_device_request(self, name: str, image: str, gpus: tuple[GpuRequest, ...]) -> None:
        self._call("check_device_request", ",".join(i for g in gpus for i in g.device_ids))

    def host_cpus(self) -> int:
        self._call("host_cpus", str(self.cpus))
        return self.cpus

    def run_with_files(
        self, name: str, image: str, argv: list[str], volumes: dict[str, str],
        archive: bytes, labels: dict[str, str], timeout: float,
    ) -> tuple[int, str]:
        """Really runs `argv` on this host, with each volume a folder linked where the helper
        mounts it (absolute paths in argv are rebased into a scratch root)."""
        self._call("run_with_files", name)
        if image not in self.images:
            raise _api_error(f"creating container {name}", f"No such image: {image}")
        root = Path(tempfile.mkdtemp(prefix="fake-helper-"))
        try:
            for volume, target in volumes.items():
                if volume not in self._volumes:
                    raise _api_error(f"creating container {name}", f"no such volume {volume}")
                link = root / target.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(self.volume_path(volume), target_is_directory=True)
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(root, filter="fully_trusted")
            mounts = {t.split("/")[1] for t in volumes.values()}
            rebased = [arg.replace(f"/{m}/", f"{root}/{m}/") for arg in argv for m in mounts]
            done = subprocess.run(rebased, capture_output=True, text=True, timeout=timeout)
            return done.returncode, done.stdout + done.stderr
        finally:
            shutil.rmtree(root)

    def helper_start(self, name: str, image: str, argv: list[str], *,
                     binds: tuple[Mount, ...] = (), host_network: bool = False,
                     files: bytes | None = None, environment: dict[str, str] | None = None,
                     ) -> None:
        """Records the helper; its `files` (a tar) are kept by path with their modes
        (`helper_files`) and unpacked into a scratch root its argv is rebased into."""
        self._call("helper_start", name)
        if image not in self.images:
            raise _api_error(f"creating container {name}", f"No such image: {image}")
        self.helpers[name] = self.last_helper[name] = (argv, binds, host_network)
        self.helper_env[name] = dict(environment or {})
        if files is not None:
            root = Path(tempfile.mkdtemp(prefix="fake-helper-"))
            with tarfile.open(fileobj=io.BytesIO(files)) as tar:
                self.helper_files[name] = {
                    m.name: (m.mode, (tar.extractfile(m) or io.BytesIO()).read())
                    for m in tar.getmembers() if m.isfile()}
                tar.extractall(root, filter="fully_trusted")
            self.helper_roots[name] = root

    def helper_wait(self, name: str, timeout: float) -> tuple[int, str]:
        """The scripted result for this helper (`helper_results`); else, with `run_helpers`, its
        argv run on this host as the engine's host (each mount's target read as its source);
        else exit 0, no output."""
        self._call("helper_wait", name)
        if name not in self.helpers:
            raise _api_error(f"waiting for the helper container {name}",
                             f"No such container: {name}")
        try:
            if name in self.helper_results or not self.run_helpers:
                return self.helper_results.get(name, (0, ""))
            running = self.helper_runs.get(name)
            if running is None:
                output = b"".join(self._run_helper(name)).decode()
                return self.helper_runs[name].wait(timeout), output
            return running.wait(timeout), ""
        finally:
            self._end_helper(name)

    def _run_helper(self, name: str) -> Iterator[bytes]:
        """The helper's argv run on this host, its output as it comes (stdout and stderr)."""
        argv, binds, _ = self.helpers[name]
        root = self.helper_roots.get(name)
        tops = {"/" + p.name for p in root.iterdir()} if root else set()
        rebased = [next((self._host_source(m) + arg.removeprefix(m.target) for m in binds
                         if arg == m.target or arg.startswith(m.target + "/")),
                        next((f"{root}{arg}" for top in tops
                              if arg == top or arg.startswith(top + "/")), arg))
                   for arg in argv]
        process = subprocess.Popen(rebased, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env={**os.environ, **self.helper_env.get(name, {})})
        self.helper_runs[name] = process
        assert process.stdout is not None
        yield from process.stdout
        process.wait()

    def _host_source(self, mount: Mount) -> str:
        """Where a helper's mount is on this host: a bind's folder, a volume's files."""
        return str(self.volume_path(mount.source)) if mount.type == "volume" else mount.source

    def _end_helper(self, name: str) -> None:
        """A helper removed: its process killed, its scratch root deleted."""
        self.helpers.pop(name, None)
        process = self.helper_runs.pop(name, None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        root = self.helper_roots.pop(name, None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def bind_source_missing(self, name: str, image: str, mount: Mount) -> bool:
        self._call("bind_source_missing", mount.source)
        return self.host_paths is not None and mount.source not in self.host_paths

    def volume_path(self, name: str) -> Path:
        """The folder holding a volume's files (what a container mounting it sees)."""
        if self._volume_root is None:
            self._volume_root = Path(tempfile.mkdtemp(prefix="fake-engine-volumes-"))
        path = self._volume_root / name
        path.mkdir(exist_ok=True)
        return path

    # ----------------------------------------------------------------- internals

    def _scripted_exec(self, argv: list[str]) -> tuple[int, str]:
        """exec_results' next answer for argv (the last one repeats); (0, "") unscripted."""
        results = self.exec_results.get(tuple(argv), [(0, "")])
        return results.pop(0) if len(results) > 1 else results[0]

    def _call(self, method: str, about: str) -> None:
        self.calls.append((method, about))
        if method in self._failures:
            raise self._failures[method]

    def _find(self, container: str) -> _Container | None:
        return self._containers.get(container) or next(
            (c for c in self._containers.values() if c.attrs["Name"] == f"/{container}"), None)

    def _get(self, container: str) -> _Container:
        found = self._find(container)
        if found is None:
            raise _api_error(f"inspecting container {container}", f"No such container: {container}")
        return found

    def _running(self, container_id: str, doing: str) -> _Container:
        container = self._get(container_id)
        if not container.attrs["State"]["Running"]:
            raise _api_error(f"{doing} {container_id[:12]}",
                             f"Container {container_id} is not running")
        return container

    def _observed(self, container: _Container) -> dict:
        """Its inspect data now, after any scripted change that is due."""
        container.inspections += 1
        due = [state for after, state in container.scheduled if after <= container.inspections]
        container.scheduled = [(a, s) for a, s in container.scheduled
                               if a > container.inspections]
        for state in due:
            container.attrs["RestartCount"] += state.pop("restarts", 0)
            container.attrs["State"].update(state)
        return copy.deepcopy(container.attrs)


def _matches(labels: dict[str, str], wanted: list[str]) -> bool:
    for label in wanted:
        key, has_value, value = label.partition("=")
        if key not in labels or (has_value and labels[key] != value):
            return False
    return True


def _device_request(gpu: GpuRequest) -> dict:
    return {"Driver": gpu.driver, "DeviceIDs": list(gpu.device_ids),
            "Capabilities": [list(gpu.capabilities)]}


def _api_error(doing: str, text: str) -> KitError:
    """What kit.engine.docker_api.explain makes of an engine error it has no special words for."""
    return KitError(f"Docker engine: {doing} failed: {text}")


SERVED_IMAGES = ("vllm/vllm-openai:v0.33.0", "nginx:1.27-alpine")  # the spec's defaults


class HealthyEngine(FakeEngine):
    """Every container with a healthcheck reports healthy as soon as it starts."""

    def start(self, container_id: str) -> None:
        super().start(container_id)
        if self.inspect(container_id)["State"].get("Health"):
            self.set_health(container_id, "healthy")


def engine_with_images() -> HealthyEngine:
    """A remote HealthyEngine (no host bind or port checks) holding the spec's default images."""
    engine = HealthyEngine(local=False)
    for image in SERVED_IMAGES:
        engine.images[image] = f"sha256:{len(engine.images)}"
    return engine


class ReplicaEngine(HealthyEngine):
    """Containers healthy at start; each replica's vLLM answers the direct check as scripted."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        super().__init__(local=False)
        self.answers = answers  # container name → (exit code, curl's output) for its answer
        for image in SERVED_IMAGES:
            self.images[image] = f"sha256:{len(self.images)}"

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        if argv[:3] != ["sh", "-c", CURL]:
            return super().exec(container_id, argv)
        self._call("exec", argv[4])
        if argv[4].endswith("/health"):
            return 0, "\n200"
        if argv[4].endswith("/metrics"):  # nothing running or waiting: drained at once
            idle = 'vllm:num_requests_running{m="x"} 0.0\nvllm:num_requests_waiting{m="x"} 0.0'
            return 0, idle + "\n200"
        name = self.inspect(container_id)["Name"].lstrip("/")
        if argv[4].endswith("/v1/embeddings"):
            answer = {"data": [{"index": 0, "embedding": [0.5, -0.25]}],
                      "usage": {"prompt_tokens": 3, "total_tokens": 3}}
        else:
            answer = {"choices": [{"index": 0, "message": {"content": "OK"}}],
                      "usage": {"completion_tokens": 1}}
        return self.answers.get(name, (0, json.dumps(answer) + "\n200"))


class NodeEngine(FakeEngine):
    """A server's engine under a multi-node service: vLLM on the head (container `head`) turns
    healthy only once the worker's container runs on the worker's engine (vLLM serves after
    every node joined), every other container with a healthcheck at once."""

    def __init__(self, images: dict[str, str], *, head: str, worker_container: str,
                 worker: NodeEngine | None = None) -> None:
        super().__init__(images, local=False)
        self.head, self.worker_container, self.worker = head, worker_container, worker

    def start(self, container_id: str) -> None:
        super().start(container_id)
        head = self.inspect(container_id)["Name"] == f"/{self.head}"
        if self.inspect(container_id)["State"].get("Health") and not (
                head and not (self.worker and self.worker_container in self.worker.running())):
            self.set_health(container_id, "healthy")

    def running(self) -> list[str]:
        return [c["Name"].lstrip("/") for c in self.containers([]) if c["State"]["Running"]]


class ExecOnlyEngine(FakeEngine):
    """An engine read through exec alone (kit status's live figures ask Prometheus so): exec in
    one of `containers` answers from exec_results without a container made; others do not
    exist."""

    def __init__(self, *containers: str) -> None:
        super().__init__()
        self.exec_containers = set(containers)

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        self._call("exec", " ".join(argv))
        if container_id not in self.exec_containers:
            raise _api_error(f"running {argv[0]} in container {container_id}",
                             f"No such container: {container_id}")
        return self._scripted_exec(argv)


def saved_image(image_id: str, tags: list[str],
                extra: dict[str, bytes] | None = None) -> bytes:
    """A `docker save` archive as the engine writes it (the legacy layout of Docker 20.10: a
    config named by the image's id, one layer, manifest.json with RepoTags, last) and `extra`
    files added before manifest.json (a hostile repositories or index.json)."""
    config = f"{image_id.removeprefix('sha256:')}.json"
    files = {config: json.dumps({"id": image_id}).encode(), "layer/layer.tar": bytes(1024),
             **(extra or {}),
             "manifest.json": json.dumps([{"Config": config, "RepoTags": tags,
                                           "Layers": ["layer/layer.tar"]}]).encode()}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()
