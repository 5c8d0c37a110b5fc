"""Render against a damaged or unusual site: clear refusals (exit 2, nothing written), secrets
kept out of the compose file, and users dropped from the spec losing their access."""

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import Result

from kit.credentials.material import parse_htpasswd
from kit.credentials.store import with_password, write
from kit.credentials.tls import new_ca, new_server_cert
from kit.engine.desired import load_desired
from kit.engine.envfile import env_file_text, parse_env_file
from kit.errors import KitError
from kit.layout import SiteLayout
from kit.views.status import _last_probe
from tests.support.cli import run_kit
from tests.support.sites import snapshot

TOKEN = "hf_SeCrEtToKeN1234567890"


def render(spec: Path, *args: str) -> Result:
    return run_kit("render", str(spec), *args)


def refused(spec: Path, *needles: str, args: tuple[str, ...] = ()) -> str:
    """Render exits 2 with every needle in its message and changes no byte or mode."""
    before = snapshot(spec.parent)
    result = render(spec, *args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback
    for needle in needles:
        assert needle in result.output, result.output
    assert snapshot(spec.parent) == before
    return result.output


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"files": 3}', b'{"files": {"a": 1}}',
                                     b"\xff\xfe"])
def test_a_corrupt_manifest_is_refused_then_forced(site: Path, content: bytes) -> None:
    spec = site / "site.yaml"
    assert render(spec).exit_code == 0
    layout = SiteLayout(site)
    layout.manifest.write_bytes(content)
    spec.write_text(spec.read_text().replace("read_timeout: 900", "read_timeout: 600"))
    refused(spec, f"{layout.manifest} (kit's record of the files it wrote) is unusable",
            "kit render --dry-run", "kit render --force")
    assert render(spec, "--dry-run").exit_code == 0
    assert render(spec, "--force").exit_code == 0
    assert "no change" in render(spec).output


def test_an_unreadable_tls_key_is_named(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readable when validated, not when render reads it (root reads any mode: simulated)."""
    ca_cert, ca_key = new_ca("files")
    cert, key = new_server_cert("llm.test.internal", ca_cert, ca_key)
    (site / "server.pem").write_bytes(cert)
    key_file = site.parent / "server.key"  # outside the folder `refused` snapshots
    key_file.write_bytes(key)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "tls: {mode: self-signed}", f"tls: {{mode: files, cert: server.pem, key: {key_file}}}"))
    real = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == key_file:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    refused(spec, f"tls.key: cannot read {key_file}: Permission denied", "readable")


def test_an_unreadable_htpasswd_is_named(site: Path) -> None:
    spec = site / "site.yaml"
    layout = SiteLayout(site)
    layout.htpasswd.mkdir(parents=True)
    refused(spec, f"cannot read {layout.htpasswd}: Is a directory", "fix: something else is in")


@pytest.mark.parametrize(
    "blocker", [".kit", "compose", "nginx/nginx.conf/x", "compose/llama8b.env/x"]
)
def test_a_file_or_folder_in_the_way_is_named(site: Path, blocker: str) -> None:
    (site / blocker).parent.mkdir(parents=True, exist_ok=True)
    (site / blocker).write_text("")
    refused(site / "site.yaml", "cannot read", "in the way")


@pytest.mark.parametrize("value", ["20m", "1e3", "-5", "", "12.5", "9999999"])
def test_an_engine_ready_timeout_that_is_not_seconds_is_refused(site: Path, value: str) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text() + f'    env: {{VLLM_ENGINE_READY_TIMEOUT_S: "{value}"}}\n')
    refused(spec, "VLLM_ENGINE_READY_TIMEOUT_S")
    assert not (site / "compose").exists()


def test_an_engine_ready_timeout_in_seconds_sets_the_start_period(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text() + '    env: {VLLM_ENGINE_READY_TIMEOUT_S: "1200"}\n')
    assert render(spec).exit_code == 0
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert compose["services"]["llama8b"]["healthcheck"]["start_period"] == "1500s"


def with_token(spec: Path, token: str = TOKEN) -> None:
    text = spec.read_text().split("    env:")[0]
    spec.write_text(text + f"    env: {{HF_TOKEN: {token}, NOTE: 'a \"quoted\" \\ value'}}\n")


def test_service_env_lives_in_a_private_env_file(site: Path) -> None:
    spec = site / "site.yaml"
    with_token(spec)
    spec.chmod(0o600)
    result = render(spec)
    assert result.exit_code == 0 and "warning" not in result.output
    layout = SiteLayout(site)
    compose = layout.compose_file.read_text()
    assert TOKEN not in compose and "HF_TOKEN" not in compose
    assert yaml.safe_load(compose)["services"]["llama8b"]["env_file"] == ["llama8b.env"]
    env_file = layout.env_file("llama8b")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    desired = load_desired(layout, "test01").service("llama8b")
    assert dict(desired.config.environment) == {
        "HF_HOME": "/root/.cache/huggingface", "HF_TOKEN": TOKEN, "NOTE": 'a "quoted" \\ value',
    }
    assert TOKEN not in json.dumps(desired.labels)
    assert TOKEN not in result.output
    manifest = json.loads(layout.manifest.read_text())["files"]
    assert "compose/llama8b.env" in manifest  # hand edits are caught like in any rendered file


def test_a_changed_token_changes_the_config_hash_and_is_never_printed(site: Path) -> None:
    spec = site / "site.yaml"
    with_token(spec)
    assert render(spec).exit_code == 0
    layout = SiteLayout(site)
    before = load_desired(layout, "test01").service("llama8b").config_hash
    with_token(spec, "hf_AnotherSecret987")
    dry = render(spec, "--dry-run")
    assert "would update compose/llama8b.env (secret material, not shown)" in dry.output
    assert "hf_" not in dry.output
    env_file = layout.env_file("llama8b")
    env_file.write_text(env_file.read_text() + 'EXTRA="hf_HandAddedSecret"\n')
    output = refused(spec, "compose/llama8b.env: secret values, not shown", "--force")
    assert "hf_" not in output
    assert render(spec, "--force").exit_code == 0
    assert load_desired(layout, "test01").service("llama8b").config_hash != before


def test_a_world_readable_spec_with_a_token_is_warned_about(site: Path) -> None:
    spec = site / "site.yaml"
    with_token(spec)
    spec.chmod(0o644)
    result = render(spec)
    assert result.exit_code == 0
    assert f"holds services[llama8b].env.HF_TOKEN and anyone on this host can read it: " \
           f"chmod 600 {spec}" in result.output
    assert TOKEN not in result.output


@pytest.mark.parametrize("env", [
    {}, {"A": ""}, {"HF_TOKEN": "hf_x"}, {"Q": 'say "hi"\\n', "B": "\\\\", "H": "#not a comment"},
    {"S": "  spaced  ", "U": "ünï€ode", "P": "'single'", "M": "{x} a=b"},
])
def test_the_env_file_reads_back_exactly(env: dict[str, str]) -> None:
    assert parse_env_file(env_file_text(env, "site.yaml")) == (env, None)


def test_a_hand_written_env_line_is_reported_by_line() -> None:
    assert parse_env_file('# c\nA="1"\nB=unquoted\n')[1] == 3


def users_spec(spec: Path, users: str) -> None:
    spec.write_text(spec.read_text().replace("users: [ops]", f"users: [{users}]"))


def htpasswd_users(site: Path) -> set[str]:
    layout = SiteLayout(site)
    return set(parse_htpasswd(layout.htpasswd.read_text(), layout.htpasswd))


def test_a_user_dropped_from_the_spec_is_removed_with_a_new_epoch(site: Path) -> None:
    spec = site / "site.yaml"
    original = spec.read_text()
    users_spec(spec, "ops, alice")
    assert render(spec).exit_code == 0
    layout = SiteLayout(site)
    write(layout, with_password(layout, "bob", "bob-has-a-long-passphrase", must_exist=False))
    epoch = layout.auth_state.read_bytes()
    spec.write_text(original)
    result = render(spec)
    assert result.exit_code == 0, result.output
    assert "removed user alice: no longer in auth.users" in result.output
    assert "htpasswd also lets in bob, not in auth.users" in result.output
    assert "kit users remove USER" in result.output
    assert htpasswd_users(site) == {"ops", "bob", "kit-probe"}
    assert layout.auth_state.read_bytes() != epoch  # cached verdicts for alice are unreachable
    again = render(spec)
    assert "removed user" not in again.output and "no change" in again.output


def test_users_are_kept_when_no_render_recorded_the_spec_users(site: Path) -> None:
    """A site rendered before kit recorded auth.users: nothing is removed, all are listed."""
    spec = site / "site.yaml"
    original = spec.read_text()
    users_spec(spec, "ops, alice")
    assert render(spec).exit_code == 0
    SiteLayout(site).spec_users.unlink()
    spec.write_text(original)
    result = render(spec)
    assert "removed user" not in result.output
    assert "htpasswd also lets in alice" in result.output
    assert htpasswd_users(site) == {"ops", "alice", "kit-probe"}


def test_a_user_listed_again_gets_a_new_password(site: Path) -> None:
    spec = site / "site.yaml"
    original = spec.read_text()
    users_spec(spec, "ops, alice")
    render(spec)
    spec.write_text(original)
    render(spec)
    users_spec(spec, "ops, alice")
    assert "password for alice: " in render(spec).output


@pytest.mark.parametrize("content", ["{", "[]", '{"checks": 3}', '{"checks": [1]}', "{}"])
def test_a_corrupt_last_probe_record_is_named_with_the_fix(tmp_path: Path, content: str) -> None:
    record = tmp_path / "last-probe.json"
    record.write_text(content)
    with pytest.raises(KitError) as raised:
        _last_probe(record)
    assert str(record) in raised.value.message and "kit probe" in str(raised.value.fix)
    record.write_text('{"ok": true, "checks": [{"name": "tls", "ok": true}]}')
    assert _last_probe(record)["ok"] is True


CORRUPT_RECORDS = [  # (the record, what a render finds in it, the fix it is told)
    *(("spec_users", content, "fix: delete it")
      for content in ["{not json", '{"ops": 1}', '["ops", 3]', '"ops"']),
    *(("new_passwords", content, "kit rotate-password USER")
      for content in ["[{", '{"user": "ops"}', '[{"user": "ops"}]', "[3]"]),
]


@pytest.mark.parametrize(("record", "content", "fix"), CORRUPT_RECORDS)
def test_a_corrupt_credential_record_is_refused_with_the_fix(
    site: Path, record: str, content: str, fix: str
) -> None:
    spec = site / "site.yaml"
    assert render(spec).exit_code == 0
    path = getattr(SiteLayout(site), record)
    path.write_text(content)
    refused(spec, f"{path} is corrupt", fix)
    os.unlink(path)
    assert render(spec).exit_code == 0
