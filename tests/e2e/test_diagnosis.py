"""Every start-up failure kit diagnoses, provoked through the vLLM STAND-IN in a real container.

kit refuses most of these at render time when it can read the model (a better outcome); here the
container is started with the argv kit renders, bypassing those checks, so the diagnosis that
`kit up` prints on a failed start is proven against what the container really logs.
"""

import json
import shutil
import time
from pathlib import Path

import docker
import pytest
from docker.types import DeviceRequest

from kit.converge.diagnose import diagnose
from tests.support.sites import REPO

pytestmark = pytest.mark.e2e

LLAMA = REPO / "tests" / "data" / "models" / "llama-3.1-8b-instruct" / "config.json"
EXIT_TIMEOUT_S = 90

# (case, argv changes, env, GPUs, extra container options, expected spec key)
CASES = [
    ("weights-do-not-fit", {}, {"STANDIN_GPU_MEMORY_GIB": "8"}, ["0"], {},
     {"services[].gpus", "services[].gpu_memory_utilization"}),
    ("no-memory-for-kv", {"--gpu-memory-utilization": "0.05"}, {}, ["0"], {},
     {"services[].gpu_memory_utilization"}),
    ("kv-cache-too-small", {"--max-model-len": "131072", "--gpu-memory-utilization": "0.13"},
     {"STANDIN_GPU_MEMORY_GIB": "140"}, ["0"], {}, {"services[].max_model_len"}),
    ("max-model-len-over-limit", {"--max-model-len": "200000"}, {}, ["0"], {},
     {"services[].max_model_len"}),
    ("tp-does-not-divide-heads", {"--tensor-parallel-size": "3"}, {}, ["0", "1", "2"],
     {"shm_size": "2g"}, {"services[].gpus"}),
    ("world-size-above-gpus", {"--tensor-parallel-size": "2"}, {}, ["0"], {"shm_size": "2g"},
     {"services[].gpus"}),
    ("unknown-flag", {"extra": ["--enable-cuda-graph"]}, {}, ["0"], {}, {"services[].extra_args"}),
    ("bad-dtype", {"--dtype": "fp4"}, {}, ["0"], {}, {"services[].dtype"}),
    ("unknown-quantization", {"--quantization": "fp4"}, {}, ["0"], {},
     {"services[].quantization"}),
    ("needs-trust-remote-code", {"model": "custom"}, {}, ["0"], {},
     {"services[].trust_remote_code"}),
    ("model-path-missing", {"model": "nonexistent"}, {}, ["0"], {}, {"services[].model"}),
    ("no-gpu-runtime", {}, {}, None, {}, {"services[].gpus"}),
    ("shared-memory-too-small", {"--tensor-parallel-size": "2"}, {}, ["0", "1"], {},
     {"services[].gpus"}),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / "llama").mkdir()
    shutil.copy(LLAMA, root / "llama" / "config.json")
    (root / "custom").mkdir()
    config = json.loads(LLAMA.read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (root / "custom" / "config.json").write_text(json.dumps(config))
    return root


def argv(changes: dict) -> list[str]:
    """The flags kit renders for a service, with this case's changes."""
    flags = {
        "--served-model-name": "llama", "--tensor-parallel-size": "1",
        "--max-model-len": "8192", "--gpu-memory-utilization": "0.9", "--port": "8000",
    }
    flags.update({k: v for k, v in changes.items() if k.startswith("--")})
    command = [f"/models/{changes.get('model', 'llama')}"]  # positional, first
    for flag, value in flags.items():
        command += [flag, value]
    return command + changes.get("extra", [])


def run_to_exit(client: docker.DockerClient, image: str, models: Path, command: list[str],
                env: dict, gpus: list[str] | None, options: dict) -> str:
    """Start the stand-in like kit would and return its log once it has exited."""
    container = client.containers.run(
        image, command, detach=True, environment={"STANDIN_LOAD_SECONDS": "1", **env},
        volumes={str(models): {"bind": "/models", "mode": "ro"}},
        device_requests=[DeviceRequest(driver="nvidia", device_ids=gpus, capabilities=[["gpu"]])]
        if gpus else None,
        **options,
    )
    try:
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while time.monotonic() < deadline:
            container.reload()
            if container.status == "exited":
                return container.logs().decode(errors="replace")
            time.sleep(0.3)
        raise AssertionError(f"the stand-in did not fail within {EXIT_TIMEOUT_S} s")
    finally:
        container.remove(force=True)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_start_failure_is_diagnosed(docker_client, test_images, models, case) -> None:
    _, changes, env, gpus, options, keys = case
    log = run_to_exit(docker_client, test_images["vllm"], models, argv(changes), env, gpus,
                      options)
    found = diagnose(log)
    assert found is not None, f"no diagnosis for:\n{log[-2000:]}"
    assert found.spec_key in keys, f"{found.spec_key}: {found.cause}\n{log[-1500:]}"
    assert found.fix and found.evidence in log
