"""Rendered files are accepted by the real tools: nginx -t (1.22) and docker-compose config."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kit.credentials.tls import new_ca, new_server_cert
from kit.engine.desired import VERIFIER_SERVICE, load_desired
from kit.layout import SiteLayout
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries, services_of
from tests.support.sites import BASE_SPEC, LLAMA_8B, REPO, spec_in_folder

BIG = """\
site: big
domain: 10.1.2.3
models_root: {models}
hf_cache: {models}/hf
gpu_memory_gib: 80
tls: {tls}
auth: {{users: [ops, alice], api_keys: false}}
proxy: {{bind: "::", https_port: 9443, http_port: 9080, max_body: 4m, read_timeout: 1800}}
services:
  - {{name: big70b, model: llama-8b, gpus: [0, 1, 2, 3], max_model_len: 8192,
      max_num_seqs: 128, gpu_memory_utilization: 0.92}}
  - {{name: qwen, model: Qwen/Qwen2.5-7B-Instruct, served_name: Default, gpus: [4, 5],
      max_num_seqs: 64}}
  - {{name: small-a, model: llama-8b, served_name: default, gpus: [6], max_num_seqs: 32,
      gpu_memory_utilization: 0.45, kv_cache_dtype: fp8}}
  - {{name: small-b, model: llama-8b, served_name: org/small:b, gpus: [6, 7],
      max_num_seqs: 16, gpu_memory_utilization: 0.45, dtype: bfloat16,
      extra_args: ["--enforce-eager"],
      env: {{HF_HUB_OFFLINE: "1", HF_TOKEN: hf_abc, NOTE: 'a "b" \\ #c {{d}} ü ', EMPTY: ""}}}}
"""


# Served names that were nginx `map` keywords, and two that differ only in case: vLLM tells them
# apart, and so does the front door's exact routing (kit-routes.json), so the spec accepts them.


def variants(root: Path) -> dict[str, Path]:
    models = root / "models"
    (models / "llama-8b").mkdir(parents=True)
    (models / "llama-8b" / "config.json").write_text(json.dumps(LLAMA_8B))
    site = root / "site"
    site.mkdir()
    (site / "site.yaml").write_text(BASE_SPEC.format(models_root=models))
    example_site = spec_in_folder(REPO / "site.yaml", root / "example")
    big = root / "big"
    big.mkdir()
    (big / "site.yaml").write_text(BIG.format(models=models, tls="{mode: self-signed}"))
    files = root / "files"
    files.mkdir()
    ca_cert, ca_key = new_ca("files")
    cert, key = new_server_cert("llm.test.internal", ca_cert, ca_key)
    (files / "server.pem").write_bytes(cert)
    (files / "server.key").write_bytes(key)
    (files / "site.yaml").write_text(
        (site / "site.yaml").read_text().replace(
            "tls: {mode: self-signed}", "tls: {mode: files, cert: server.pem, key: server.key}"
        )
    )
    acme = root / "acme"
    acme.mkdir()
    (acme / "site.yaml").write_text(
        (site / "site.yaml").read_text().replace(
            "tls: {mode: self-signed}",
            "tls: {mode: acme, email: ops@test.example, staging: true}",
        )
    )
    replicas = spec_in_folder(REPO / "tests" / "data" / "replicas" / "site.yaml", root / "replicas")
    return {"base": site, "example": example_site, "big": big, "files": files, "acme": acme,
            "replicas": replicas}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = variants(tmp_path_factory.mktemp("variants"))
    for name, folder in found.items():
        result = run_kit("render", str(folder / "site.yaml"))
        assert result.exit_code == 0, f"{name}: {result.output}"
    return found


def test_nginx_accepts_every_rendered_config(rendered: dict[str, Path]) -> None:
    reason = nginx_ns.available()
    if reason:
        pytest.skip(reason)
    for name, folder in rendered.items():
        for result in (nginx_ns.nginx_t(folder / "nginx", services_of(folder)),
                       nginx_ns.verifier_t(folder / "nginx")):
            assert result.returncode == 0, f"{name}: {result.stderr}"
            assert "test is successful" in result.stderr


def test_nginx_rejects_a_broken_config(rendered: dict[str, Path]) -> None:
    """The harness itself can fail: a config naming an unknown upstream host is refused."""
    reason = nginx_ns.available()
    if reason:
        pytest.skip(reason)
    result = nginx_ns.nginx_t(rendered["base"] / "nginx", [])
    assert result.returncode != 0 and "host not found in upstream" in result.stderr


@pytest.mark.parametrize("variant", ["base", "example", "big", "files", "acme", "replicas"])
def test_compose_accepts_the_rendered_file(rendered: dict[str, Path], variant: str) -> None:
    binaries = compose_binaries()
    if not binaries:
        pytest.skip("neither docker-compose v1 nor v2 is installed (scripts/test.sh installs them)")
    folder = rendered[variant]
    for binary in binaries:
        result = subprocess.run(
            [*binary, "-p", "kit-config-test", "-f", "compose/docker-compose.yml", "config", "-q"],
            cwd=folder, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, f"{binary} {variant}: {result.stderr}"


@pytest.mark.parametrize("variant", ["big", "example", "replicas"])
def test_compose_reads_the_env_files_as_kit_up_does(
    rendered: dict[str, Path], variant: str
) -> None:
    """docker-compose v1 and v2 see exactly the environment kit up gives each container."""
    binaries = compose_binaries()
    if not binaries:
        pytest.skip("neither docker-compose v1 nor v2 is installed (scripts/test.sh installs them)")
    folder = rendered[variant]
    desired = load_desired(SiteLayout(folder), "kit-config-test")
    for binary in binaries:
        result = subprocess.run(
            [*binary, "-p", "kit-config-test", "-f", "compose/docker-compose.yml", "config"],
            cwd=folder, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        services = yaml.safe_load(result.stdout)["services"]
        for service in desired.services:
            seen = {k: str(v) for k, v in (services[service.name].get("environment") or {}).items()}
            assert seen == dict(service.config.environment), f"{binary} {service.name}"
    assert "hf_abc" not in (folder / "compose" / "docker-compose.yml").read_text()


def test_compose_structure(rendered: dict[str, Path]) -> None:
    compose = yaml.safe_load((rendered["big"] / "compose" / "docker-compose.yml").read_text())
    assert "name" not in compose  # compose v1 rejects a top-level name
    services = compose["services"]
    expected_gpus = {"big70b": ["0", "1", "2", "3"], "qwen": ["4", "5"], "small-a": ["6"],
                     "small-b": ["6", "7"]}
    for name, gpus in expected_gpus.items():
        service = services[name]
        assert "ports" not in service and "expose" not in service, name
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": gpus, "capabilities": ["gpu"]}]
        assert service.get("ipc") == ("host" if len(gpus) > 1 else None), name
        assert service["restart"] == "unless-stopped"
        assert service["logging"]["options"]["max-size"] == "50m"
        assert service["healthcheck"]["start_period"].endswith("s")
        mounts = {m["target"]: m for m in service["volumes"]}
        assert mounts["/models"]["read_only"] is True
        assert "/root/.cache/huggingface" in mounts
        command = service["command"]
        assert command[command.index("--tensor-parallel-size") + 1] == str(len(gpus))
        assert command[command.index("--port") + 1] == "8000"
        # `vllm serve` is the entrypoint, the model its first argument (never a flag, no --model)
        assert service["entrypoint"] == ["vllm", "serve"], name
        assert not command[0].startswith("-") and "--model" not in command, name
        assert "serve" not in command, name
    assert services["qwen"]["command"][0] == "Qwen/Qwen2.5-7B-Instruct"  # a Hub id, not /models
    assert services["big70b"]["command"][0].startswith("/models/")
    nginx = services["nginx"]
    assert nginx["ports"] == ["[::]:9443:443", "[::]:9080:80"]
    assert set(nginx["depends_on"]) == set(expected_gpus) | {VERIFIER_SERVICE}
    assert all(v == {"condition": "service_healthy"} for v in nginx["depends_on"].values())
    assert nginx["volumes"][0]["read_only"] is True and nginx["read_only"] is True
    # the verifier: no port, only the internal auth network, which the front door shares
    verifier = services[VERIFIER_SERVICE]
    assert "ports" not in verifier and verifier["networks"] == ["auth"]
    assert compose["networks"]["auth"] == {"internal": True} and "auth" in nginx["networks"]
    assert verifier["image"] == nginx["image"] and verifier["read_only"] is True
    assert all(m["read_only"] for m in verifier["volumes"])
    # only qwen downloads (a Hub id): only its network goes out; the others' replicas get no
    # route out, whatever their neighbour downloads
    assert {name: compose["networks"][f"backend-{name}"]["internal"]
            for name in expected_gpus} == {"big70b": True, "qwen": False, "small-a": True,
                                           "small-b": True}


def test_nginx_conf_has_the_streaming_and_security_essentials(rendered: dict[str, Path]) -> None:
    conf = (rendered["big"] / "nginx" / "nginx.conf").read_text()
    for line in (
        "proxy_buffering off;", "proxy_cache off;", "proxy_http_version 1.1;",
        'proxy_set_header Connection "";', "gzip off;", "add_header X-Accel-Buffering no always;",
        "proxy_read_timeout 1800s;", "send_timeout 1800s;", "client_max_body_size 4m;",
        "ssl_protocols TLSv1.2 TLSv1.3;", "Strict-Transport-Security", "auth_request /_kit/auth;",
        'proxy_set_header Authorization "";', "return 301 https://10.1.2.3:9443$request_uri;",
        "location @kit_small_b {", "proxy_next_upstream error non_idempotent;",
    ):
        assert line in conf, line
    routes = (rendered["big"] / "nginx" / "kit-routes.json").read_text()
    assert '"org/small:b": "small-b"' in routes  # routing is an exact lookup, not an nginx map
    assert "map $kit_model" not in conf
    assert "include /etc/nginx/kit/auth/keys.map;" not in conf  # api_keys: false
    for path in ("/invocations", "/tokenize", "/docs", "location = /metrics {"):
        assert path not in conf


def test_acme_mode_renders_certbot_and_the_challenge(rendered: dict[str, Path]) -> None:
    folder = rendered["acme"]
    compose = yaml.safe_load((folder / "compose" / "docker-compose.yml").read_text())
    certbot = compose["services"]["certbot"]
    loop = certbot["command"][0].replace("$$", "$")  # compose reads $$ as a literal $
    for part in ("certbot certonly --webroot -w /var/www/acme -d llm.test.internal",
                 "--email ops@test.example", "--keep-until-expiring", "--staging",
                 "cmp -s /etc/letsencrypt/live/kit/fullchain.pem /kit-tls/server.crt || ",
                 "mv -f /kit-tls/.server.crt.new /kit-tls/server.crt",
                 "[ $rc = 0 ] && next=43200;", "sleep $next & wait", ">/kit-tls/acme-last-run.new"):
        assert part in loop, part
    # a failed run's outcome: when the next run is, and the CA's problem from certbot's log
    for part in ("next=$delay; [ $rc = 0 ] && next=43200;", 'echo "exit=$rc at=$(date +%s) '
                 'next=$next"', "[ $rc = 0 ] || grep -m 1 -F 'acme.messages.Error: ' "
                 "/var/log/letsencrypt/letsencrypt.log >>/kit-tls/.acme-run"):
        assert part in loop, part
    mounts = {m["target"]: m for m in certbot["volumes"]}
    assert mounts["/kit-tls"]["source"] == "../nginx/tls"
    nginx = compose["services"]["nginx"]
    assert nginx["command"][:2] == ["/bin/sh", "-c"]
    assert "nginx -c /etc/nginx/kit/nginx.conf -s reload" in nginx["command"][2]
    assert {"acme-webroot", "letsencrypt", "hf-cache-llama8b"} <= set(compose["volumes"])
    conf = (folder / "nginx" / "nginx.conf").read_text()
    assert "location ^~ /.well-known/acme-challenge/ {" in conf
    assert "ssl_stapling on;" in conf
    # first start: a bootstrap certificate until certbot installs the real one, which render keeps
    server_cert = folder / "nginx" / "tls" / "server.crt"
    assert server_cert.is_file()
    other_ca, other_key = new_ca("public-ca")
    cert, key = new_server_cert("llm.test.internal", other_ca, other_key)
    server_cert.write_bytes(cert)
    (folder / "nginx" / "tls" / "server.key").write_bytes(key)
    assert run_kit("render", str(folder / "site.yaml")).exit_code == 0
    assert server_cert.read_bytes() == cert


def test_a_private_acme_ca_is_mounted_read_only_into_certbot_and_trusted_there(
    rendered: dict[str, Path], tmp_path: Path,
) -> None:
    """tls.ca_bundle: certbot's HTTPS client (requests) trusts it for the directory, read-only;
    without it certbot keeps its image's store."""
    assert "environment" not in yaml.safe_load(
        (rendered["acme"] / "compose" / "docker-compose.yml").read_text())["services"]["certbot"]
    folder = tmp_path / "private"
    folder.mkdir()
    ca_cert = new_ca("private-acme")[0]
    (folder / "step-root.pem").write_bytes(ca_cert)
    (folder / "site.yaml").write_text((rendered["acme"] / "site.yaml").read_text().replace(
        "staging: true", "acme_server: 'https://ca.internal:9000/acme/acme/directory', "
        "ca_bundle: step-root.pem"))
    result = run_kit("render", str(folder / "site.yaml"))
    assert result.exit_code == 0, result.output
    compose = yaml.safe_load((folder / "compose" / "docker-compose.yml").read_text())
    certbot = compose["services"]["certbot"]
    assert certbot["environment"] == {"REQUESTS_CA_BUNDLE": "/kit-trust/ca-bundle.pem"}
    mounts = {m["target"]: m for m in certbot["volumes"]}
    assert mounts["/kit-trust"] == {"type": "bind", "source": "../nginx/trust",
                                    "target": "/kit-trust", "read_only": True}
    assert (folder / "nginx" / "trust" / "ca-bundle.pem").read_bytes() == ca_cert


def test_routing_tells_apart_names_that_differ_in_case(rendered: dict[str, Path]) -> None:
    routes = (rendered["big"] / "nginx" / "kit-routes.json").read_text()
    body = json.loads(routes[routes.index("{"):routes.rindex("}") + 1])
    assert body["default"] == "small-a" and body["Default"] == "qwen"
    assert body["org/small:b"] == "small-b" and body["big70b"] == "big70b"
