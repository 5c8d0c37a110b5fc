"""Shared fixtures: a valid base spec to mutate, and a site folder per test."""

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

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


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """Each test's site locks (kit/site_lock.py) in a folder of its own, inherited by the kit
    processes it starts: tests never wait on each other, nor on an operator's kit."""
    folder = tmp_path_factory.mktemp("locks")
    monkeypatch.setenv("KIT_LOCK_DIR", str(folder))
    return folder


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site folder with a valid spec; models_root holds llama-8b/config.json."""
    models = tmp_path / "models"
    (models / "llama-8b").mkdir(parents=True)
    (models / "llama-8b" / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "site").mkdir()
    spec = tmp_path / "site" / "site.yaml"
    spec.write_text(BASE_SPEC.format(models_root=models))
    return spec.parent


def spec_in_folder(spec: Path, folder: Path) -> Path:
    """`folder` (made here) holding a copy of `spec` as its site.yaml."""
    folder.mkdir(parents=True)
    shutil.copy(spec, folder / "site.yaml")
    return folder


@pytest.fixture
def example_site(tmp_path: Path) -> Path:
    """A copy of the bundled example spec in an empty folder."""
    return spec_in_folder(REPO / "site.yaml", tmp_path / "example")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its content: to prove a failed command wrote nothing."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}
