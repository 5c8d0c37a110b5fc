"""The stand-in's multi-node mode: inconsistent flags refused as vLLM refuses them, the head ready
only once every node joined (with the argv kit renders for each node), and each multi-node
failure printing what kit.converge.diagnose recognises."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit.converge.diagnose import diagnose
from tests.support.cli import run_kit
from tests.support.docker_engine import pick_free_port
from tests.support.sites import MULTI_NODE
from tests.support.standin_process import (
    LLAMA_8B,
    STANDIN,
    model_dir,
    run_standin,
    standin_env,
    wait_listening,
)


def node(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(STANDIN / "vllm"), "serve", *args],
                            env=standin_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 10) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = proc.stdout.read()
    proc.stdout.close()
    return code, output


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def two_nodes(model: Path, master: int, api: int) -> tuple[list[str], list[str]]:
    common = [str(model), "--max-model-len", "4096", "--pipeline-parallel-size", "2",
              "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master)]
    return ([*common, "--node-rank", "0", "--port", str(api), "--host", "127.0.0.1"],
            [*common, "--node-rank", "1", "--headless"])


@pytest.mark.parametrize(("args", "text"), [
    (["--nnodes", "2", "--node-rank", "2", "--headless"],
     "node_rank (2) must be in [0, nnodes) with nnodes=2."),
    (["--nnodes", "2", "--node-rank", "1"], "node_rank 1 > 0 runs no API server: start it with "
     "--headless."),
    (["--nnodes", "3", "-pp", "2"], "World size (2) must be divisible by nnodes (3)"),
    (["--nnodes", "2", "-pp", "2", "--distributed-executor-backend", "ray"],
     "only supported by the multiprocessing backend"),
])
def test_inconsistent_multi_node_flags_are_refused(tmp_path: Path, args: list[str],
                                                   text: str) -> None:
    result = run_standin("serve", str(model_dir(tmp_path, "m", LLAMA_8B)), "--port",
                         str(pick_free_port()), *args)
    assert result.returncode == 1
    assert "validation error for ParallelConfig" in result.stderr and text in result.stderr


def test_rendered_nodes_join_and_the_head_serves_only_then(site: Path, tmp_path: Path) -> None:
    """kit's own argv for each node (compose file and worker file), on loopback addresses."""
    spec = site / "site.yaml"
    text = spec.read_text().replace("gpus: [0]", "gpus: [4]") + MULTI_NODE.replace(
        "10.213.0.1", "127.0.0.1").replace("10.213.0.2", "127.0.0.2").replace(
        "tensor_parallel: 2", "tensor_parallel: 1").replace("gpus: [0, 1]", "gpus: [0]").replace(
        "    network_interface: veth-kit0\n", "")
    spec.write_text(text.replace("master_port: 29600", f"master_port: {pick_free_port()}"))
    assert run_kit("render", spec).exit_code == 0, run_kit("render", spec).output
    head_argv = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())[
        "services"]["big"]["command"]
    worker_argv = yaml.safe_load((site / "compose" / "node-gpu02.yml").read_text())[
        "services"]["big"]["command"]
    model = str(model_dir(tmp_path, "llama", LLAMA_8B))
    api = pick_free_port()

    def local(argv: list[str]) -> list[str]:
        """The model from this host's folder, the API on a free port."""
        argv = [model if arg.startswith("/models/") else arg for arg in argv]
        argv[argv.index("--port") + 1] = str(api)
        return argv

    head = node(*local(head_argv))
    worker = None
    try:
        time.sleep(1.5)  # several load times: the head waits for the worker, not listening
        assert head.poll() is None and not listening(api)
        worker = node(*local(worker_argv))
        wait_listening(api, head)
        connection = http.client.HTTPConnection("127.0.0.1", api, timeout=5)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
        worker.kill()  # the worker node dies: the model stops, and kit can say why
        code, output = finish(head)
        assert code == 1
        found = diagnose(output)
        assert found is not None and found.spec_key == "services[].nodes"
        assert "went away" in found.cause
    finally:
        for proc in (head, worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc is not None and not proc.stdout.closed:
                proc.stdout.close()


def test_a_worker_of_another_spec_is_refused(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "m", LLAMA_8B)
    master, api = pick_free_port(), pick_free_port()
    head_args, _ = two_nodes(model, master, api)
    head = node(*head_args, STANDIN_JOIN_TIMEOUT_S="3")
    worker = node(str(model), "--max-model-len", "4096", "-pp", "3", "--nnodes", "3",
                  "--node-rank", "1", "--headless", "--master-addr", "127.0.0.1",
                  "--master-port", str(master), NVIDIA_VISIBLE_DEVICES="0")
    code, output = finish(worker)
    assert code == 1 and "was refused by the head" in output
    code, output = finish(head)
    assert code == 1
    found = diagnose(output)
    assert found is not None and found.spec_key == "services[].nodes"
    assert "only 1 of 2 nodes joined the head within 4 s" in found.cause


def test_a_worker_that_cannot_reach_the_head_says_where(tmp_path: Path) -> None:
    _, worker_args = two_nodes(model_dir(tmp_path, "m", LLAMA_8B), pick_free_port(),
                               pick_free_port())
    code, output = finish(node(*worker_args, STANDIN_JOIN_TIMEOUT_S="1"))
    assert code == 1
    found = diagnose(output)
    assert found is not None and found.spec_key == "services[].master_port"
    assert "127.0.0.1:" in found.cause and "1000ms" in found.cause


def test_an_interface_the_node_lacks_is_diagnosed(tmp_path: Path) -> None:
    head_args, _ = two_nodes(model_dir(tmp_path, "m", LLAMA_8B), pick_free_port(), pick_free_port())
    code, output = finish(node(*head_args, GLOO_SOCKET_IFNAME="kit-nosuch0",
                               NCCL_SOCKET_IFNAME="kit-nosuch0"))
    assert code == 1
    found = diagnose(output)
    assert found is not None and found.spec_key == "services[].network_interface"
    assert "'kit-nosuch0'" in found.cause
