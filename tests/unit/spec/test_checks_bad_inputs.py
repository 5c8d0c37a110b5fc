"""Every bad spec: exit 2, a message naming file:line:col, the key and the fix; nothing written.

Each case runs through `kit validate` and `kit render`: everything render refuses, validate
refuses too, with the same position. Cases marked with an issue item number are its regression.
"""

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support.cli import run_kit
from tests.support.sites import LLAMA_8B, REPO, tree
from tests.support.tls_files import ca_bundle, certificate

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


def model_file(name: str, content: bytes):
    """Put a file into the model directory (a weights index, an LFS pointer)."""

    def prepare(site: Path) -> None:
        (site.parent / "models" / "llama-8b" / name).write_bytes(content)

    return prepare


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 16000000000\n"
TWO_SHARDS = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                        "b": "model-00002-of-00002.safetensors"}}).encode()
FILES_TLS = "tls: {mode: files, cert: server.pem, key: server.key}"


ACME_TLS = "tls: {mode: acme, email: ops@test.example, ca_bundle: ca.pem}"


def key_is_a_directory(site: Path) -> None:
    """An unreadable key (root reads any mode bits, so: a directory)."""
    certificate("llm.test.internal")(site)
    (site / "server.key").unlink()
    (site / "server.key").mkdir()


def billion_laughs(text: str) -> str:
    rows = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(rows) + "\n" + text

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
    ("tp-mismatch", replace("    gpus: [0]", "    gpus: [0, 1, 2]\n    tensor_parallel: 2"),
     ["gpus lists 3 GPU(s), which tensor_parallel 2 does not divide"]),
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
    ("nginx-without-http2", append('images: {nginx: "nginx:1.24-alpine"}\n'),
     ["images.nginx", "older than nginx 1.25.1", "nginx:1.27-alpine"]),
    ("model-dir-missing", lambda t: t, ["model directory", "does not exist"], without_model_dir),
    ("tp-not-dividing-heads", replace("    gpus: [0]", "    gpus: [0, 1, 2]"),
     ["tensor parallel size 3 does not divide the model's 32 attention heads"],
     with_model_config(LLAMA_8B)),
    ("max-model-len-above-model", replace("max_model_len: 8192", "max_model_len: 200000"),
     ["above the model's limit 8192"], with_model_config(LLAMA_8B)),
    ("pooling-architecture-without-runner", lambda t: t,
     ["services[0].extra_args", "a pooling model by its architecture (BertModel)",
      '"--runner", "pooling"'],
     with_model_config({**LLAMA_8B, "architectures": ["BertModel"]})),
    ("classify-model-cannot-be-gated",
     replace('extra_args: ["--enable-prefix-caching"]',
             'extra_args: ["--runner", "pooling", "--convert", "classify"]'),
     ["services[0].extra_args", "a `classify` model", "cannot gate"]),
    ("needs-trust-remote-code", lambda t: t, ["trust_remote_code"],
     with_model_config({**LLAMA_8B, "auto_map": {"AutoConfig": "configuration_x.XConfig"}})),
    # issue 8 item 1: no IPv6 zone id (Python's parser takes anything after %)
    ("8.1-domain-zone-id", replace("domain: llm.test.internal",
                                   'domain: "::1%x; location ~ chat { js_content kit.route; } #"'),
     ["site.yaml:2:1: domain:", "not a DNS name or IP address"]),
    ("8.1-domain-zone-variable", replace("domain: llm.test.internal",
                                         'domain: "fe80::1%$kit_auth_epoch"'), ["domain:"]),
    ("8.1-bind-zone-id", replace("bind: 127.0.0.1", 'bind: "fe80::1%eth0"'),
     ["proxy.bind", "without a %zone"]),
    # issue 8 item 2: a value is matched whole; `$` before a final newline is not its end
    ("8.2-domain-newline", replace("domain: llm.test.internal", 'domain: "llm.test.internal\\n"'),
     ["site.yaml:2:1: domain:", "not a DNS name"]),
    ("8.2-domain-block-scalar", replace("domain: llm.test.internal",
                                        "domain: |\n  llm.test.internal"), ["domain:"]),
    ("8.2-user-newline", replace("users: [ops]", 'users: ["ops\\n"]'),
     ["auth.users[0]", "not allowed here"]),
    ("8.2-site-newline", replace("site: test01", 'site: "test01\\n"'), ["site:", "not allowed"]),
    ("8.6-models-root-long-folder-name",
     lambda t: re.sub("models_root: .*", "models_root: /" + "a" * 300, t),
     ["models_root", "255 bytes per folder name"]),
    ("8.2-models-root-newline", replace("models_root: ", 'models_root: "/data\\n"\nx: '),
     ["models_root"]),
    # issue 8 item 5: sizes and counts nginx accepts
    ("8.5-max-body-above-1g", replace("max_body: 1m", "max_body: 2g"),
     ["proxy.max_body", "outside 1k..1g"]),
    ("8.5-max-body-below-1k", replace("max_body: 1m", "max_body: 100"), ["proxy.max_body"]),
    ("8.5-max-connections", replace("read_timeout: 900", "read_timeout: 900, "
                                    "max_connections_per_ip: 65536"),
     ["proxy.max_connections_per_ip", "less than or equal to 65535"]),
    # issue 44: a password verdict's life is the spec's, within what keeps bcrypt rare
    ("44-password-recheck-too-short", replace("read_timeout: 900", "read_timeout: 900, "
                                             "password_recheck_s: 4"),
     ["proxy.password_recheck_s", "greater than or equal to 5"]),
    ("44-password-recheck-too-long", replace("read_timeout: 900", "read_timeout: 900, "
                                            "password_recheck_s: 3601"),
     ["proxy.password_recheck_s", "less than or equal to 3600"]),
    # issue 8 item 6: hostile YAML refused before anything is expanded or built
    ("8.6-billion-laughs", billion_laughs, ["site.yaml:1:5:", "anchors and aliases",
                                            "fix: write the value out"]),
    ("8.6-self-referencing-anchor", lambda t: "a: &a [*a]\n" + t, ["anchors and aliases"]),
    ("8.6-deep-nesting", append("x: " + "[" * 3000 + "]" * 3000 + "\n"),
     ["site.yaml:15:", "nested deeper than 16 levels"]),
    ("8.6-5000-digit-number", replace("    gpus: [0]", "    gpus: [" + "9" * 5000 + "]"),
     ["services[0].gpus[0]", "a number of 5000 characters"]),
    ("8.6-spec-too-large", append("# " + "x" * (1 << 20) + "\n"), ["larger than 1 MiB"]),
    ("8.6-nul-character", replace("site: test01", "site: test01\0"),
     ["site.yaml:1:13:", "is not allowed in YAML text"]),
    ("8.6-impossible-date", replace("site: test01", "site: 2001-02-30"),
     ["site.yaml:1:1: site:", "cannot be read"]),
    ("8.6-python-tag", replace("site: test01", "site: !!python/object/apply:os.system [id]"),
     ["site.yaml:1:7:", "invalid YAML"]),
    # issue 8 item 7: what kit reads itself, and unreadable files, refused with a position
    ("8.7-engine-timeout-not-seconds",
     replace("    gpus: [0]", '    gpus: [0]\n    env: {VLLM_ENGINE_READY_TIMEOUT_S: "20m"}'),
     ["services[0].env.VLLM_ENGINE_READY_TIMEOUT_S", "whole number of seconds", "1200"]),
    ("8.7-tls-key-unreadable", replace("tls: {mode: self-signed}", FILES_TLS),
     ["tls.key: cannot read", "fix:"], key_is_a_directory),
    # issue 8 item 9: YAML booleans, strings and floats are not integers
    ("8.9-gpu-yes", replace("    gpus: [0]", "    gpus: [yes]"),
     ["services[0].gpus[0]", "got True", "YAML reads yes/no"]),
    ("8.9-max-num-seqs-true", replace("max_num_seqs: 64", "max_num_seqs: true"),
     ["services[0].max_num_seqs", "got True"]),
    ("8.9-https-port-true", replace("https_port: 8443", "https_port: true"),
     ["proxy.https_port", "got True"]),
    ("8.9-quoted-number", replace("    gpus: [0]", '    gpus: ["1"]'),
     ["services[0].gpus[0]", "without quotes"]),
    ("8.9-float-for-int", replace("max_model_len: 8192", "max_model_len: 16384.0"),
     ["services[0].max_model_len", "whole number"]),
    ("8.9-bool-for-text", replace("site: test01", "site: yes"), ["site:", "got True"]),
    ("8.9-service-name-reads-as-bool", replace("name: llama8b", 'name: "off"'),
     ["services[0].name", "reads as False in YAML"]),
    # issue 42 item 13: a YAML 1.1 number in another base than the decimal written
    ("42.13-octal-port", replace("https_port: 8443", "https_port: 010443"),
     ["site.yaml:6:26: proxy.https_port: 010443 is an octal number in YAML 1.1 (it reads as "
      "4387)", "fix: write 10443, or quote the value if it is text ('010443')"]),
    ("42.13-base-60", append("observability: {enabled: true, retention_days: 1:20}\n"),
     ["observability.retention_days: 1:20 is a base-60 number in YAML 1.1 (it reads as 80)",
      "fix: write 80"]),
    ("42.13-hexadecimal", replace("max_num_seqs: 64", "max_num_seqs: 0x10"),
     ["services[0].max_num_seqs: 0x10 is a hexadecimal number", "(it reads as 16)"]),
    ("42.13-binary", replace("    gpus: [0]", "    gpus: [0b11]"),
     ["services[0].gpus[0]: 0b11 is a binary number", "(it reads as 3)"]),
    ("42.13-underscores", replace("max_model_len: 8192", "max_model_len: 8_192"),
     ["services[0].max_model_len: 8_192 is a number with '_' separators", "fix: write 8192"]),
    ("42.13-base-60-float", replace("max_model_len: 8192", "max_model_len: 1:20.5"),
     ["services[0].max_model_len: 1:20.5 is a base-60 number"]),
    # issue 42 item 11: a merge conflict left in the file is named as one, at its line
    ("42.11-merge-conflict", replace("    gpus: [0]\n", "<<<<<<< HEAD\n    gpus: [0]\n=======\n"
                                     "    gpus: [1]\n>>>>>>> other\n"),
     ["a git merge conflict marker (<<<<<<<)", "fix: resolve the git merge conflict"]),
    # issue 8 item 10: validate refuses what render would
    ("8.10-cert-for-another-domain", replace("tls: {mode: self-signed}", FILES_TLS),
     ["site.yaml:4:", "tls.cert", "does not name llm.test.internal", "fix:"],
     certificate("other.example.com")),
    ("8.10-cert-expired", replace("tls: {mode: self-signed}", FILES_TLS),
     ["tls.cert", "the certificate expired"], certificate("llm.test.internal",
                                                          issued_days_ago=500)),
    ("8.10-key-of-another-cert", replace("tls: {mode: self-signed}", FILES_TLS),
     ["tls.cert", "does not belong to the certificate"],
     certificate("llm.test.internal", other_key=True)),
    ("8.10-acme-ip", lambda t: t.replace("domain: llm.test.internal", "domain: 10.1.2.3").replace(
        "tls: {mode: self-signed}", "tls: {mode: acme, email: ops@test.example}"),
     ["site.yaml:2:1: domain:", "tls.mode acme needs a public DNS name", "fix:"]),
    ("8.10-acme-single-label", lambda t: t.replace("domain: llm.test.internal", "domain: llm")
     .replace("tls: {mode: self-signed}", "tls: {mode: acme, email: ops@test.example}"),
     ["domain:", "'llm'"]),
    # issue 22 item 8: tls.ca_bundle is PEM CA certificates only; email is an address
    ("22.8-ca-bundle-missing", replace("tls: {mode: self-signed}", ACME_TLS),
     ["site.yaml:4:", "tls.ca_bundle", "ca.pem does not exist", "fix: point tls.ca_bundle"]),
    ("22.8-ca-bundle-with-a-private-key", replace("tls: {mode: self-signed}", ACME_TLS),
     ["tls.ca_bundle", "holds PRIVATE KEY blocks (a private key: never hand it to kit)",
      "fix:"], ca_bundle("ca+key")),
    ("22.8-ca-bundle-not-pem", replace("tls: {mode: self-signed}", ACME_TLS),
     ["tls.ca_bundle", "not PEM certificates"], ca_bundle("junk")),
    ("22.8-ca-bundle-a-server-certificate", replace("tls: {mode: self-signed}", ACME_TLS),
     ["tls.ca_bundle", "is not a CA certificate"], ca_bundle("ca+server")),
    ("22.8-ca-bundle-in-self-signed-mode", replace(
        "tls: {mode: self-signed}", "tls: {mode: self-signed, ca_bundle: ca.pem}"),
     ["tls", "tls.ca_bundle is read in modes acme and files"], ca_bundle("ca")),
    ("22.8-email-an-option", replace(
        "tls: {mode: self-signed}", 'tls: {mode: acme, email: "--staging@x.zz"}'),
     ["site.yaml:4:", "tls.email", "not starting with - or ."]),
    # issue 29: certbot's first retry is the spec's, within bounds that do not hammer a CA
    ("29-acme-retry-too-soon", replace(
        "tls: {mode: self-signed}", "tls: {mode: acme, email: ops@test.example, acme_retry_s: 5}"),
     ["site.yaml:4:", "tls.acme_retry_s", "greater than or equal to 10"]),
    ("29-acme-retry-in-self-signed-mode", replace(
        "tls: {mode: self-signed}", "tls: {mode: self-signed, acme_retry_s: 60}"),
     ["tls", "tls.acme_server/tls.staging/tls.acme_retry_s are only read in mode acme"]),
    ("8.10-pipeline-parallel-beyond-gpus",
     replace('"--enable-prefix-caching"', '"--pipeline-parallel-size", "2"'),
     ["services[0].extra_args[0]", "needs 2 GPUs but gpus lists 1"]),
    ("8.10-data-parallel-beyond-gpus",
     replace('"--enable-prefix-caching"', '"--enable-prefix-caching", "-dp=2"'),
     ["services[0].extra_args[1]", "--data-parallel-size 2 needs 2 GPUs"]),
    ("8.10-missing-shards", lambda t: t, ["services[0].model", "shard model-00001-of-00002",
                                          "is missing"],
     model_file("model.safetensors.index.json", TWO_SHARDS)),
    ("8.10-lfs-pointer-weights", lambda t: t, ["services[0].model", "Git LFS pointer"],
     model_file("model.safetensors", LFS_POINTER)),
    ("8.10-lfs-pointer-config", lambda t: t, ["services[0].model", "Git LFS pointer"],
     model_file("config.json", LFS_POINTER)),
    ("8.10-cannot-start-here", append("gpu_memory_gib: 12\n"),
     ["site.yaml:8:5: services[0]: cannot start on this hardware"]),
    ("10.1-replicas-disagree", replace(
        "    gpus: [0]", "    gpus: [0, 1, 2, 3]\n    tensor_parallel: 2\n    replicas: 4"),
     ["replicas is 4 but gpus lists 4 GPU(s) for tensor_parallel 2: that makes 2 replica(s)"]),
    ("10.1-replicas-uneven", replace("    gpus: [0]", "    gpus: [0, 1, 2]\n    replicas: 2"),
     ["gpus lists 3 GPU(s), which 2 replicas cannot share evenly"]),
    ("10.1-replica-name-taken", lambda t: replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    tensor_parallel: 1")(t)
        + "  - {name: llama8b-r1, model: llama-8b, served_name: other, gpus: [2]}\n",
     ["services[1].name", "'llama8b-r1' is also the name of replica 1 of service llama8b",
      "rename one of them"]),
    ("10.2-header-affinity-without-header", replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    routing: {affinity: header}"),
     ["services[0].routing", "affinity header needs `header:`"]),
    ("10.2-header-name-hostile", replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    routing: {affinity: header, header: 'X-A;b'}"),
     ["services[0].routing.header"]),
    ("51-epsilon-without-prefix-affinity", replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    routing: {affinity: header, header: X-S, "
        "epsilon: 0.5}"),
     ["services[0].routing", "`epsilon:` is only read with affinity prefix (not header)"]),
    ("51-epsilon-out-of-bounds", replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    routing: {affinity: prefix, epsilon: 0}"),
     ["services[0].routing.epsilon"]),
    ("10.2-unknown-affinity", replace(
        "    gpus: [0]", "    gpus: [0, 1]\n    routing: {affinity: cookie}"),
     ["services[0].routing.affinity"]),
    ("26-idle-sleep-no-unit", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15}"),
     ["services[0].idle_sleep.after", ":12:18:", "15 has no unit: write it with s, m or h "
      "(e.g. 15m)"]),
    ("26-idle-sleep-bad-duration", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15 min}"),
     ["services[0].idle_sleep.after", "'15 min' is not a duration",
      "write a whole number and s, m or h (e.g. 90s, 15m, 2h)"]),
    ("26-idle-sleep-too-short", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 5s}"),
     ["services[0].idle_sleep.after", "'5s' is outside 10s..168h"]),
    ("26-idle-sleep-too-long", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 200h}"),
     ["services[0].idle_sleep.after", "'200h' is outside 10s..168h"]),
    ("26-idle-sleep-level-3", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, level: 3}"),
     ["services[0].idle_sleep.level", "less than or equal to 2", "(got 3)"]),
    ("26-idle-sleep-no-after", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {level: 1}"),
     ["services[0].idle_sleep.after: required key is missing",
      "add services[0].idle_sleep.after"]),
    ("26-swap-group-alone", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: g0}"),
     ["services[0].idle_sleep.swap_group", "swap group 'g0' has no other service on the GPUs "
      "of llama8b (0)", "give the services that share these GPUs the same swap_group"]),
    ("26-swap-group-half", lambda t: replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: g0}")(t)
        + SECOND.replace("0.5", "0.9"),
     ["GPU 0 is shared by llama8b, qwen", "adds up to 1.80 awake at once",
      "or give them idle_sleep with one swap_group (one of them awake at a time)"]),
    ("26-swap-group-bad-name", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: 'G 0'}"),
     ["services[0].idle_sleep.swap_group"]),
    ("42-min-awake-no-unit", lambda t: replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: g0, "
        "min_awake: 30}")(t) + SECOND,
     ["services[0].idle_sleep.min_awake", "30 has no unit: write it with s, m or h"]),
    ("42-min-awake-too-long", lambda t: replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: g0, "
        "min_awake: 2m}")(t) + SECOND,
     ["services[0].idle_sleep.min_awake", "'2m' is outside 0s..60s",
      "write a duration in that range (e.g. 30s)"]),
    ("42-min-awake-without-swap-group", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, min_awake: 10s}"),
     ["services[0].idle_sleep", "min_awake is how long a swap group's member stays awake",
      "give the service a swap_group, or remove min_awake"]),
    ("26-idle-sleep-unknown-key", replace(
        "    gpus: [0]", "    gpus: [0]\n    idle_sleep: {after: 15m, levle: 2}"),
     ["services[0].idle_sleep.levle", "did you mean 'level'"]),
    ("26-dev-mode-by-hand", replace(
        "    gpus: [0]", "    gpus: [0]\n    env: {VLLM_SERVER_DEV_MODE: '1'}"),
     ["services[0].env.VLLM_SERVER_DEV_MODE", "is set by kit for a service with idle_sleep",
      "fix: remove VLLM_SERVER_DEV_MODE from env"]),
    ("26-sleep-flag-by-hand", replace(
        '["--enable-prefix-caching"]', '["--enable-prefix-caching", "--enable-sleep-mode"]'),
     ["services[0].extra_args[1]", "--enable-sleep-mode is set by kit from the spec: use "
      "idle_sleep"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_exits_2_and_writes_nothing(site: Path, case) -> None:
    _, edit, fragments, *setup = case
    spec = site / "site.yaml"
    spec.write_text(edit(spec.read_text()))
    for prepare in setup:
        prepare(site)
    before = tree(site.parent)

    for command in ("validate", "render"):
        started = time.monotonic()
        result = run_kit(command, str(spec))

        assert result.exit_code == 2, f"{command}: {result.output}"
        assert time.monotonic() - started < 5, f"{command} took too long"
        message = result.output
        assert f"{spec}:" in message  # names the file (and line:col)
        for fragment in fragments:
            assert fragment in message, f"{command}: {fragment!r} not in:\n{message}"
        assert tree(site.parent) == before


def test_every_problem_is_reported_at_once(site: Path) -> None:
    spec = site / "site.yaml"
    text = spec.read_text().replace("site: test01", "site: BAD").replace(
        "max_model_len: 8192", "max_model_len: -1"
    )
    spec.write_text(text)
    result = run_kit("validate", str(spec))
    assert result.exit_code == 2
    assert "2 problems" in result.output
    assert f"{spec}:1:1: site:" in result.output


def test_a_typo_does_not_hide_a_gpu_clash(site: Path) -> None:
    """Cross-field checks run on every part that validated, beside field errors elsewhere."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("site: test01", "site: BAD") + SECOND)
    result = run_kit("validate", str(spec))
    assert result.exit_code == 2
    assert "site: 'BAD'" in result.output and "GPU 0 is shared" in result.output


def test_a_hub_id_is_allowed_with_a_loud_warning(site: Path) -> None:
    """A `model` with a slash and no such directory downloads and opens the backend network."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("model: llama-8b", "model: org/llama-8b"))
    result = run_kit("validate", str(spec))
    assert result.exit_code == 0, result.output
    assert "DOWNLOAD: services[0] (llama8b) model 'org/llama-8b'" in result.output
    assert "internet access for every service" in result.output


def test_fp8_ds_mla_validates_with_a_capacity_plan(site: Path) -> None:
    """issue 9: a KV-cache dtype the flag table has is planned, never a crash without position."""
    deepseek = REPO / "tests" / "data" / "models" / "deepseek-v2-lite-chat" / "config.json"
    shutil.copy(deepseek, site.parent / "models" / "llama-8b" / "config.json")  # an MLA model
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("    gpus: [0]", "    gpus: [0]\n"
                                             "    kv_cache_dtype: fp8_ds_mla\n"
                                             "    trust_remote_code: true")
                    + "gpu_memory_gib: 80\n")
    result = run_kit("validate", str(spec))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("runner", ["pooling", "generate"])
def test_a_pooling_architecture_validates_once_the_runner_is_written(
    site: Path, runner: str
) -> None:
    """--runner pooling (an embedding model) or --runner generate (kit's guess overruled)."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        'extra_args: ["--enable-prefix-caching"]', f'extra_args: ["--runner", "{runner}"]', 1))
    with_model_config({**LLAMA_8B, "architectures": ["BertModel"]})(site)
    result = run_kit("validate", str(spec))
    assert result.exit_code == 0, result.output


def test_missing_spec_file(tmp_path: Path) -> None:
    result = run_kit("render", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    assert "does not exist" in result.output and "kit init" in result.output
