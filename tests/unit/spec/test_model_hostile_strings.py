"""Property: a hostile string in any string field of the spec is refused (exit 2, no traceback)
or renders an nginx.conf of the same shape as a plain value does, which `nginx -t` accepts.

Hypothesis inserts newlines, `%`, `;`, braces, `$`, quotes, backslashes, NUL, unicode and long
runs into each field's ordinary value (the near-valid strings most likely to slip through), and
also tries arbitrary text. Derandomised, so CI runs the same examples every time.
"""

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from kit.errors import BadInput
from kit.plan.build import build_plan
from kit.plan.host import load_spec
from kit.render.site_files import generated_files
from kit.spec.model import Spec
from tests.support import nginx_ns
from tests.support.adapters import adapter_weights, write_adapter
from tests.support.cli import run_kit
from tests.support.compose import services_of
from tests.support.nginx_structure import structure
from tests.support.pinned_site import MODEL, pinned_on_disk
from tests.support.sites import LLAMA_8B
from tests.support.tls_files import ca_bundle, certificate

EXAMPLES_PER_FIELD = 40
NGINX_CHECKS_PER_FIELD = 2  # nginx -t runs (~0.3 s each) on accepted values that changed the conf

PIECES = [
    "\n", "\r\n", "%", "%eth0", ";", "{", "}", "$", "$kit_auth_epoch", "${HOME}", "'", '"', "\\",
    "\x00", "#", " ", "\t", "é", "\u2028", "\u202e", "\ufeff", "*", "&a", "!!", "|", ":", "@",
    "..", "/", "~", "`", "; } server { listen 1; #", '" "@kit_x"; default "', "\n  evil: 1",
    "%x; location ~ chat { js_content kit.route; } #",  # issue 8: Python's IPv6 parser takes it
    "a" * 300,
]
# Characters some fields allow: values that pass and must still leave nginx.conf's shape alone.
BENIGN = [".", "-", "_", ":", "/", "0", "9", "A", "z", "1k"]
Setter = Callable[[dict, str], None]


def at(*path: Any, mode: str | None = None) -> Setter:
    """Set the value at `path` (and the tls.mode that makes kit read it)."""

    def setter(data: dict, value: str) -> None:
        if mode:
            data["tls"] = {"mode": mode, **TLS_NEEDS[mode]}
        target = data
        for part in path[:-1]:
            target = target[part] if isinstance(target, list) else target.setdefault(part, {})
        target[path[-1]] = value

    return setter


def env_name(data: dict, value: str) -> None:
    data["services"][0]["env"] = {value: "1"}


def interface(data: dict, value: str) -> None:
    """network_interface, read only for a service that spans nodes."""
    data["services"][0]["nodes"] = [{"name": "test01", "address": "10.0.0.1"},
                                    {"name": "gpu02", "address": "10.0.0.2"}]
    data["services"][0]["network_interface"] = value
def revision(data: dict, value: str) -> None:
    """A pinned service: its model pulled and locked at `main` (other revisions: no entry)."""
    models = Path(data["models_root"])
    pinned_on_disk(models, models.parent / "site")
    data["services"][0].update(model=MODEL, revision=value)


def routing(key: str, affinity: str) -> Setter:
    """A routing value of a two-replica service (one replica renders no affinity)."""

    def setter(data: dict, value: str) -> None:
        fields = {"affinity": affinity, "header": "X-Session-ID"} if affinity == "header" else {}
        data["services"][0].update(gpus=[0, 1], tensor_parallel=1,
                                   routing={**fields, key: value})

    return setter


def adapter(key: str) -> Setter:
    """One adapter of the service: the fixture's folder `support`, or (revision) the Hub
    adapter org/support pinned in the fixture's hf_cache beside models_root."""

    def setter(data: dict, value: str) -> None:
        entry = {"name": "support-v3", "path": "support"}
        if key == "revision":
            entry["path"] = "org/support"
            data["hf_cache"] = str(Path(data["models_root"]).parent / "hf")
        data["services"][0]["adapters"] = [{**entry, key: value}]

    return setter


def swap_group(data: dict, value: str) -> None:
    """Both services of a swap group take the name (a lone member is refused whatever its
    name)."""
    sleep = {"after": "15m", "swap_group": value}
    data["services"][0]["idle_sleep"] = sleep
    data["services"].append({"name": "coder", "model": "llama-8b", "served_name": "coder",
                             "gpus": [0], "max_model_len": 4096, "idle_sleep": dict(sleep)})


def min_awake(data: dict, value: str) -> None:
    """A swap group's member's min_awake (refused outside a swap group whatever its value)."""
    swap_group(data, "gpu0")
    data["services"][0]["idle_sleep"]["min_awake"] = value


def receiver(*path: str) -> Setter:
    """A value of an alert receiver (observability.alerts): a webhook, an email or Slack."""

    def setter(data: dict, value: str) -> None:
        entry: dict = {"email": {"to": "ops@test.example", "from": "kit@test.example",
                                 "smtp": {"host": "smtp.test.internal", "username": "kit",
                                          "password_file": "smtp.pw"}}}
        if path[0] == "webhook":
            entry = {"webhook": {"url_file": "hook.url"}}
        elif path[0] == "slack_webhook_file":
            entry = {}
        target = entry
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        data["observability"] = {"enabled": True, "alerts": {"receivers": [entry]}}

    return setter


TLS_NEEDS = {
    "acme": {"email": "ops@test.example"},
    "files": {"cert": "server.pem", "key": "server.key"},
}
S = ("services", 0)
# Every string the spec holds (test_the_fields_cover_every_string_in_the_spec keeps this whole),
# each with a plain value the hostile pieces are inserted into.
FIELDS: dict[str, tuple[Setter, str]] = {
    "site": (at("site"), "test01"),
    "domain": (at("domain"), "llm.test.internal"),
    "domain=ip": (at("domain"), "fe80::1"),
    "engine": (at("engine"), "ssh://ops@gpu01.test.internal:2222"),
    "engine=unix": (at("engine"), "unix:///run/docker.sock"),
    "models_root": (at("models_root"), "/srv/models"),
    "hf_cache": (at("hf_cache"), "/srv/hf"),
    "images.vllm": (at("images", "vllm"), "vllm/vllm-openai:v0.33.0"),
    "images.nginx": (at("images", "nginx"), "nginx:1.27-alpine"),
    "images.certbot": (at("images", "certbot"), "certbot/certbot:v3.1.0"),
    "images.prometheus": (at("images", "prometheus"), "prom/prometheus:v3.5.0"),
    "images.grafana": (at("images", "grafana"), "grafana/grafana:12.1.1"),
    "images.alertmanager": (at("images", "alertmanager"), "prom/alertmanager:v0.33.1"),
    "observability.alerts.receivers.webhook.url_file": (receiver("webhook", "url_file"),
                                                        "hook.url"),
    "observability.alerts.receivers.slack_webhook_file": (receiver("slack_webhook_file"),
                                                          "slack.url"),
    "observability.alerts.receivers.email.to": (receiver("email", "to"), "ops@test.example"),
    "observability.alerts.receivers.email.sender": (receiver("email", "from"),
                                                    "kit@test.example"),
    "observability.alerts.receivers.email.smtp.host": (receiver("email", "smtp", "host"),
                                                       "smtp.test.internal"),
    "observability.alerts.receivers.email.smtp.username": (
        receiver("email", "smtp", "username"), "kit"),
    "observability.alerts.receivers.email.smtp.password_file": (
        receiver("email", "smtp", "password_file"), "smtp.pw"),
    "tls.mode": (at("tls", "mode"), "self-signed"),
    "tls.cert": (at("tls", "cert", mode="files"), "server.pem"),
    "tls.key": (at("tls", "key", mode="files"), "server.key"),
    "tls.email": (at("tls", "email", mode="acme"), "ops@test.example"),
    "tls.acme_server": (at("tls", "acme_server", mode="acme"), "https://acme.test/dir"),
    "tls.ca_bundle": (at("tls", "ca_bundle", mode="acme"), "ca.pem"),
    "auth.users": (at("auth", "users", 0), "ops"),
    "proxy.bind": (at("proxy", "bind"), "::"),
    "proxy.max_body": (at("proxy", "max_body"), "4m"),
    "proxy.rate_limit_per_ip": (at("proxy", "rate_limit_per_ip"), "auto"),
    "proxy.rate_limit_per_credential": (at("proxy", "rate_limit_per_credential"), "auto"),
    "proxy.max_connections_per_ip": (at("proxy", "max_connections_per_ip"), "auto"),
    "services.name": (at(*S, "name"), "llama8b"),
    "services.model": (at(*S, "model"), "llama-8b"),
    "services.served_name": (at(*S, "served_name"), "llama-3.1-8b"),
    "services.revision": (revision, "main"),
    "services.max_num_seqs": (at(*S, "max_num_seqs"), "auto"),
    "services.api_servers": (at(*S, "api_servers"), "auto"),
    "services.dtype": (at(*S, "dtype"), "bfloat16"),
    "services.quantization": (at(*S, "quantization"), "fp8"),
    "services.kv_cache_dtype": (at(*S, "kv_cache_dtype"), "fp8"),
    "services.extra_args": (at(*S, "extra_args", 0), "--enable-prefix-caching"),
    "services.routing.affinity": (routing("affinity", "prefix"), "prefix"),
    "services.routing.header": (routing("header", "header"), "X-Session-ID"),
    "services.env.name": (env_name, "HF_HUB_OFFLINE"),
    "services.env.value": (at(*S, "env", "HF_HUB_OFFLINE"), "1"),
    "services.network_interface": (interface, "ens5f0"),
    "services.adapters.name": (adapter("name"), "support-v3"),
    "services.adapters.path": (adapter("path"), "support"),
    "services.adapters.revision": (adapter("revision"), "main"),
    "services.adapters.sha256": (adapter("sha256"), hashlib.sha256(adapter_weights()).hexdigest()),
    "services.idle_sleep.after": (at(*S, "idle_sleep", "after"), "15m"),
    "services.idle_sleep.swap_group": (swap_group, "gpu0"),
    "services.idle_sleep.min_awake": (min_awake, "30s"),
    "observability.subnet": (at("observability", "subnet"), "10.89.7.0/28"),
    "usage.max_disk": (at("usage", "max_disk"), "2g"),
    "kubernetes.service_type": (at("kubernetes", "service_type"), "LoadBalancer"),
}


def base_spec(models: Path) -> dict:
    return {
        "site": "test01", "domain": "llm.test.internal", "models_root": str(models),
        "tls": {"mode": "self-signed"}, "auth": {"users": ["ops"], "api_keys": True},
        "proxy": {"bind": "127.0.0.1", "https_port": 8443, "http_port": 8080},
        "services": [{"name": "llama8b", "model": "llama-8b", "served_name": "llama-3.1-8b",
                      "gpus": [0], "max_model_len": 8192, "max_num_seqs": 64,
                      "extra_args": ["--enable-prefix-caching"], "env": {"HF_HUB_OFFLINE": "1"}}],
    }


def string_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted names of every field of the spec models that holds text (str or a path)."""
    found = set()
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        nested = next((arg for arg in (info.annotation, *getattr(info.annotation, "__args__", ()))
                       if isinstance(arg, type) and issubclass(arg, BaseModel)), None)
        if nested is not None:
            found |= string_fields(nested, f"{dotted}.")
        elif any(kind in repr(info.annotation) for kind in ("str", "Path", "Literal")):
            found.add(dotted)
    return found


def test_the_fields_cover_every_string_in_the_spec() -> None:
    fields = {name.partition("=")[0] for name in FIELDS}
    env = {"services.env.name", "services.env.value"}  # the keys and values of one dict
    assert string_fields(Spec) == fields - env | {"services.env"}


@pytest.fixture(scope="module")
def site_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    (root / "models" / "llama-8b").mkdir(parents=True)
    (root / "models" / "llama-8b" / "config.json").write_text(json.dumps(LLAMA_8B))
    write_adapter(root / "models" / "support", base="llama-8b")
    hub = root / "hf" / "hub" / "models--org--support"
    write_adapter(hub / "snapshots" / ("c" * 40), base="llama-8b")
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("c" * 40)
    (root / "site").mkdir()
    certificate("llm.test.internal")(root / "site")  # for tls.mode files
    ca_bundle("ca")(root / "site")  # for tls.ca_bundle
    return root


def hostile(plain: str) -> st.SearchStrategy[str]:
    """Hostile (or allowed) pieces inserted into the plain value, or arbitrary text."""

    def inserted(pieces: list[str]) -> st.SearchStrategy[str]:
        return st.builds(
            lambda chosen, positions: _insert(plain, chosen, positions),
            st.lists(st.sampled_from(pieces), min_size=1, max_size=3),
            st.lists(st.integers(0, len(plain)), min_size=3, max_size=3),
        )

    any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
    appended = st.sampled_from(PIECES).map(lambda piece: plain + piece)  # the usual attack
    variants = st.sampled_from([plain + "0", "0" + plain, plain.upper(), plain * 200])
    return st.one_of(appended, inserted(PIECES), appended, inserted(PIECES + BENIGN),
                     inserted(BENIGN), any_text, variants)


def _insert(plain: str, pieces: list[str], positions: list[int]) -> str:
    value = plain
    for piece, position in zip(pieces, positions, strict=False):
        value = value[:position] + piece + value[position:]
    return value


def nginx_conf(spec_path: Path) -> str:
    plan = build_plan(load_spec(spec_path))
    return next(o.content for o in generated_files(plan, "site.yaml")
                if o.path.name == "nginx.conf").decode()


def shape(field: str, value: str, conf: str) -> tuple:
    """nginx.conf's structure; an affinity header is read as its own `$http_*` variable, so
    that one variable stands for it (its name is allow-listed: letters, digits and `-`)."""
    directives, variables = structure(conf)
    if field == "services.routing.header":
        variables = variables - {"http_" + value.lower().replace("-", "_")} | {"<header>"}
    return directives, variables


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_hostile_string_is_refused_or_changes_no_structure(site_root: Path, field: str) -> None:
    setter, plain = FIELDS[field]
    spec_path = site_root / "site" / "site.yaml"

    def write(value: str) -> None:
        data = copy.deepcopy(base_spec(site_root / "models"))
        setter(data, value)
        spec_path.write_text(yaml.safe_dump(data, allow_unicode=True))

    write(plain)
    plain_conf = nginx_conf(spec_path)
    changed: list[str] = []  # accepted values that changed nginx.conf: nginx -t checks a few

    @settings(max_examples=EXAMPLES_PER_FIELD, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(value=hostile(plain))
    def check(value: str) -> None:
        write(value)
        result = run_kit("validate", str(spec_path))
        assert result.exit_code in (0, 2), result.output  # a bug raises (run_kit)
        if result.exit_code == 2:
            assert str(spec_path) in result.output
            return
        try:
            conf = nginx_conf(spec_path)
        except BadInput as error:  # validate passed, so render must not refuse
            raise AssertionError(f"validate accepted {value!r}, render refused: {error}") from None
        assert shape(field, value, conf) == shape(field, plain, plain_conf), (
            f"{value!r} changed nginx.conf's shape")
        if conf != plain_conf and len(changed) < NGINX_CHECKS_PER_FIELD:
            changed.append(value)

    check()
    if changed and nginx_ns.available() is None:
        for value in changed:
            write(value)
            result = run_kit("render", "--force", str(spec_path))
            assert result.exit_code == 0, result.output
            site = spec_path.parent
            checked = nginx_ns.nginx_t(site / "nginx", services_of(site))
            assert checked.returncode == 0, f"{value!r}: {checked.stderr}"
