"""The rendered compose file → desired state: names, labels, engine config, config hash."""

from pathlib import Path

import pytest
import yaml

from kit.engine.desired import (
    COMPOSE_VERSION,
    CONFIG_FILES_LABEL,
    CONFIG_HASH_LABEL,
    CONTAINER_NUMBER_LABEL,
    ONEOFF_LABEL,
    PROJECT_LABEL,
    SERVICE_LABEL,
    VERIFIER_SERVICE,
    VERSION_LABEL,
    WORKING_DIR_LABEL,
    Healthcheck,
    Mount,
    PortBinding,
    load_desired,
    parse_compose,
    parse_duration,
)
from kit.errors import KitError
from kit.layout import SiteLayout
from kit.plan.observability import metrics_network
from tests.support.fake_stack import rendered
from tests.support.sites import write_site


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return write_site(tmp_path)


def test_names_order_and_networks_follow_compose_v2(site: Path) -> None:
    desired = rendered(site)
    # backends and the verifier first
    assert [s.name for s in desired.services] == [
        "alpha", "beta", "kit-auth", "nginx", "usage-ledger"]
    assert [s.container_name for s in desired.services] == [
        "unit01-alpha-1", "unit01-beta-1", "unit01-kit-auth-1", "unit01-nginx-1",
        "unit01-usage-ledger-1",
    ]
    assert [(n.name, n.internal) for n in desired.networks] == [
        ("unit01_backend", True),  # kit's own parts the door reaches: no replica
        ("unit01_backend-alpha", True), ("unit01_backend-beta", True),  # one per service
        ("unit01_frontend", False), ("unit01_auth", True),
        ("unit01_metrics", True),  # the front door and the usage ledger while observability is off
    ]
    assert [v.name for v in desired.volumes] == [
        "unit01_hf-cache-alpha", "unit01_hf-cache-beta", "unit01_door-figures",
        "unit01_usage-spool", "unit01_usage-ledger"]
    assert desired.service("nginx").depends_on == (
        ("alpha", "service_healthy"), ("beta", "service_healthy"),
        ("kit-auth", "service_healthy"),
    )


def test_engine_config_is_what_the_file_says(site: Path) -> None:
    desired = rendered(site)
    beta = desired.service("beta").config
    assert desired.service("beta").gpu_ids == ("1", "2")
    assert beta.gpus[0].driver == "nvidia" and beta.gpus[0].capabilities == ("gpu",)
    models = str(site.parent.parent / "models")
    assert Mount("bind", models, "/models", read_only=True) in beta.mounts
    assert Mount("volume", "unit01_hf-cache-beta", "/root/.cache/huggingface", False) in beta.mounts
    assert beta.ipc_mode == "host"  # tensor parallel 2
    assert beta.restart == "unless-stopped" and beta.stop_timeout == 30
    assert beta.log_driver == "json-file" and dict(beta.log_options) == {
        "max-size": "50m", "max-file": "5",
    }
    assert beta.networks == ("unit01_backend-beta",)  # its own, never alpha's
    assert beta.healthcheck is not None and beta.healthcheck.interval == 1.0
    assert "--max-num-seqs" in beta.command
    nginx = desired.service("nginx").config
    assert nginx.ports == (
        PortBinding("127.0.0.1", 18443, 443), PortBinding("127.0.0.1", 18080, 80),
    )
    assert Mount("bind", str(site.parent / "nginx"), "/etc/nginx/kit", True) in nginx.mounts
    assert nginx.read_only and set(nginx.tmpfs) == {"/var/cache/nginx", "/run", "/tmp"}
    assert nginx.security_opt == ("no-new-privileges:true",)
    assert nginx.ulimits == ()  # worker_rlimit_nofile in nginx.conf: a reload applies it
    assert nginx.stop_signal == "SIGQUIT"
    assert nginx.networks == (
        "unit01_backend", "unit01_backend-alpha", "unit01_backend-beta", "unit01_frontend",
        "unit01_auth", "unit01_metrics")
    assert nginx.addresses == (("unit01_metrics", metrics_network("unit01", None).door),)
    verifier = desired.service(VERIFIER_SERVICE).config
    assert verifier.networks == ("unit01_auth",) and not verifier.ports
    assert Mount("bind", str(site.parent / "nginx" / "auth"), "/etc/nginx/kit-auth",
                 True) in verifier.mounts


def test_labels_are_the_ones_compose_reads(site: Path) -> None:
    desired = rendered(site)
    alpha = desired.service("alpha")
    labels = alpha.labels
    assert labels[PROJECT_LABEL] == "unit01"
    assert labels[SERVICE_LABEL] == "alpha"
    assert labels[CONTAINER_NUMBER_LABEL] == "1"
    assert labels[ONEOFF_LABEL] == "False"
    assert labels[CONFIG_HASH_LABEL] == alpha.config_hash
    assert labels[WORKING_DIR_LABEL] == str(site.parent / "compose")
    assert labels[CONFIG_FILES_LABEL] == str(site.parent / "compose" / "docker-compose.yml")
    assert labels[VERSION_LABEL] == COMPOSE_VERSION
    nginx_labels = desired.service("nginx").labels
    assert nginx_labels["com.docker.compose.depends_on"] == (
        "alpha:service_healthy:false,beta:service_healthy:false,kit-auth:service_healthy:false"
    )


def test_hash_is_stable_and_changes_only_for_the_changed_service(tmp_path: Path) -> None:
    before = rendered(write_site(tmp_path))
    again = rendered(write_site(tmp_path))
    assert [s.config_hash for s in before.services] == [s.config_hash for s in again.services]
    after = rendered(write_site(tmp_path, alpha_seqs=16))
    changed = {s.name for s, t in zip(before.services, after.services, strict=True)
               if s.config_hash != t.config_hash}
    assert changed == {"alpha"}


def test_proxy_config_change_is_a_files_change_not_a_hash_change(tmp_path: Path) -> None:
    before = rendered(write_site(tmp_path))
    after = rendered(write_site(tmp_path, read_timeout=300))
    assert [s.config_hash for s in before.services] == [s.config_hash for s in after.services]
    old, new = before.service("nginx"), after.service("nginx")
    assert old.reloadable and old.site_files_digest != new.site_files_digest


def test_a_credential_change_leaves_the_verifier_running(tmp_path: Path) -> None:
    """Its auth_basic re-reads htpasswd per request: no recreate (which would drop logins)."""
    spec = write_site(tmp_path)
    before = rendered(spec).service(VERIFIER_SERVICE)
    htpasswd = SiteLayout(spec.parent).htpasswd
    htpasswd.write_text(htpasswd.read_text() + "eve:$2y$12$" + "x" * 53 + "\n")
    verifier_conf = SiteLayout(spec.parent).verifier_conf
    assert load_desired(SiteLayout(spec.parent), "unit01").service(
        VERIFIER_SERVICE).config_hash == before.config_hash
    verifier_conf.write_text(verifier_conf.read_text() + "# changed\n")  # its own config: recreate
    assert load_desired(SiteLayout(spec.parent), "unit01").service(
        VERIFIER_SERVICE).config_hash != before.config_hash
    assert not before.reloadable


def document(extra_service_keys: dict | None = None) -> dict:
    return {
        "services": {
            "app": {
                "image": "busybox:1",
                "volumes": [{"type": "bind", "source": "../conf", "target": "/conf",
                             "read_only": True}],
                "networks": ["net"],
                **(extra_service_keys or {}),
            }
        },
        "networks": {"net": {}},
    }


def test_mounted_site_files_force_a_recreate_of_other_services(tmp_path: Path) -> None:
    """docker/compose#11900: editing a mounted file must not go unnoticed."""
    compose = tmp_path / "compose" / "docker-compose.yml"
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.ini").write_text("a=1\n")
    before = parse_compose(document(), "p", compose, tmp_path).service("app")
    (tmp_path / "conf" / "app.ini").write_text("a=2\n")
    after = parse_compose(document(), "p", compose, tmp_path).service("app")
    assert not before.reloadable
    assert before.config_hash != after.config_hash


def test_files_a_service_writes_are_state_not_config(tmp_path: Path) -> None:
    """A writable bind (certbot writing nginx/tls) must not recreate its writer on every change."""
    compose = tmp_path / "compose" / "docker-compose.yml"
    (tmp_path / "tls").mkdir()
    writer = {"entrypoint": ["/bin/sh", "-c"], "command": ["renew"],
              "volumes": [{"type": "bind", "source": "../tls", "target": "/out"}]}
    before = parse_compose(document(writer), "p", compose, tmp_path).service("app")
    (tmp_path / "tls" / "server.crt").write_text("renewed\n")
    after = parse_compose(document(writer), "p", compose, tmp_path).service("app")
    assert before.config.entrypoint == ("/bin/sh", "-c")
    assert before.site_files_digest is None
    assert before.config_hash == after.config_hash


def test_a_compose_key_kit_cannot_apply_is_refused(tmp_path: Path) -> None:
    compose = tmp_path / "docker-compose.yml"
    with pytest.raises(KitError, match="services.app uses privileged"):
        parse_compose(document({"privileged": True}), "p", compose, tmp_path)


def test_a_missing_compose_file_says_to_render(tmp_path: Path) -> None:
    with pytest.raises(KitError) as raised:
        load_desired(SiteLayout(tmp_path), "p")
    assert "does not exist" in raised.value.message and "kit render" in str(raised.value.fix)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), (15, 15.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "ten seconds", "5x", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(KitError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("port", "binding"),
    [
        ("127.0.0.1:8443:443", PortBinding("127.0.0.1", 8443, 443)),
        ("[::1]:8443:443", PortBinding("::1", 8443, 443)),
        ("::1:8443:443", PortBinding("::1", 8443, 443)),
        ("8080:80/udp", PortBinding("0.0.0.0", 8080, 80, "udp")),
    ],
)
def test_port_syntax(tmp_path: Path, port: str, binding: PortBinding) -> None:
    parsed = parse_compose(document({"ports": [port]}), "p", tmp_path / "c.yml", tmp_path)
    assert parsed.service("app").config.ports == (binding,)


def test_health_deadline_covers_start_period_and_retries() -> None:
    check = Healthcheck(("CMD", "true"), interval=1, timeout=5, retries=3, start_period=900)
    assert check.deadline == 900 + 3 * (1 + 5)



def test_env_from_the_env_file_hashes_as_inline_environment_did(site: Path) -> None:
    """Moving env into compose/<service>.env recreates nothing on upgrade: same engine config,
    same config hash; `environment` still wins over `env_file`, as in Compose."""
    desired = rendered(site)
    layout = SiteLayout(site.parent)
    document = yaml.safe_load(layout.compose_file.read_text())
    alpha = document["services"]["alpha"]
    assert alpha["env_file"] == ["alpha.env"]
    env = dict(desired.service("alpha").config.environment)
    assert env == {"HF_HOME": "/root/.cache/huggingface", "STANDIN_LOAD_SECONDS": "2"}
    inline = {**alpha, "environment": env}
    del inline["env_file"]
    document["services"]["alpha"] = inline
    config_file, root = layout.compose_file.resolve(), layout.root.resolve()
    again = parse_compose(document, "unit01", config_file, root).service("alpha")
    assert again.config_hash == desired.service("alpha").config_hash
    document["services"]["alpha"] = {**alpha, "environment": {"STANDIN_LOAD_SECONDS": "9"}}
    both = parse_compose(document, "unit01", config_file, root).service("alpha")
    assert dict(both.config.environment)["STANDIN_LOAD_SECONDS"] == "9"


@pytest.mark.parametrize("content,problem", [
    ('A=unquoted\n', "line 1 is not a KEY=\"value\" line kit wrote"),
    (None, "cannot read"),
])
def test_a_broken_env_file_says_to_re_render(site: Path, content: str | None, problem: str) -> None:
    rendered(site)
    layout = SiteLayout(site.parent)
    env_file = layout.env_file("alpha")
    if content is None:
        env_file.unlink()
        env_file.mkdir()
    else:
        env_file.write_text(content)
    with pytest.raises(KitError, match="kit render") as raised:
        load_desired(layout, "unit01")
    assert problem in str(raised.value) and "env_file" in str(raised.value)
