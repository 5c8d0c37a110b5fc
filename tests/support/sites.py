"""Site folders and spec texts the unit tests share: the repo's root, a valid base spec to
mutate, the two-service site on a real model config, a multi-node service, observability
turned on, and the files of a folder (to prove a failed command wrote nothing)."""

import json
import shutil
import stat
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BASE_SPEC = """\
site: test01
domain: llm.test.internal
models_root: {models_root}
tls: {{mode: self-signed}}
auth: {{users: [ops], api_keys: true}}
proxy: {{bind: 127.0.0.1, https_port: 8443, http_port: 8080, max_body: 1m, read_timeout: 900}}
services:
  - name: llama8b
    model: llama-8b
    served_name: llama-3.1-8b
    gpus: [0]
    max_model_len: 8192
    max_num_seqs: 64
    extra_args: ["--enable-prefix-caching"]
"""


# Llama-3.1-8B's published config.json values that kit reads (tests/data/models has the rest).
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16", "vocab_size": 128256, "intermediate_size": 14336,
}


def base_site(root: Path) -> Path:
    """A site folder under `root` with the base spec; models_root holds llama-8b/config.json."""
    models = root / "models"
    (models / "llama-8b").mkdir(parents=True)
    (models / "llama-8b" / "config.json").write_text(json.dumps(LLAMA_8B))
    (root / "site").mkdir()
    spec = root / "site" / "site.yaml"
    spec.write_text(BASE_SPEC.format(models_root=models))
    return spec.parent


def spec_in_folder(spec: Path, folder: Path) -> Path:
    """`folder` (made here) holding a copy of `spec` as its site.yaml."""
    folder.mkdir(parents=True)
    shutil.copy(spec, folder / "site.yaml")
    return folder


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its content: to prove a failed command wrote nothing."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mode: what a failed render must leave exactly as it was."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*")) if p.is_file()
    }


MODEL_CONFIG = REPO / "tests" / "data" / "models" / "qwen2.5-1.5b-instruct" / "config.json"

TWO_SERVICES = """\
site: unit01
domain: llm.test.internal
models_root: {models}
auth: {{users: [ops]}}
proxy: {{bind: 127.0.0.1, https_port: 18443, http_port: 18080, read_timeout: {read_timeout}}}
healthcheck_interval: 1
services:
  - name: alpha
    model: qwen
    gpus: [0]
    max_num_seqs: {alpha_seqs}
    max_model_len: 4096
    env: {{STANDIN_LOAD_SECONDS: "2"}}
  - name: beta
    model: qwen
    gpus: [1, 2]
    max_num_seqs: 8
    max_model_len: 4096
"""


def write_site(root: Path, *, alpha_seqs: int = 8, read_timeout: int = 900) -> Path:
    """A two-service site (a model folder with a real config.json); returns the spec path."""
    models = root / "models"
    (models / "qwen").mkdir(parents=True, exist_ok=True)
    (models / "qwen" / "config.json").write_bytes(MODEL_CONFIG.read_bytes())
    spec = root / "site" / "site.yaml"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(TWO_SERVICES.format(models=models, alpha_seqs=alpha_seqs,
                                        read_timeout=read_timeout))
    return spec


# A service over two nodes of two GPUs, to append to the base spec's services.
MULTI_NODE = """\
  - name: big
    model: llama-8b
    gpus: [0, 1]
    tensor_parallel: 2
    pipeline_parallel: 2
    nodes:
      - {name: test01, address: 10.213.0.1}
      - {name: gpu02, address: 10.213.0.2}
    network_interface: veth-kit0
    master_port: 29600
"""

OBSERVABILITY = """\
observability: {enabled: true, scrape_interval: 5, retention_days: 7, replica_down_after: 20}
"""
SECOND_SERVICE = """\
  - name: small
    model: llama-8b
    gpus: [1]
    max_num_seqs: 8
    slo: {ttft_p95_ms: 200, tpot_p95_ms: 30}
"""


def enable(site: Path, extra: str = OBSERVABILITY, services: str = SECOND_SERVICE) -> Path:
    """The base site's spec with observability on and a second service that has an SLO."""
    spec = site / "site.yaml"
    text = spec.read_text().replace("services:\n", extra + "services:\n")
    spec.write_text(text + services)
    return spec
