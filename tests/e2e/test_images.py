"""Smoke tests of the local test images on a real engine: the vLLM stand-in with a GPU device
request (stub NVIDIA hook, see scripts/dockerd.sh) and the nginx image with njs."""

from __future__ import annotations

import http.client
import json
import time

import pytest
from docker.types import DeviceRequest

from tests.support.docker_engine import NGINX_VERSION, NJS_VERSION
from tests.support.live_stack import read_in

pytestmark = pytest.mark.e2e

# A small model's config.json: enough for the stand-in to derive limits and memory.
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
    "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
SECOND = 1_000_000_000  # docker healthcheck durations are in nanoseconds


def gpu_request(*ids: str) -> list[DeviceRequest]:
    return [DeviceRequest(driver="nvidia", device_ids=list(ids), capabilities=[["gpu"]])]


def run_standin(client, image: str, labels: dict, model_dir, *args: str, **kwargs):
    return client.containers.run(
        image,
        command=["/models/tiny", "--served-model-name", "tiny", "--port", "8000",
                 *args],
        detach=True,
        labels=labels,
        environment={"STANDIN_LOAD_SECONDS": "1"},
        volumes={str(model_dir): {"bind": "/models/tiny", "mode": "ro"}},
        **kwargs,
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def health(container) -> str:
    container.reload()
    return container.attrs["State"].get("Health", {}).get("Status", "")


@pytest.fixture
def tiny_model(tmp_path):
    path = tmp_path / "tiny"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY))
    return path


def test_standin_serves_with_a_gpu_device_request(docker_client, test_images, project_labels,
                                                  free_port, tiny_model):
    port = free_port()
    container = run_standin(
        docker_client, test_images["vllm"], project_labels, tiny_model,
        "--max-model-len", "4096",
        device_requests=gpu_request("0"),
        ports={"8000/tcp": ("127.0.0.1", port)},
        healthcheck={"test": ["CMD", "curl", "-fsS", "-o", "/dev/null",
                              "http://127.0.0.1:8000/health"],
                     "interval": SECOND // 2, "timeout": 2 * SECOND, "retries": 3,
                     "start_period": 30 * SECOND},
    )
    wait_for(lambda: health(container) == "healthy", 30, "the stand-in to turn healthy")

    requests = container.attrs["HostConfig"]["DeviceRequests"]
    assert [(r["Driver"], r["DeviceIDs"], r["Capabilities"]) for r in requests] == [
        ("nvidia", ["0"], [["gpu"]])]
    # Docker gives the variable to the container's process (PID 1), not to `docker exec`.
    out = read_in(container, ["sh", "-c", "tr '\\0' '\\n' </proc/1/environ"])
    assert "NVIDIA_VISIBLE_DEVICES=0" in out.split("\n")

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
        "stream": True, "stream_options": {"include_usage": True}}),
        headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    events = [e for e in response.read().split(b"\n\n") if e]
    conn.close()
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 8
    assert [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[1:-2]] == (
        [None] * 7 + ["length"])

    started = time.monotonic()
    container.stop(timeout=10)  # SIGTERM to PID 1: the stand-in must exit at once
    assert time.monotonic() - started < 3
    assert container.wait(timeout=10)["StatusCode"] == 0
    assert b"Application startup complete." in container.logs()


def test_standin_needs_shared_memory_for_tensor_parallel(docker_client, test_images,
                                                         project_labels, tiny_model):
    args = ("--max-model-len", "4096", "--tensor-parallel-size", "2")
    # Docker's default /dev/shm is 64 MiB: NCCL cannot create its segments.
    small = run_standin(docker_client, test_images["vllm"], project_labels, tiny_model, *args,
                        device_requests=gpu_request("0", "1"))
    assert small.wait(timeout=30)["StatusCode"] == 1
    logs = small.logs().decode()
    assert "Error while creating shared memory segment /dev/shm/nccl-" in logs
    assert logs.rstrip().endswith("RuntimeError: Engine core initialization failed. See root "
                                  "cause above. Failed core proc(s): {}")

    # With `ipc: host` (what kit renders for TP > 1) it starts.
    shared = run_standin(docker_client, test_images["vllm"], project_labels, tiny_model, *args,
                         device_requests=gpu_request("0", "1"), ipc_mode="host")
    wait_for(lambda: b"Application startup complete." in shared.logs(), 30,
             "the stand-in to start with ipc: host")
    shared.stop(timeout=10)


def test_standin_without_gpu_runtime_fails_like_vllm(docker_client, test_images,
                                                     project_labels, tiny_model):
    container = run_standin(docker_client, test_images["vllm"], project_labels, tiny_model)
    assert container.wait(timeout=30)["StatusCode"] == 1
    assert "RuntimeError: Failed to infer device type" in container.logs().decode()


def test_nginx_image_runs_njs_with_the_official_layout(docker_client, test_images,
                                                       project_labels, free_port, tmp_path):
    image = docker_client.images.get(test_images["nginx"])
    assert image.attrs["Config"]["Cmd"] == ["nginx", "-g", "daemon off;"]
    assert image.attrs["Config"]["StopSignal"] == "SIGQUIT"

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hello.js").write_text(
        "function hello(r) { r.return(200, 'njs ' + njs.version + '\\n'); }\n"
        "export default {hello};\n")
    (conf / "nginx.conf").write_text(
        "load_module /etc/nginx/modules/ngx_http_js_module.so;\n"
        "user nginx;\nworker_processes 1;\npid /run/nginx.pid;\nevents {}\n"
        "http {\n"
        "    client_body_temp_path /var/cache/nginx/client_temp;\n"
        "    proxy_temp_path /var/cache/nginx/proxy_temp;\n"
        "    js_import main from /etc/kit/hello.js;\n"
        "    server { listen 8080; location / { js_content main.hello; } }\n"
        "}\n")
    mounts = {str(conf): {"bind": "/etc/kit", "mode": "ro"}}

    checked = docker_client.containers.run(
        test_images["nginx"], ["nginx", "-t", "-c", "/etc/kit/nginx.conf"], volumes=mounts,
        labels=project_labels, detach=True)
    assert checked.wait(timeout=30)["StatusCode"] == 0
    assert b"test is successful" in checked.logs()

    port = free_port()
    # Run it the way kit's compose file does: read-only root, tmpfs for nginx's writable dirs.
    server = docker_client.containers.run(
        test_images["nginx"], ["nginx", "-c", "/etc/kit/nginx.conf", "-g", "daemon off;"],
        volumes=mounts, labels=project_labels, detach=True, read_only=True,
        tmpfs={"/var/cache/nginx": "", "/run": "", "/tmp": ""},
        ports={"8080/tcp": ("127.0.0.1", port)})

    def answer():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            response = conn.getresponse()
            return response.status, response.read()
        except OSError:
            return None

    status, body = wait_for(answer, 20, "nginx to answer")
    assert status == 200 and body.startswith(b"njs " + NJS_VERSION.encode()), body
    assert f"nginx/{NGINX_VERSION}" in read_in(server, ["nginx", "-v"])
    out = read_in(server, ["sh", "-c", "id -u nginx; id -g nginx; command -v curl"])
    assert out.split() == ["101", "101", "/usr/bin/curl"]
    server.stop(timeout=10)
    assert server.wait(timeout=10)["StatusCode"] == 0
