"""Every bad spec: exit 2, a message naming file:line:col, the key and the fix; nothing written."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from tests.conftest import LLAMA_8B, tree

SVC = "  - name: llama8b\n"


def replace(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


def append(extra: str):
    return lambda text: text + extra


def with_model_config(config: dict):
    """Give the model directory under models_root this config.json (checked at render)."""

    def prepare(site: Path) -> None:
        (site.parent / "models" / "llama-8b" / "config.json").write_text(json.dumps(config))

    return prepare


def without_model_dir(site: Path) -> None:
    shutil.rmtree(site.parent / "models" / "llama-8b")

SECOND = (
    "  - name: qwen\n    model: qwen\n    gpus: [0]\n    max_model_len: 4096\n"
    "    gpu_memory_utilization: 0.5\n"
)

# (id, edit of the spec text, fragments the message must contain, optional setup)
CASES = [
    ("yaml-syntax", replace("site: test01", "site: [test01"), ["invalid YAML"]),
    ("yaml-tab-indent", append("\tfoo: 1\n"), ["invalid YAML"]),
    ("not-a-mapping", lambda t: "- just\n- a list\n", ["must be a mapping"]),
    ("duplicate-key", append("site: other\n"), ["duplicate key 'site'", ":15:1"]),
    ("duplicate-nested-key", replace("    gpus: [0]", "    gpus: [0]\n    gpus: [1]"),
     ["duplicate key 'gpus'"]),
    ("unknown-top-key", append("gpu_memroy_gib: 80\n"), ["unknown key 'gpu_memroy_gib'",
                                                          "did you mean 'gpu_memory_gib'"]),
    ("unknown-service-key", replace("    gpus: [0]", "    gpus: [0]\n    tensor_paralel: 1"),
     ["services[0].tensor_paralel", "did you mean 'tensor_parallel'"]),
    ("unknown-proxy-key", replace("read_timeout: 900", "read_timeout: 900, readtimeout: 5"),
     ["proxy.readtimeout", "did you mean 'read_timeout'"]),
    ("missing-site", replace("site: test01\n", ""), ["site: required key is missing"]),
    ("missing-domain", replace("domain: llm.test.internal\n", ""), ["domain: required"]),
    ("missing-services", lambda t: t.split("services:")[0], ["services: required"]),
    ("missing-gpus", replace("    gpus: [0]\n", ""), ["services[0].gpus: required"]),
    ("empty-services", lambda t: t.split("services:")[0] + "services: []\n",
     ["services", "at least 1"]),
    ("site-uppercase", replace("site: test01", "site: Test01"), ["site", "not allowed"]),
    ("site-too-long", replace("site: test01", "site: " + "a" * 40), ["site"]),
    ("domain-invalid", replace("domain: llm.test.internal", "domain: llm_test;internal"),
     ["not a DNS name or IP"]),
    ("gpus-not-list", replace("    gpus: [0]", "    gpus: zero"), ["services[0].gpus"]),
    ("gpu-negative", replace("    gpus: [0]", "    gpus: [-1]"), ["greater than or equal to 0"]),
    ("gpu-twice", replace("    gpus: [0]", "    gpus: [0, 0]"), ["listed twice"]),
    ("tp-mismatch", replace("    gpus: [0]", "    gpus: [0, 1]\n    tensor_parallel: 1"),
     ["tensor_parallel is 1 but gpus lists 2"]),
    ("gmu-zero", replace("    gpus: [0]", "    gpus: [0]\n    gpu_memory_utilization: 0"),
     ["gpu_memory_utilization", "greater than 0"]),
    ("gmu-above-one", replace("    gpus: [0]", "    gpus: [0]\n    gpu_memory_utilization: 1.2"),
     ["gpu_memory_utilization", "less than or equal to 1"]),
    ("max-model-len-zero", replace("max_model_len: 8192", "max_model_len: 0"),
     ["max_model_len", "greater than 0"]),
    ("max-model-len-text", replace("max_model_len: 8192", "max_model_len: lots"),
     ["max_model_len"]),
    ("max-num-seqs-bad", replace("max_num_seqs: 64", "max_num_seqs: many"), ["max_num_seqs"]),
    ("dtype-bad", replace("    gpus: [0]", "    gpus: [0]\n    dtype: fp4"), ["dtype"]),
    ("quantization-bad", replace("    gpus: [0]", "    gpus: [0]\n    quantization: fp4"),
     ["'fp4' is not a --quantization value", "valid: awq"]),
    ("kv-dtype-bad", replace("    gpus: [0]", "    gpus: [0]\n    kv_cache_dtype: int8"),
     ["'int8' is not a --kv-cache-dtype value"]),
    ("service-named-nginx", replace("name: llama8b", "name: nginx"), ["'nginx' is the front door"]),
    ("service-named-certbot", replace("name: llama8b", "name: certbot"), ["the ACME client"]),
    ("duplicate-service-name", append(SECOND.replace("name: qwen", "name: llama8b")),
     ["duplicate service name 'llama8b'"]),
    ("duplicate-served-name", append(SECOND + "    served_name: llama-3.1-8b\n"),
     ["duplicate served name 'llama-3.1-8b'"]),
    ("gpu-oversubscribed", append(SECOND), ["GPU 0 is shared", "adds up to 1.40"]),
    ("port-clash", replace("http_port: 8080", "http_port: 8443"), ["both 8443"]),
    ("port-out-of-range", replace("https_port: 8443", "https_port: 70000"),
     ["proxy.https_port", "less than or equal to 65535"]),
    ("bind-not-ip", replace("bind: 127.0.0.1", "bind: localhost"), ["not an IP address"]),
    ("max-body-bad", replace("max_body: 1m", "max_body: 1 MB"), ["proxy.max_body"]),
    ("tls-files-missing", replace("tls: {mode: self-signed}",
                                  "tls: {mode: files, cert: c.pem, key: k.pem}"),
     ["tls.cert: file", "does not exist"]),
    ("tls-files-no-key", replace("tls: {mode: self-signed}", "tls: {mode: files, cert: c.pem}"),
     ["needs both tls.cert and tls.key"]),
    ("tls-mode-bad", replace("mode: self-signed", "mode: letsencrypt"), ["tls.mode"]),
    ("unknown-vllm-flag", replace('"--enable-prefix-caching"', '"--enable-cuda-graph"'),
     ["--enable-cuda-graph is not a `vllm serve` flag in vLLM 0.33.0"]),
    ("removed-vllm-flag", replace('"--enable-prefix-caching"', '"--swap-space", "4"'),
     ["--swap-space is not a `vllm serve` flag"]),
    ("misspelt-vllm-flag", replace('"--enable-prefix-caching"', '"--enable-prefix-cache"'),
     ["did you mean --enable-prefix-caching"]),
    ("flag-duplicates-spec-key", replace('"--enable-prefix-caching"', '"--max-model-len", "4096"'),
     ["--max-model-len is set by kit from the spec: use max_model_len"]),
    ("flag-bad-choice", replace('"--enable-prefix-caching"', '"--load-format", "dummy",'
                                ' "--dtype", "fp4"'), ["--dtype"]),
    ("flag-api-key", replace('"--enable-prefix-caching"', '"--api-key", "secret"'),
     ["--api-key is set by kit"]),
    ("user-with-colon", replace("users: [ops]", 'users: ["op:s"]'), ["auth.users[0]"]),
    ("user-reserved", replace("users: [ops]", "users: [kit-probe]"), ["probe identity"]),
    ("models-root-relative", replace("models_root: ", "models_root: models/"),
     ["must be an absolute host path"]),
    ("env-newline", replace("    gpus: [0]", '    gpus: [0]\n    env: {A: "x\\ny"}'),
     ["services[0].env.A"]),
    ("env-dollar", replace("    gpus: [0]", '    gpus: [0]\n    env: {A: "$HOME"}'),
     ["services[0].env.A", "'$'"]),
    ("served-name-injection", replace("served_name: llama-3.1-8b",
                                      'served_name: "x\\"; } server { listen 1; #"'),
     ["services[0].served_name", "not allowed"]),
    ("image-injection", append('images: {vllm: "vllm/vllm-openai:v0.33.0\\n  evil: 1"}\n'),
     ["images.vllm"]),
    ("model-dir-missing", lambda t: t, ["model directory", "does not exist"], without_model_dir),
    ("tp-not-dividing-heads", replace("    gpus: [0]", "    gpus: [0, 1, 2]"),
     ["tensor parallel size 3 does not divide the model's 32 attention heads"],
     with_model_config(LLAMA_8B)),
    ("max-model-len-above-model", replace("max_model_len: 8192", "max_model_len: 200000"),
     ["above the model's limit 8192"], with_model_config(LLAMA_8B)),
    ("needs-trust-remote-code", lambda t: t, ["trust_remote_code"],
     with_model_config({**LLAMA_8B, "auto_map": {"AutoConfig": "configuration_x.XConfig"}})),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_exits_2_and_writes_nothing(site: Path, case) -> None:
    _, edit, fragments, *setup = case
    spec = site / "site.yaml"
    spec.write_text(edit(spec.read_text()))
    for prepare in setup:
        prepare(site)
    before = tree(site.parent)

    result = CliRunner().invoke(cli, ["render", str(spec)])

    assert result.exit_code == 2, result.output
    message = result.output
    assert f"{spec}:" in message  # names the file (and line:col)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert tree(site.parent) == before


def test_every_problem_is_reported_at_once(site: Path) -> None:
    spec = site / "site.yaml"
    text = spec.read_text().replace("site: test01", "site: BAD").replace(
        "max_model_len: 8192", "max_model_len: -1"
    )
    spec.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2
    assert "2 problems" in result.output
    assert f"{spec}:1:1: site:" in result.output


def test_missing_spec_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["render", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "kit init" in result.output
