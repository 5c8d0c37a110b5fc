"""The gate against the real rendered stack: `kit up` on the local test images (nginx as rendered,
the vLLM stand-in behind it), then faults put into the running nginx by hand.

The gate must pass on the stack as kit renders it, fail with the operator's reason when nginx
buffers streams, when auth is off or when the certificate comes from another CA, and pass again
once the fault is undone. The OpenAI Python SDK, given a Bearer key, must stream through nginx.
"""

import json
import re
import secrets
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.credentials.material import KEY_PREFIX
from kit.credentials.tls import new_ca, new_server_cert
from kit.layout import SiteLayout
from tests.support.docker_engine import pick_free_port, remove_project
from tests.support.live_stack import kit, reload_nginx
from tests.support.sites import LLAMA_8B

pytestmark = pytest.mark.e2e

DOMAIN = "llm.test"  # not resolvable: the gate and the SDK connect to 127.0.0.1 and send it in SNI
SERVED_NAME = "tiny-chat"
EMBEDDER = "tiny-embed"  # an embedding model (vLLM's pooling runner): proven by an embedding


@dataclass
class Stack:
    spec: Path
    layout: SiteLayout
    nginx: object  # the docker-py Container of the site's nginx
    https_port: int

    def probe(self, *args: str) -> subprocess.CompletedProcess:
        return kit("probe", str(self.spec), "--timeout", "10", *args, timeout=120)

    def replace_in(self, path: Path, old: str, new: str) -> None:
        """Edit a rendered file in place (inside `faulted`, which restores it)."""
        text = path.read_text()
        assert old in text, f"{path} no longer contains {old!r}: update this test"
        path.write_text(text.replace(old, new))

    def reload_nginx(self) -> None:
        reload_nginx(self.nginx)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, test_images, docker_client) -> Iterator[Stack]:
    """A site of a generative and an embedding service brought up with `kit up` (which itself
    ends with the gate), shared by this module's tests: each puts back what it broke
    (`faulted`) and proves the gate passes again, so the next one meets the stack as kit
    rendered it."""
    site = f"gate{secrets.token_hex(3)}"
    tmp_path = tmp_path_factory.mktemp("gate")
    models = tmp_path / "models"
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text(json.dumps(LLAMA_8B))
    (models / "encoder").mkdir()
    (models / "encoder" / "config.json").write_text(
        json.dumps({**LLAMA_8B, "architectures": ["BertModel"]}))
    root = tmp_path / "site"
    root.mkdir()
    https_port, http_port = pick_free_port(), pick_free_port()
    spec = root / "site.yaml"
    spec.write_text(
        f"site: {site}\n"
        f"domain: {DOMAIN}\n"
        f"models_root: {models}\n"
        "healthcheck_interval: 1\n"
        "auth: {users: [ops], api_keys: true}\n"
        f"proxy: {{bind: 127.0.0.1, https_port: {https_port}, http_port: {http_port}}}\n"
        "services:\n"
        f"  - {{name: tiny, model: tiny, served_name: {SERVED_NAME}, gpus: [0], "
        "max_model_len: 4096}\n"
        f"  - {{name: encoder, model: encoder, served_name: {EMBEDDER}, gpus: [1], "
        "max_model_len: 4096, extra_args: [--runner, pooling]}\n"
    )
    try:
        up = kit("up", str(spec))
        assert up.returncode == 0, f"kit up failed:\n{up.stdout}\n{up.stderr}"
        assert "all checks passed" in up.stdout  # kit up ends with the gate
        labels = [f"com.docker.compose.project={site}", "com.docker.compose.service=nginx"]
        (nginx,) = docker_client.containers.list(filters={"label": labels})
        yield Stack(spec, SiteLayout(root), nginx, https_port)
    finally:
        remove_project(docker_client, site)


@contextmanager
def faulted(stack: Stack, *paths: Path) -> Iterator[None]:
    """Inside: the caller edits `paths` and reloads nginx. After (also when an assertion
    failed): the original bytes back, nginx reloaded, and the gate passing again."""
    originals = {path: path.read_bytes() for path in paths}
    try:
        yield
    finally:
        for path, content in originals.items():
            path.write_bytes(content)
        stack.reload_nginx()
    assert_gate_passes(stack)


def assert_gate_fails(stack: Stack, reason: str) -> None:
    result = stack.probe()
    assert result.returncode == 1, f"the gate passed despite the fault:\n{result.stdout}"
    assert reason in result.stdout, result.stdout


def assert_gate_passes(stack: Stack) -> dict:
    result = stack.probe("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_the_gate_passes_on_the_rendered_stack(stack: Stack) -> None:
    result = assert_gate_passes(stack)
    names = {check["name"] for check in result["checks"]}
    assert {"tls", "auth-required", f"stream {SERVED_NAME}", f"embed {EMBEDDER}",
            "closed /metrics"} <= names
    assert not {f"chat {EMBEDDER}", f"stream {EMBEDDER}"} & names
    assert json.loads(stack.layout.last_probe.read_text())["ok"] is True


def test_the_gate_fails_when_nginx_buffers_streams(stack: Stack) -> None:
    """The usage ledger's body filter flushes each buffer it passes on, which keeps a stream
    unbuffered whatever proxy_buffering says: the fault is a door without it too."""
    conf = stack.layout.nginx_conf
    with faulted(stack, conf):
        stack.replace_in(conf, "proxy_buffering off;", "proxy_buffering on;")
        stack.replace_in(conf, "js_body_filter usage.filter", "# js_body_filter usage.filter")
        stack.reload_nginx()
        assert_gate_fails(stack, "the proxy buffers SSE — proxy_buffering must be off")


def test_the_gate_fails_when_auth_is_off(stack: Stack) -> None:
    conf = stack.layout.nginx_conf
    with faulted(stack, conf):
        stack.replace_in(conf, "auth_request /_kit/auth;", "")
        stack.reload_nginx()
        assert_gate_fails(stack, "unauthenticated request got 200: auth is off")


def test_the_gate_fails_with_a_certificate_from_another_ca(stack: Stack) -> None:
    layout = stack.layout
    with faulted(stack, layout.server_cert, layout.server_key):
        cert, key = new_server_cert(DOMAIN, *new_ca("not-the-kit-ca"))
        layout.server_cert.write_bytes(cert)
        layout.server_key.write_bytes(key)
        stack.reload_nginx()
        assert_gate_fails(stack, "the server certificate is not signed by the kit CA")


def test_the_openai_sdk_streams_through_nginx_with_a_bearer_key(stack: Stack) -> None:
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx2")  # the HTTP client of openai>=3

    class ToLoopback(httpx.HTTPTransport):
        """Connect to 127.0.0.1 while SNI, the certificate check and Host keep the domain."""

        def handle_request(self, request):
            request.url = request.url.copy_with(host="127.0.0.1")
            request.extensions["sni_hostname"] = DOMAIN
            return super().handle_request(request)

    added = kit("keys", "add", str(stack.spec), "sdk-test", timeout=120)
    assert added.returncode == 0, added.stdout + added.stderr
    key = re.search(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]+", added.stdout).group(0)
    trust = ssl.create_default_context(cafile=str(stack.layout.ca_cert))

    def client(api_key: str):
        return openai.OpenAI(
            base_url=f"https://{DOMAIN}:{stack.https_port}/v1", api_key=api_key, max_retries=0,
            http_client=httpx.Client(transport=ToLoopback(verify=trust)),
        )

    stream = client(key).chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Count to ten."}],
        max_tokens=16, stream=True,
    )
    pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) >= 2 and "".join(p or "" for p in pieces).strip()

    vectors = client(key).embeddings.create(model=EMBEDDER, input=["one text", "another"])
    assert len(vectors.data) == 2 and vectors.data[0].embedding and vectors.usage.prompt_tokens

    with pytest.raises(openai.AuthenticationError):
        client(KEY_PREFIX + "not-a-key").models.list()
