"""kit up, down and status over a multi-node service against two fake engines (the head's
server and the worker's): workers start first and the head only becomes healthy once they run,
each cross-node preflight refusal starts nothing, a failing worker ends the wait with its own
diagnosis, and each node's engine comes from the spec or the fleet's sibling spec."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kit.engine.desired import PROJECT_LABEL
from kit.engine.observe import observe
from kit.errors import BadInput, KitError
from kit.nodes.worker_nodes import WorkerEngines, WorkerFailed, worker_nodes
from kit.site import Site
from kit.stack.up import up_site
from kit.views.logs import log_lines
from kit.views.status import gather, render_text
from tests.support.cli import run_kit
from tests.support.fake_engine import FakeEngine, NodeEngine
from tests.support.sites import MULTI_NODE

WORKER_URL = "ssh://ops@gpu02"
IMAGE, NGINX = "vllm/vllm-openai:v0.33.0", "nginx:1.27-alpine"
HEAD_CONTAINER, WORKER_CONTAINER = "test01-big-1", "test01-gpu02-big-1"
MODEL_FILES = "test01-big-1-kit-model-files"
LISTENER, PROBE = "test01-big-1-kit-port-listen", "test01-big-1-kit-port-probe"
HASHES = "1f2e  config.json\n"


@pytest.fixture
def multi(site: Path) -> Path:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE.replace(
        "{name: gpu02, address: 10.213.0.2}",
        f"{{name: gpu02, address: 10.213.0.2, engine: '{WORKER_URL}'}}"))
    return spec


@pytest.fixture
def engines() -> tuple[NodeEngine, NodeEngine]:
    worker = node()
    return node(worker), worker


def node(worker: NodeEngine | None = None) -> NodeEngine:
    """A server's engine holding the images, its helper reading the model folder's hashes."""
    engine = NodeEngine({IMAGE: "sha256:vllm", NGINX: "sha256:nginx"}, head=HEAD_CONTAINER,
                        worker_container=WORKER_CONTAINER, worker=worker)
    engine.helper_results[MODEL_FILES] = (0, HASHES)
    return engine


def up(spec: Path, engines: tuple[NodeEngine, NodeEngine], lines: list[str] | None = None):
    head, worker = engines
    reported = lines if lines is not None else []
    return up_site(Site.load(spec), timeout=5, probe=False, report=reported.append,
                   warn=reported.append, connect=lambda: head,
                   connect_node={WORKER_URL: worker}.__getitem__)


def creates(engine: FakeEngine) -> list[str]:
    return [about for method, about in engine.calls if method == "create_container"]


def test_up_starts_the_worker_on_its_engine_then_the_head_waits_for_it(
        multi: Path, engines: tuple[NodeEngine, NodeEngine]) -> None:
    head, worker = engines
    lines: list[str] = []
    result = up(multi, engines, lines)
    assert worker.names() == [WORKER_CONTAINER]
    attrs = worker.inspect(WORKER_CONTAINER)
    assert attrs["HostConfig"]["NetworkMode"] == "host" and attrs["HostConfig"]["IpcMode"] == "host"
    assert attrs["Config"]["Labels"][PROJECT_LABEL] == "test01-gpu02"
    argv = worker.processes(WORKER_CONTAINER)[0][1].split()
    assert argv[argv.index("--node-rank") + 1] == "1" and "--headless" in argv
    assert head.inspect(HEAD_CONTAINER)["HostConfig"]["NetworkMode"] == "host"
    assert head.inspect("test01-nginx-1")["HostConfig"]["ExtraHosts"] == ["big:10.213.0.1"]
    assert WORKER_CONTAINER not in head.names() and HEAD_CONTAINER not in worker.names()
    # preflight across the nodes, then the worker, then the head (healthy: the worker ran)
    order = [next(i for i, line in enumerate(lines) if text in line) for text in (
        "nodes test01, gpu02: same image and model files",
        "master port 10.213.0.1:29600 reachable from gpu02",
        f"node gpu02: create container {WORKER_CONTAINER}",
        f"create container {HEAD_CONTAINER}",
        "big healthy after",
    )]
    assert order == sorted(order)
    assert result.containers == len(Site.load(multi).desired.services) and result.workers == 1
    assert "container(s) healthy + 1 on worker node(s)" in result.summary()
    listener = [c for c in head.calls if c == ("helper_start", LISTENER)]
    probe = [c for c in worker.calls if c == ("helper_start", PROBE)]
    assert listener and probe and head.helpers == {} and worker.helpers == {}
    again = up(multi, engines)
    assert again.converged.actions == [] and again.summary().startswith("no change")


def test_status_shows_the_workers_per_node_and_down_removes_them(
        multi: Path, engines: tuple[NodeEngine, NodeEngine]) -> None:
    head, worker = engines
    up(multi, engines)
    site = Site.load(multi)
    status = gather(site, head, connect_node=lambda url: worker)
    now = datetime.now(UTC)
    text = render_text(status, now)
    assert "big (node gpu02)" in text and "running" in text
    assert f"node gpu02 ({WORKER_URL}): 1 of 1 worker container(s) running" in text
    assert "drift: none" in text
    (node,) = status.to_json(now)["nodes"]
    assert node["node"] == "gpu02" and node["containers"][0]["name"] == WORKER_CONTAINER
    assert status.node_problems == ()
    head.write_log(HEAD_CONTAINER, "RuntimeError: NCCL error: remote process exited or there "
                   "was a network error")
    worker.stop(worker.inspect(WORKER_CONTAINER)["Id"])
    stopped = gather(site, head, connect_node=lambda url: worker)
    assert stopped.drift == (
        f"node gpu02: start container {WORKER_CONTAINER}: exited (exit code 0)",)
    text = render_text(stopped, now)
    assert f"node gpu02 ({WORKER_URL}): 0 of 1 worker container(s) running" in text
    assert "multi-node: not serving; cause:" in text
    assert "spec key: services[].nodes" in text
    removed = WorkerEngines.connect(site, worker_nodes(site), lambda url: worker).stop(
        False, lambda line: None)
    assert removed == 1 and worker.names() == [] and HEAD_CONTAINER in head.names()


@pytest.mark.parametrize(("script", "words"), [
    (lambda head, worker: worker.images.update({IMAGE: "sha256:other"}),
     ["image vllm/vllm-openai:v0.33.0 differs between the nodes", "gpu02: sha256:other"]),
    (lambda head, worker: worker.helper_results.update({MODEL_FILES: (0, "9a9a  config.json\n")}),
     ["node gpu02 has other model files than the head test01", "config.json differ"]),
    (lambda head, worker: worker.helper_results.update({MODEL_FILES: (0, "")}),
     ["node gpu02: cannot read the model files of llama-8b"]),
    (lambda head, worker: worker.helper_results.update({PROBE: (1, "cannot connect: timed out")}),
     ["master port 10.213.0.1:29600 on the head test01 is not reachable from gpu02",
      "open TCP 29600"]),
    (lambda head, worker: head.helper_results.update({LISTENER: (3, "cannot listen: in use")}),
     ["the head test01 cannot listen on 10.213.0.1:29600"]),
])
def test_each_cross_node_preflight_refusal_starts_nothing(
        multi: Path, engines: tuple[NodeEngine, NodeEngine], script, words: list[str]) -> None:
    head, worker = engines
    script(head, worker)
    with pytest.raises(BadInput) as raised:
        up(multi, engines)
    for word in words:
        assert word in str(raised.value)
    assert creates(head) == [] and creates(worker) == []
    assert head.helpers == {} and worker.helpers == {}  # every helper collected


def fails_on_start(engine: NodeEngine, name: str, log: str, *, exits: bool = True) -> None:
    """Once started, the container `name` writes `log` and (`exits`) exits soon after, as
    vLLM does."""
    original = engine.start

    def start_then_exit(container_id: str) -> None:
        original(container_id)
        if engine.inspect(container_id)["Name"] == f"/{name}":
            engine.write_log(container_id, log)
            if exits:
                engine.schedule(container_id, after=3, Status="exited", Running=False,
                                ExitCode=1)

    engine.start = start_then_exit  # type: ignore[method-assign]


def test_a_worker_that_exits_ends_the_heads_wait_with_its_diagnosis(
        multi: Path, engines: tuple[NodeEngine, NodeEngine]) -> None:
    head, worker = engines
    fails_on_start(worker, WORKER_CONTAINER, "RuntimeError: [enforce fail at device.cc:83] "
                   "ifa != nullptr. Unable to find address for: veth-kit0")
    head.worker = None  # alone, the head never turns healthy
    with pytest.raises(WorkerFailed) as raised:
        up(multi, engines)
    message = str(raised.value)
    assert "worker node gpu02 of service big failed: its container exited (code 1)" in message
    assert f"log lines of {WORKER_CONTAINER} on node gpu02 ({WORKER_URL})" in message
    assert "spec key: services[].network_interface" in message


def test_a_head_that_fails_is_shown_with_the_workers_logs(
        multi: Path, engines: tuple[NodeEngine, NodeEngine]) -> None:
    head, worker = engines
    fails_on_start(head, HEAD_CONTAINER, "torch.distributed.DistStoreError: Timed out after "
                   "601 seconds waiting for clients. 1/2 clients joined.")
    fails_on_start(worker, WORKER_CONTAINER, "[W socket.cpp:755] [c10d] The client socket "
                   "has timed out after 600s while trying to connect to (10.213.0.1, 29600).",
                   exits=False)
    head.worker = None
    with pytest.raises(KitError) as raised:
        up(multi, engines)
    message = str(raised.value)
    assert "service big did not become healthy" in message
    assert "spec key: services[].nodes" in message  # the head's view: a node is missing
    assert f"log lines of {WORKER_CONTAINER} on node gpu02" in message
    assert "cause on node gpu02: this node could not reach 10.213.0.1:29600" in message
    assert raised.value.fix is not None and "open TCP 29600 on the head" in raised.value.fix


def test_a_nodes_engine_comes_from_its_sibling_spec_in_the_fleet(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE)
    sibling = site.parent / "gpu02" / "site.yaml"
    sibling.parent.mkdir()
    sibling.write_text(spec.read_text().split("services:")[0].replace("site: test01",
                                                                      "site: gpu02")
                       + "services:\n" + spec.read_text().split("services:")[1].split(
                           "  - name: big")[0])
    with pytest.raises(BadInput) as raised:
        worker_nodes(Site.load(spec))
    assert f"its sibling spec {sibling} sets no engine" in raised.value.message
    sibling.write_text(f"engine: {WORKER_URL}\n" + sibling.read_text())
    (worker,) = worker_nodes(Site.load(spec))
    assert (worker.name, worker.engine_url, worker.project) == ("gpu02", WORKER_URL,
                                                                "test01-gpu02")


def test_a_nodes_engine_is_checked_like_the_sites(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE.replace(
        "{name: gpu02, address: 10.213.0.2}",
        "{name: gpu02, address: 10.213.0.2, engine: 'tcp://10.213.0.2:2375'}"))
    result = run_kit("validate", spec)
    assert result.exit_code == 2
    assert "services[1].nodes[1].engine" in result.output
    assert "plain tcp:// engine is unauthenticated" in result.output


def test_logs_merge_the_head_and_the_workers_each_from_its_engine(
        multi: Path, engines: tuple[NodeEngine, NodeEngine]) -> None:
    head, worker = engines
    up(multi, engines)
    head.write_log(HEAD_CONTAINER, "All 2 nodes joined (world size 4)")
    worker.write_log(WORKER_CONTAINER, "joined the head as rank 1")
    sources = [(head, c, c.service) for c in observe(head, "test01").containers
               if c.service == "big"]
    sources += [(worker, c, f"{c.service}@gpu02")
                for c in observe(worker, "test01-gpu02").containers]
    lines = set(log_lines(sources, follow=False, tail="all"))
    assert lines == {"big       | All 2 nodes joined (world size 4)",
                     "big@gpu02 | joined the head as rank 1"}
