"""The only module that imports `docker`: kit's types in, plain data out, KitError on failure.

Every engine error becomes a KitError saying what failed and how to fix it; callers never see a
docker-py exception or object. `connect(url)` takes the engine's address (kit/engine/url.py: the
spec's `engine:`, else DOCKER_HOST, else the local socket). An ssh:// engine goes through
docker-py's SSH transport (kit/engine/ssh.py: host key checked, failures explained) with at most
MAX_CONCURRENT_CALLS API calls in flight per host; others as the docker CLI finds them
(DOCKER_TLS_VERIFY, DOCKER_CERT_PATH).
"""

import errno
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TextIO, cast

import docker
import docker.errors
import requests
from docker.types import DeviceRequest, IPAMConfig, IPAMPool, LogConfig, Mount, Ulimit

from kit.engine import ssh as ssh_engine
from kit.engine import url as engine_url
from kit.engine.desired import ContainerConfig, GpuRequest, NetworkState, VolumeState
from kit.engine.desired import Mount as MountState
from kit.engine.door_ports import PortProblem, knock
from kit.errors import KitError

if TYPE_CHECKING:  # docker-py imports paramiko for it: only on an ssh:// engine
    from docker.transport.sshconn import SSHHTTPAdapter

DEFAULT_HOST = engine_url.DEFAULT_HOST
# errno (None: an OSError without one) → what it means for the engine's address, in the
# operator's words
CONNECT_ERRORS: dict[int | None, str] = {
    errno.ENOENT: "there is no socket at that path",
    errno.EACCES: "permission denied on its socket (run as root or join the docker group)",
    errno.EPERM: "permission denied on its socket (run as root or join the docker group)",
    errno.ECONNREFUSED: "connection refused (nothing listens there)",
}
GPU_CHECK_ENTRYPOINT = "/kit-gpu-check-never-runs"  # exec fails after the GPU hook ran
PULL_REPORT_SECONDS = 5  # how often a non-terminal pull display prints a line
ARCHIVE_CHUNK = 256 * 1024  # bytes of a container's tar stream held at once (`archive`)


EXEC_EXIT_WAIT_S = 10  # how long an exec's exit may take to be recorded after its output ended
EXEC_EXIT_POLL_S = 0.02
EXEC_STREAMS = (0, 1, 2)  # the first byte of each frame of an exec's output: stdin, stdout, stderr


def demultiplexed(stream: bytes, what: str) -> bytes:
    """The payloads of a non-TTY exec's frames in order (stdout and stderr as the process
    interleaved them): each frame is an 8-byte header — its stream, three zero bytes, its size
    big-endian — and then that many bytes. A stream that breaks this is an error, never text."""
    output, at = bytearray(), 0
    while at < len(stream):
        header = stream[at:at + 8]
        size = int.from_bytes(header[4:], "big")
        if (len(header) < 8 or header[0] not in EXEC_STREAMS or header[1:4] != bytes(3)
                or at + 8 + size > len(stream)):
            raise KitError(f"the Docker engine's output of {what} is not framed as its API "
                           f"says at byte {at} of {len(stream)}",
                           fix="run the command again; if it persists, report the engine's "
                           "version (docker version)")
        output += stream[at + 8:at + 8 + size]
        at += 8 + size
    return bytes(output)


def engine_address() -> str:
    return engine_url.resolve(None)


def explain(error: Exception, doing: str, address: str | None = None) -> KitError:
    """A docker-py error → KitError with cause and fix (the mapping lives here, in one place)."""
    address = address or engine_address()
    text = _error_text(error)
    target = engine_url.ssh_target(address)
    if target is not None:
        cause = ssh_engine.explain(_ssh_cause(error), target, doing)
        if cause is not None:
            return cause
    if isinstance(error, requests.exceptions.ConnectionError) or (
        isinstance(error, docker.errors.DockerException)
        and not isinstance(error, docker.errors.APIError)
        and ("Connection" in text or "connect" in text or "API version" in text)
    ):
        os_error = _os_error(error)
        return KitError(
            f"cannot reach the Docker engine at {address} while {doing}: "
            + (CONNECT_ERRORS.get(os_error.errno, os_error.strerror or "no answer") if os_error
               else text),
            fix="is dockerd running? start it (systemctl start docker), or point "
            f"DOCKER_HOST at the engine (DOCKER_HOST={os.environ.get('DOCKER_HOST', '<unset>')})",
        )
    if 'could not select device driver "nvidia"' in text:
        return KitError(
            f"the Docker engine has no NVIDIA runtime, so it cannot give containers GPUs "
            f"({doing}: {text})",
            fix="install nvidia-container-toolkit, run `nvidia-ctk runtime configure "
            "--runtime=docker` and restart dockerd",
        )
    if "unknown device" in text or "invalid device ordinal" in text:
        return KitError(
            f"a GPU index the spec requests does not exist on this host ({doing}: {text})",
            fix="list the GPUs with `nvidia-smi -L` and fix services[].gpus in the spec",
        )
    if "port is already allocated" in text or "address already in use" in text:
        return KitError(
            f"a published port is already in use ({doing}: {text})",
            fix="stop what holds it, or change proxy.https_port / proxy.http_port in the spec",
        )
    return KitError(f"Docker engine: {doing} failed: {text}")


def _ssh_cause(error: BaseException) -> BaseException:
    """The paramiko exception docker-py or urllib3 wrapped, or `error` itself."""
    for inner in _causes(error):
        if type(inner).__module__.startswith("paramiko"):
            return inner
    return error


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen, todo = set(), [error]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = [current.__cause__, current.__context__, getattr(current, "reason", None),
                 *getattr(current, "args", ())]
        todo += [item for item in inner if isinstance(item, BaseException)]


def _os_error(error: BaseException) -> OSError | None:
    """The operating system's reason deep inside docker-py's and urllib3's wrappers."""
    return next(
        (e for e in _causes(error) if isinstance(e, OSError) and e.errno is not None), None
    )


def _error_text(error: Exception) -> str:
    if isinstance(error, docker.errors.APIError) and error.explanation:
        return str(error.explanation)
    return str(error)


@contextmanager
def _engine_errors(doing: str, address: str | None = None) -> Iterator[None]:
    try:
        yield
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise explain(error, doing, address) from None
    except Exception as error:  # paramiko's own, raised through urllib3 unwrapped
        target = engine_url.ssh_target(address or engine_address())
        mapped = ssh_engine.explain(error, target, doing) if target else None
        if mapped is None:
            raise
        raise mapped from None


class _Bounded:
    """The API client with at most `limit` calls in flight (one SSH session each)."""

    def __init__(self, api: docker.APIClient, limit: threading.BoundedSemaphore):
        self._api, self._limit = api, limit

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._limit:
                return method(*args, **kwargs)

        return call


_HOST_LIMITS: dict[str, threading.BoundedSemaphore] = {}  # ssh address → its call bound
_HOST_LIMITS_LOCK = threading.Lock()


def _host_limit(address: str) -> threading.BoundedSemaphore:
    """One bound per host, shared by every Engine of this process talking to it (a fleet)."""
    with _HOST_LIMITS_LOCK:
        return _HOST_LIMITS.setdefault(
            address, threading.BoundedSemaphore(ssh_engine.MAX_CONCURRENT_CALLS)
        )


class Engine:
    """A connected Docker engine, spoken to through kit's own types."""

    def __init__(self, api: docker.APIClient, address: str | None = None):
        self._api = api
        self.address = address or engine_address()

    def _errors(self, doing: str) -> AbstractContextManager[None]:
        return _engine_errors(doing, self.address)

    # ----------------------------------------------------------------- facts

    @property
    def is_local(self) -> bool:
        """The engine runs on this host (so host paths and ports here are its own)."""
        return engine_url.is_local(self.address)

    def host_cpus(self) -> int:
        """The CPUs the engine's host has (`docker info`'s NCPU: what `nproc` counts there)."""
        with self._errors("asking the engine about its host"):
            return int(self._api.info()["NCPU"])

    def containers(self, labels: list[str]) -> list[dict]:
        """Inspect data of every container (running or not) carrying all `labels`."""
        with self._errors("listing containers"):
            summaries = self._api.containers(all=True, filters={"label": labels})
            return [self._inspect_if_present(s["Id"]) for s in summaries if s]

    def _inspect_if_present(self, container_id: str) -> dict:
        try:
            return self._api.inspect_container(container_id)
        except docker.errors.NotFound:
            return {}  # removed between the listing and the inspect

    def inspect(self, container_id: str) -> dict:
        with self._errors(f"inspecting container {_short(container_id)}"):
            return self._api.inspect_container(container_id)

    def networks(self, labels: list[str]) -> list[dict]:
        with self._errors("listing networks"):
            return self._api.networks(filters={"label": labels} if labels else None)

    def volumes(self, labels: list[str]) -> list[dict]:
        with self._errors("listing volumes"):
            return self._api.volumes(filters={"label": labels}).get("Volumes") or []

    def image_id(self, ref: str) -> str | None:
        """The local image's ID for `ref`, or None when the engine does not have it."""
        with self._errors(f"looking up image {ref}"):
            try:
                return self._api.inspect_image(ref)["Id"]
            except docker.errors.ImageNotFound:
                return None

    def knock(self, address: str, port: int, server_name: str | None) -> PortProblem | None:
        """Whether a port this engine publishes answers from here: its port forwarding is the
        engine's (kit/engine/door_ports.py knocks; None: it answered)."""
        return knock(address, port, server_name)

    def publishers(self, host_port: int) -> list[str]:
        """Names of containers publishing `host_port`."""
        with self._errors(f"looking for containers publishing port {host_port}"):
            found = self._api.containers(all=False, filters={"publish": str(host_port)})
            return [name.lstrip("/") for c in found for name in c.get("Names", [])[:1]]

    # ----------------------------------------------------------------- images

    def pull(self, ref: str) -> Iterator[dict]:
        """Pull `ref`, yielding the engine's progress events ({id, status, progressDetail})."""
        with self._errors(f"pulling image {ref}"):
            for event in self._api.pull(ref, stream=True, decode=True):
                if "error" in event:
                    raise KitError(f"pulling image {ref} failed: {event['error']}")
                yield event

    def save_image(self, ref: str) -> Iterator[bytes]:
        """`docker save REF`: the image as a tar stream (its tag kept), in chunks."""
        doing = f"saving image {ref}"
        with self._errors(doing):
            stream = self._api.get_image(ref, chunk_size=ARCHIVE_CHUNK)
        return self._chunks(stream, doing)

    def load_images(self, stream: BinaryIO) -> list[str]:
        """`docker load` of the tar `stream` (read as it is sent, never held whole); the
        references the engine says it loaded."""
        loaded = []
        with self._errors("loading images"):
            for event in self._api.load_image(stream, quiet=True):
                if "error" in event:
                    raise KitError(f"loading images failed: {event['error']}")
                said = str(event.get("stream", ""))
                if said.startswith("Loaded image"):
                    loaded.append(said.split(":", 1)[1].strip())
        return loaded

    # ----------------------------------------------------------------- networks, volumes

    def create_network(self, network: NetworkState) -> None:
        with self._errors(f"creating network {network.name}"):
            pools = [IPAMPool(subnet=network.subnet, gateway=network.gateway)]
            self._api.create_network(
                network.name, driver="bridge", internal=network.internal, labels=network.labels,
                ipam=IPAMConfig(pool_configs=pools) if network.subnet else None,
            )

    def remove_network(self, name: str) -> None:
        with self._errors(f"removing network {name}"), suppress(docker.errors.NotFound):
            self._api.remove_network(name)

    def create_volume(self, volume: VolumeState) -> None:
        with self._errors(f"creating volume {volume.name}"):
            self._api.create_volume(volume.name, driver="local", labels=volume.labels)

    def remove_volume(self, name: str) -> None:
        with self._errors(f"removing volume {name}"), suppress(docker.errors.NotFound):
            self._api.remove_volume(name)

    # ----------------------------------------------------------------- containers

    def create_container(
        self, name: str, config: ContainerConfig, labels: dict[str, str], aliases: list[str]
    ) -> str:
        """Create (not start) a container exactly as `config` says; returns its id.

        Engine API 1.41 attaches one network at create; the others are connected before start.
        On host networking (a multi-node service's node) there is no network to attach.
        """
        first: str | None
        others: list[str]
        if config.networks:
            first, *others = config.networks
        else:
            first, others = config.network_mode, []
        endpoints = {} if config.network_mode else {
            first: self._api.create_endpoint_config(  # first is None: no address either
                aliases=aliases, ipv4_address=config.address(first) if first is not None else None)}
        with self._errors(f"creating container {name}"):
            response = self._api.create_container(
                image=config.image,
                entrypoint=list(config.entrypoint) if config.entrypoint is not None else None,
                command=list(config.command),
                name=name,
                environment=[f"{key}={value}" for key, value in config.environment],
                labels=labels,
                ports=[(p.container_port, p.protocol) for p in config.ports],
                healthcheck=_healthcheck(config),
                stop_signal=config.stop_signal,
                stop_timeout=config.stop_timeout,
                host_config=self._api.create_host_config(**_host_config(config, first)),
                # types-docker types the argument as one EndpointConfig; docker-py takes (and
                # documents) a {network name: EndpointConfig} dict
                networking_config=self._api.create_networking_config(endpoints),  # type: ignore[arg-type]
            )
            container_id = response["Id"]
            for network in others:
                self._api.connect_container_to_network(
                    container_id, network, aliases=aliases, ipv4_address=config.address(network))
            return container_id

    def connect_network(self, container_id: str, network: str, aliases: list[str],
                        ipv4_address: str | None = None) -> None:
        """Attach a running container to one more network (the front door to a new service's)."""
        with self._errors(f"connecting container {_short(container_id)} to {network}"):
            self._api.connect_container_to_network(container_id, network, aliases=aliases,
                                                   ipv4_address=ipv4_address)

    def disconnect_network(self, container_id: str, network: str) -> None:
        with self._errors(f"disconnecting container {_short(container_id)} from {network}"):
            self._api.disconnect_container_from_network(container_id, network)

    def start(self, container_id: str) -> None:
        with self._errors(f"starting container {_short(container_id)}"):
            self._api.start(container_id)

    def stop(self, container_id: str) -> None:
        """Stop with the container's own stop signal and grace period."""
        with self._errors(f"stopping container {_short(container_id)}"):
            self._api.stop(container_id)

    def remove(self, container: str) -> None:
        """Remove a container (by id or name) that may be running; absent is fine."""
        doing = f"removing container {_short(container)}"
        with self._errors(doing), suppress(docker.errors.NotFound):
            self._api.remove_container(container, force=True)

    def exec(self, container_id: str, argv: list[str]) -> tuple[int, str]:
        """Run `argv` in the container; (exit code, combined output)."""
        with self._errors(f"running {argv[0]} in container {_short(container_id)}"):
            exec_id = self._api.exec_create(container_id, argv)["Id"]
            output = self._exec_output(exec_id)
            return self._exec_exit_code(exec_id), output.decode(errors="replace")

    def _exec_exit_code(self, exec_id: str) -> int:
        """The exec's exit code, asked until the engine has recorded it: its output can end
        before the engine processed the exit (moby#19607: inspect then says Running, no code)."""
        deadline = time.monotonic() + EXEC_EXIT_WAIT_S
        while (state := self._api.exec_inspect(exec_id))["Running"] or state["ExitCode"] is None:
            if time.monotonic() > deadline:
                raise KitError(f"the Docker engine did not record the exit of exec {exec_id[:12]} "
                               f"{EXEC_EXIT_WAIT_S} s after its output ended",
                               fix="run the command again; if it persists, check dockerd's log")
            time.sleep(EXEC_EXIT_POLL_S)
        return int(state["ExitCode"])

    def _exec_output(self, exec_id: str) -> bytes:
        """The exec's output, read through the HTTP response to its start: docker-py's
        exec_start reads the socket beneath it, past the bytes http.client already buffered
        with the headers — under load an exec's output came back empty or misframed. Without
        an Upgrade header the engine answers 200 and streams until the process ends. Over
        ssh:// (docker system dial-stdio) the engine answered such a start with exit 126 and no
        output: there the exec is started as docker-py does, as before."""
        if engine_url.ssh_target(self.address) is not None:
            return self._api.exec_start(exec_id)
        url = f"{self._api.base_url}/v{self._api.api_version}/exec/{exec_id}/start"
        response = self._api.post(url, json={"Detach": False, "Tty": False}, stream=True,
                                  timeout=self._api.timeout)
        with closing(response):
            try:
                response.raise_for_status()
            except requests.exceptions.HTTPError as error:
                raise docker.errors.create_api_error_from_http_exception(error) from error
            return demultiplexed(response.raw.read(), f"exec {exec_id[:12]}")

    def archive(self, container_id: str, path: str) -> Iterator[bytes] | None:
        """The tar stream of `path` in the container, in chunks of at most ARCHIVE_CHUNK bytes
        (`docker cp`: a stopped container's files too, nothing runs in it); None when the path
        does not exist there. The stream is read as it is consumed, never held whole."""
        doing = f"reading {path} from container {_short(container_id)}"
        with self._errors(doing):
            try:
                stream, _ = self._api.get_archive(container_id, path, chunk_size=ARCHIVE_CHUNK)
            except docker.errors.NotFound as error:
                if "No such container" in _error_text(error):
                    raise
                return None
        return self._chunks(stream, doing)

    def _chunks(self, stream: Iterator[bytes], doing: str) -> Iterator[bytes]:
        with self._errors(doing):
            yield from stream

    def signal(self, container_id: str, signal: str) -> None:
        with self._errors(f"sending {signal} to container {_short(container_id)}"):
            self._api.kill(container_id, signal=signal)

    def processes(self, container_id: str) -> list[tuple[int, str]]:
        """(pid, command line) of every process in the container, as the host sees them."""
        with self._errors(f"listing the processes of container {_short(container_id)}"):
            top = self._api.top(container_id)
        pid, command = top["Titles"].index("PID"), top["Titles"].index("CMD")
        return [(int(row[pid]), row[command]) for row in top["Processes"] or ()]

    def log_since(self, container_id: str, since: float) -> str:
        """The log lines written since `since` (a Unix time)."""
        with self._errors(f"reading the log of container {_short(container_id)}"):
            return self._api.logs(container_id, since=since).decode(errors="replace")

    def log_tail(self, container_id: str, lines: int) -> str:
        with self._errors(f"reading the log of container {_short(container_id)}"):
            return self._api.logs(container_id, tail=lines).decode(errors="replace")

    def log_stream(self, container_id: str, *, follow: bool, tail: int | Literal["all"]
                   ) -> Iterator[bytes]:
        """The container's log as it arrives (stdout and stderr interleaved)."""
        with self._errors(f"reading the log of container {_short(container_id)}"):
            yield from self._api.logs(container_id, stream=True, follow=follow, tail=tail)

    def check_device_request(self, name: str, image: str, gpus: tuple[GpuRequest, ...]) -> None:
        """Prove the engine can give these GPUs: start a throwaway container asking for them.

        The engine picks the device driver, then the NVIDIA hook checks the device ids, before
        the entrypoint runs; the entrypoint does not exist, so nothing runs. Only a device error
        counts, and it is raised as the KitError `explain` maps it to. The container has a fixed
        name so one left behind by an interrupted check is replaced, not accumulated.
        """
        self.remove(name)
        try:
            with self._errors("checking the engine's GPU support"):
                self._api.create_container(
                    image=image,
                    name=name,
                    entrypoint=[GPU_CHECK_ENTRYPOINT],
                    host_config=self._api.create_host_config(
                        network_mode="none", device_requests=_device_requests(gpus)
                    ),
                )
            try:
                self._api.start(name)
            except docker.errors.APIError as error:
                mapped = explain(error, "checking the engine's GPU support", self.address)
                if mapped.fix is not None:  # a device (or other understood) failure
                    raise mapped from None
        finally:
            self.remove(name)


    # ----------------------------------------------------------------- the engine's own host

    def run_with_files(
        self, name: str, image: str, argv: list[str], volumes: dict[str, str],
        archive: bytes, labels: dict[str, str], timeout: float,
    ) -> tuple[int, str]:
        """Run `argv` once in a throwaway container with `volumes` (volume → mount path) and
        the tar `archive` unpacked at / first; (exit code, its log). The archive goes in
        before the start (the engine copies into a created container), so the files reach
        the engine's host through the API alone. A fixed name: a leftover is replaced."""
        self.remove(name)
        try:
            with self._errors(f"running {argv[0]} in a helper container {name}"):
                self._api.create_container(
                    image=image, name=name, entrypoint=argv[:1], command=argv[1:], user="0:0",
                    labels=labels, host_config=self._api.create_host_config(
                        network_mode="none",
                        mounts=[Mount(target, source, type="volume")
                                for source, target in volumes.items()],
                    ),
                )
                self._api.put_archive(name, "/", archive)
                self._api.start(name)
                # types-docker: int; docker-py hands it to requests, which takes float seconds
                code = self._api.wait(name, timeout=timeout)["StatusCode"]  # type: ignore[arg-type]
                return code, self._api.logs(name).decode(errors="replace")
        finally:
            self.remove(name)

    def helper_start(self, name: str, image: str, argv: list[str], *,
                     binds: tuple[MountState, ...] = (), host_network: bool = False,
                     files: bytes | None = None, environment: dict[str, str] | None = None,
                     ) -> None:
        """Start `argv` in a throwaway container (a fixed name: a leftover is replaced) with
        `binds` (host folders, or named volumes the engine makes when missing; read-only unless
        a mount says otherwise), on the host's network or none, with
        the tar `files` unpacked at / before it starts (secrets go this way: `docker inspect`
        shows the environment, not the files); `helper_wait` collects it."""
        self.remove(name)
        with self._errors(f"starting a helper container {name}"):
            self._api.create_container(
                image=image, name=name, entrypoint=argv[:1], command=argv[1:],
                environment=[f"{key}={value}" for key, value in (environment or {}).items()],
                host_config=self._api.create_host_config(
                    network_mode="host" if host_network else "none",
                    mounts=[Mount(m.target, m.source, type=m.type, read_only=m.read_only)
                            for m in binds],
                ),
            )
            if files is not None:
                self._api.put_archive(name, "/", files)
            self._api.start(name)

    def helper_wait(self, name: str, timeout: float) -> tuple[int, str]:
        """(exit code, log) of a helper once it ends; it is removed either way."""
        try:
            with self._errors(f"waiting for the helper container {name}"):
                # types-docker: int; docker-py hands it to requests, which takes float seconds
                code = self._api.wait(name, timeout=timeout)["StatusCode"]  # type: ignore[arg-type]
                return code, self._api.logs(name).decode(errors="replace")
        finally:
            self.remove(name)

    def bind_source_missing(self, name: str, image: str, mount: MountState) -> bool:
        """Whether `mount.source` is missing on the engine's host: a container binding it is
        created (never started) and removed; the engine refuses a bind of a missing path."""
        self.remove(name)
        try:
            with self._errors(f"checking {mount.source} on the engine's host"):
                self._api.create_container(
                    image=image, name=name, entrypoint=[GPU_CHECK_ENTRYPOINT],
                    host_config=self._api.create_host_config(
                        network_mode="none",
                        mounts=[Mount(mount.target, mount.source, type="bind", read_only=True)],
                    ),
                )
            return False
        except KitError as error:
            if "bind source path does not exist" in error.message:
                return True
            raise
        finally:
            self.remove(name)


def connect(url: str | None = None) -> Engine:
    """Connect to the engine at `url` (None: DOCKER_HOST or the local socket) and make sure it
    answers. ssh://: paramiko checks the host key against ~/.ssh/known_hosts first."""
    address = url or engine_address()
    target = engine_url.ssh_target(address)
    if target is None:
        with _engine_errors("connecting", address):  # DOCKER_HOST's: with DOCKER_TLS_* too
            client = (docker.from_env() if address == engine_address()
                      else docker.DockerClient(base_url=address))
            client.ping()
        return Engine(client.api, address)
    ssh_engine.require_paramiko()
    ssh_engine.check_reachable(target)
    with _engine_errors("connecting over SSH", address):
        api = docker.APIClient(base_url=target.url, use_ssh_client=False,
                               max_pool_size=ssh_engine.MAX_CONCURRENT_CALLS,
                               version=ssh_engine.API_VERSION)
    _one_pool(api)
    try:
        api.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        ssh_failure = ssh_engine.explain(_ssh_cause(error), target, "connecting over SSH")
        if ssh_failure is not None:
            raise ssh_failure from None
        raise ssh_engine.no_docker(_ssh_client(api), target, _error_text(error)) from None
    return Engine(_Bounded(api, _host_limit(target.url)), address)  # type: ignore[arg-type]


def _one_pool(api: docker.APIClient) -> None:
    """One connection pool for every API path of the host.

    docker-py's SSH adapter keys its pools by the full request URL, so each new path
    (/containers/json, /containers/<id>/json, /networks, …) opened one more SSH session and
    one more `docker system dial-stdio` on the server (~0.3 s each); sharing one pool reuses
    the open sessions, at most MAX_CONCURRENT_CALLS of them.
    """
    adapter = cast("SSHHTTPAdapter", api.get_adapter("http+docker://ssh"))
    per_url = adapter.get_connection
    # replacing the bound method on this one adapter is the point (mypy forbids it by default)
    adapter.get_connection = lambda url, proxies=None: per_url(  # type: ignore[method-assign]
        "http+docker://ssh/", proxies)


def _ssh_client(api: docker.APIClient) -> Any:
    """The paramiko client docker-py's SSH adapter holds (for the no-docker diagnosis)."""
    return cast("SSHHTTPAdapter", api.get_adapter("http+docker://ssh")).ssh_client


def _short(container: str) -> str:
    """A container id as the docker CLI shows it (12 characters); names stay whole."""
    return container[:12] if len(container) == 64 else container


def _healthcheck(config: ContainerConfig) -> dict | None:
    check = config.healthcheck
    if check is None:
        return None
    return {
        "test": list(check.test),
        "interval": _nanoseconds(check.interval),
        "timeout": _nanoseconds(check.timeout),
        "retries": check.retries,
        "start_period": _nanoseconds(check.start_period),
    }


def _nanoseconds(seconds: float) -> int:
    return int(round(seconds * 1_000_000_000))


def _device_requests(gpus: tuple[GpuRequest, ...]) -> list[DeviceRequest]:
    return [
        DeviceRequest(
            driver=gpu.driver,
            device_ids=list(gpu.device_ids),
            capabilities=[list(gpu.capabilities)],
        )
        for gpu in gpus
    ]


def _host_config(config: ContainerConfig, network: str | None) -> dict[str, Any]:
    return {
        "mounts": [
            Mount(m.target, m.source, type=m.type, read_only=m.read_only) for m in config.mounts
        ],
        "tmpfs": {path: "" for path in config.tmpfs},
        "read_only": config.read_only or None,
        "security_opt": list(config.security_opt) or None,
        "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, s, h in config.ulimits] or None,
        "ipc_mode": config.ipc_mode,
        "device_requests": _device_requests(config.gpus) or None,
        "restart_policy": {"Name": config.restart} if config.restart != "no" else None,
        "log_config": LogConfig(type=config.log_driver, config=dict(config.log_options)),
        "port_bindings": {
            f"{p.container_port}/{p.protocol}": (p.host_ip, p.host_port) for p in config.ports
        },
        "network_mode": network,
        "extra_hosts": list(config.extra_hosts) or None,
    }


def show_pull(image: str, events: Iterator[dict], stream: TextIO | None = None) -> None:
    """One line of layer progress, redrawn on a terminal, every few seconds otherwise."""
    stream = stream or sys.stderr
    layers: dict[str, tuple[int, int]] = {}
    done: set[str] = set()
    shown = 0.0
    for event in events:
        layer, detail = event.get("id"), event.get("progressDetail") or {}
        if layer and detail.get("total"):
            layers[layer] = (detail.get("current", 0), detail["total"])
        if layer and event.get("status") in ("Pull complete", "Already exists"):
            done.add(layer)
        current = sum(c for c, _ in layers.values()) / 1e6
        total = sum(t for _, t in layers.values()) / 1e6
        line = f"  pulling {image}: {len(done)} layer(s) done, {current:.0f}/{total:.0f} MB"
        if stream.isatty():
            stream.write(f"\r\x1b[2K{line}")
        elif time.monotonic() - shown >= PULL_REPORT_SECONDS:
            stream.write(line + "\n")
            shown = time.monotonic()
    stream.write("\n" if stream.isatty() else "")
