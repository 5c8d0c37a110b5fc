"""Before a multi-node service starts: what every node must share, checked through the engines.

Each node's own engine preflight (kit/converge/preflight.py: folders, image, GPUs) runs first; then
across the nodes, with throwaway containers of the service's image (python3 is in vLLM's):

- the same image: its id (the digest of its config) on every node's engine;
- the same model files: sha256 of config.json and every *.index.json of the model folder, read on
  each node through a container that binds the node's models folder;
- the master port reachable from every worker: a listener on the head's host network at
  <head address>:<master_port>, and a connection to it from each worker's host network (only
  when the head is about to start: a running head holds that port itself).

A failure is BadInput (exit 2) naming the node, the cause and the fix, and nothing was started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.engine.desired import Mount, ServiceState
from kit.errors import BadInput
from kit.plan.build import MODELS_MOUNT
from kit.plan.host import model_below

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine

HELPER_TIMEOUT_S = 60
LISTEN_S = 20  # how long the head's listener waits for every worker's connection
CONNECT_S = 10  # how long a worker keeps trying to reach it
# argv[1]: the model folder. Prints "<sha256>  <file>" for config.json and the weights indexes.
HASH_FILES = """import glob, hashlib, os, sys
os.chdir(sys.argv[1])
for name in sorted({"config.json", *glob.glob("*.index.json")}):
    if os.path.isfile(name):
        print(hashlib.sha256(open(name, "rb").read()).hexdigest(), name)
"""
# argv[1:5]: address, port, connections expected, seconds. Exit 3: cannot bind; 4: not all came.
LISTEN = """import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind((sys.argv[1], int(sys.argv[2])))
except OSError as error:
    print("cannot listen:", error); sys.exit(3)
server.listen(16)
server.settimeout(float(sys.argv[4]))
for _ in range(int(sys.argv[3])):
    try:
        server.accept()[0].close()
    except OSError:
        print("not every node connected"); sys.exit(4)
print("every node connected")
"""
# argv[1:4]: address, port, seconds to keep trying; exit 1 with the last error.
CONNECT = """import socket, sys, time
deadline = time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
        print("connected"); break
    except OSError as error:
        if time.monotonic() > deadline:
            print("cannot connect:", error); sys.exit(1)
        time.sleep(0.3)
"""

Node = tuple[str, "Engine"]  # (node name, its engine)


@dataclass(frozen=True)
class WorkerNode:
    """One worker node of the site's multi-node service and where kit reaches it."""

    service: str
    name: str
    engine_url: str
    project: str  # its compose project: <site>-<name>
    compose_file: Path  # compose/node-<name>.yml of the site folder


def check_nodes(head: Node, workers: list[tuple[WorkerNode, Engine]], service: ServiceState,
                *, head_starts: bool, report: Callable[[str], None]) -> None:
    """Image, model files and (when the head starts) the master port, across every node."""
    nodes = [head, *((w.name, e) for w, e in workers)]
    image = service.config.image
    check_same_image(nodes, image)
    check_same_model_files(nodes, service)
    report(f"nodes {', '.join(n for n, _ in nodes)}: same image and model files")
    if head_starts and workers:
        head_address, port = _master(service)
        check_master_port(head, workers, image, head_address, port, service.container_name)
        report(f"master port {head_address}:{port} reachable from "
               f"{', '.join(w.name for w, _ in workers)} (service {service.name})")


def check_same_image(nodes: list[Node], image: str) -> None:
    ids = {name: engine.image_id(image) for name, engine in nodes}
    if len(set(ids.values())) > 1:
        seen = ", ".join(f"{name}: {(found or 'missing')[:19]}" for name, found in ids.items())
        raise BadInput(
            f"image {image} differs between the nodes ({seen}); every node must run the same "
            "vLLM build",
            fix=f"load the head's image on every node (docker save {image} | ssh <node> docker "
            "load), or pin images.vllm to a digest",
        )


def check_same_model_files(nodes: list[Node], service: ServiceState) -> None:
    models = next(m for m in service.config.mounts if m.target == MODELS_MOUNT)
    model = model_below(service, MODELS_MOUNT)
    if model is None:  # a hub model: each node downloads it into its own cache
        return
    folder = f"{MODELS_MOUNT}/{model}"
    found: dict[str, dict[str, str]] = {}
    for name, engine in nodes:
        helper = f"{service.container_name}-kit-model-files"
        engine.helper_start(helper, service.config.image, ["python3", "-c", HASH_FILES, folder],
                            binds=(Mount("bind", models.source, MODELS_MOUNT, True),))
        code, log = engine.helper_wait(helper, HELPER_TIMEOUT_S)
        if code != 0 or not log.strip():
            raise BadInput(
                f"node {name}: cannot read the model files of {model} under {models.source} "
                f"(exit {code}): {log.strip()[-300:] or 'no config.json there'}",
                fix=f"copy the model folder to {models.source}/{model} on {name}",
            )
        found[name] = {
            path: digest
            for digest, path in (line.split(None, 1) for line in log.strip().splitlines())
        }
    head_name, reference = next(iter(found.items()))
    for name, files in found.items():
        differ = sorted(f for f in reference.keys() | files.keys()
                        if reference.get(f) != files.get(f))
        if differ:
            raise BadInput(
                f"node {name} has other model files than the head {head_name} for {model}: "
                f"{', '.join(differ)} differ (sha256)",
                fix=f"copy the head's {models.source}/{model} to {name} (e.g. rsync -a)",
            )


def check_master_port(head: Node, workers: list[tuple[WorkerNode, Engine]], image: str,
                      address: str, port: int, prefix: str) -> None:
    head_name, head_engine = head
    listener = f"{prefix}-kit-port-listen"
    head_engine.helper_start(listener, image, ["python3", "-c", LISTEN, address, str(port),
                                               str(len(workers)), str(LISTEN_S)],
                             host_network=True)
    failures = []
    try:
        for worker, engine in workers:
            probe = f"{prefix}-kit-port-probe"
            engine.helper_start(probe, image, ["python3", "-c", CONNECT, address, str(port),
                                        str(CONNECT_S)],
                                host_network=True)
            code, log = engine.helper_wait(probe, HELPER_TIMEOUT_S)
            if code != 0:
                failures.append(f"{worker.name}: {log.strip()[-200:] or f'exit {code}'}")
    finally:
        code, log = head_engine.helper_wait(listener, HELPER_TIMEOUT_S)
    if code == 3:
        raise BadInput(
            f"the head {head_name} cannot listen on {address}:{port}: {log.strip()[-200:]}",
            fix="stop what holds that port on the head, set master_port to a free port, or fix "
            "nodes[0].address (it must be an address of the head)",
        )
    if failures:
        raise BadInput(
            f"master port {address}:{port} on the head {head_name} is not reachable from "
            f"{'; '.join(failures)}",
            fix=f"open TCP {port} on the head to the workers (firewall), or set master_port to "
            "a port they can reach",
        )


def _master(service: ServiceState) -> tuple[str, int]:
    """--master-addr and --master-port of the head's argv (one source: what vLLM is given)."""
    address, port = service.argument("--master-addr"), service.argument("--master-port")
    assert address is not None and port is not None, "kit renders both for every node"
    return address, int(port)
