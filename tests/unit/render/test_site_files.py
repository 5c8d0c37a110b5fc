"""kit render: golden files, idempotence, hand-edit protection, dry-run, atomic writes."""

import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import Result

from kit.layout import SiteLayout
from tests.support.cli import run_kit
from tests.support.sites import REPO, tree

GOLDEN = ["compose/docker-compose.yml", "compose/llama8b.env", "nginx/nginx.conf", "nginx/kit.js",
          "nginx/verifier/nginx.conf", "nginx/verifier/verifier.js",
          "nginx/verifier/unknown-user.htpasswd", "nginx/kit-routes.json",
          "compose/usage/usage_ledger.py", "compose/usage-models/models.json"]


def render(*args: str) -> Result:
    return run_kit("render", *args)


def test_golden_files_match_the_bundled_example(example_site: Path) -> None:
    result = render(str(example_site / "site.yaml"))
    assert result.exit_code == 0, result.output
    for name in GOLDEN:
        committed = (REPO / name).read_text()
        assert (example_site / name).read_text() == committed, (
            f"{name} drifted from `kit render site.yaml`; re-render the example and commit it"
        )


def test_rerender_changes_no_file(site: Path) -> None:
    assert render(str(site / "site.yaml")).exit_code == 0
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in site.rglob("*") if p.is_file()}
    result = render(str(site / "site.yaml"))
    assert result.exit_code == 0
    assert "no change" in result.output
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in site.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.real_bcrypt_cost
def test_new_user_password_is_printed_once_and_stored_as_bcrypt(site: Path) -> None:
    first = render(str(site / "site.yaml"))
    assert "password for ops: " in first.output
    password = first.output.split("password for ops: ")[1].split()[0]
    htpasswd = SiteLayout(site).htpasswd.read_text()
    ops_hash = next(line for line in htpasswd.splitlines() if line.startswith("ops:"))
    assert ops_hash.startswith("ops:$2b$12$") and password not in htpasswd
    import bcrypt

    assert bcrypt.checkpw(password.encode(), ops_hash.split(":", 1)[1].encode())
    assert "password for" not in render(str(site / "site.yaml")).output


def test_existing_htpasswd_entries_are_never_touched(site: Path) -> None:
    layout = SiteLayout(site)
    layout.auth_dir.mkdir(parents=True)
    layout.htpasswd.write_text("ops:$2y$05$keepthishashexactlyasitisxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n")
    result = render(str(site / "site.yaml"))
    assert result.exit_code == 0
    assert "password for ops" not in result.output
    lines = layout.htpasswd.read_text().splitlines()
    assert lines[0] == "ops:$2y$05$keepthishashexactlyasitisxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
    assert lines[1].startswith("kit-probe:$2b$")


def test_secret_files_are_private(site: Path) -> None:
    render(str(site / "site.yaml"))
    layout = SiteLayout(site)
    for secret in (layout.server_key, layout.ca_key, layout.probe_password, layout.keys_map,
                   layout.auth_state, layout.manifest):
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    assert layout.htpasswd.stat().st_mode & 0o007 == 0  # no access for others
    assert layout.state_dir.stat().st_mode & 0o777 == 0o700


def test_hand_edit_is_refused_with_a_diff_then_forced(site: Path) -> None:
    spec = site / "site.yaml"
    render(str(spec))
    conf = site / "nginx" / "nginx.conf"
    conf.write_text(conf.read_text().replace("gzip off;", "gzip on;  # mine"))
    spec.write_text(spec.read_text().replace("read_timeout: 900", "read_timeout: 600"))
    before = tree(site)

    refused = render(str(spec))
    assert refused.exit_code == 2
    assert "nginx/nginx.conf" in refused.output
    assert "-    gzip on;  # mine" in refused.output and "--force" in refused.output
    assert tree(site) == before

    forced = render(str(spec), "--force")
    assert forced.exit_code == 0
    assert "gzip off;" in conf.read_text() and "proxy_read_timeout 600s;" in conf.read_text()


def test_dry_run_prints_the_diff_and_writes_nothing(site: Path) -> None:
    spec = site / "site.yaml"
    render(str(spec))
    spec.write_text(spec.read_text().replace("max_num_seqs: 64", "max_num_seqs: 32"))
    before = tree(site)
    result = render(str(spec), "--dry-run")
    assert result.exit_code == 0
    assert '-    command: ["/models/llama-8b"' in result.output
    assert '"--max-num-seqs", "32"' in result.output
    assert tree(site) == before


def test_out_directory(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    assert render(str(site / "site.yaml"), "--out", str(out)).exit_code == 0
    assert (out / "compose" / "docker-compose.yml").is_file()
    assert not (site / "compose").exists()


def test_extra_args_with_json_and_quotes_reach_vllm_verbatim(site: Path) -> None:
    spec = site / "site.yaml"
    args = ['--compilation-config', '{"mode": 3, "x": "a;b}"}', "--max-num-batched-tokens=8192"]
    spec.write_text(spec.read_text().replace('["--enable-prefix-caching"]', yaml.safe_dump(
        args, default_flow_style=True, width=1000).strip()))
    assert render(str(spec)).exit_code == 0, render(str(spec)).output
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert compose["services"]["llama8b"]["command"][-3:] == args


def test_a_killed_render_leaves_every_file_old_or_new(site: Path) -> None:
    """SIGKILL `kit render` at random moments: each file is whole, old or new, never a mix."""
    spec = site / "site.yaml"
    render(str(spec))
    old = {name: (site / name).read_bytes() for name in GOLDEN}
    spec.write_text(spec.read_text().replace("read_timeout: 900", "read_timeout: 777")
                    .replace("max_num_seqs: 64", "max_num_seqs: 48"))
    new_site = site.parent / "fresh"
    assert render(str(spec), "--out", str(new_site)).exit_code == 0
    new = {name: (new_site / name).read_bytes() for name in GOLDEN}
    rng = random.Random(7)
    kills = 0
    for _ in range(12):
        process = subprocess.Popen(
            [sys.executable, "-m", "kit", "render", str(spec), "--force"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        )
        time.sleep(rng.uniform(0.15, 0.6))
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            kills += 1
        process.wait()
        for name in GOLDEN:
            assert (site / name).read_bytes() in (old[name], new[name]), name
    assert kills > 0
    assert render(str(spec), "--force").exit_code == 0
    assert {name: (site / name).read_bytes() for name in GOLDEN} == new
    assert not list(site.rglob(".*.tmp")), "a later render removes what a killed one left"


def test_init_writes_the_example_and_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "site.yaml"
    assert run_kit("init", str(target)).exit_code == 0
    assert target.read_text() == (REPO / "site.yaml").read_text()
    again = run_kit("init", str(target))
    assert again.exit_code == 2 and "already exists" in again.output


def test_init_shows_every_tls_mode_and_its_acme_lines_work(tmp_path: Path) -> None:
    target = tmp_path / "site.yaml"
    assert run_kit("init", str(target)).exit_code == 0
    text = target.read_text()
    for line in ("self-signed", "# mode: files", "# mode: acme", "# email: ", "# staging: true"):
        assert line in text, line
    lines = [line for line in text.splitlines() if not line.startswith("  mode: self-signed")]
    acme = "\n".join(
        line.replace("# ", "", 1) if line.startswith(("  # mode: acme", "  # email:")) else line
        for line in lines
    ) + "\n"
    target.write_text(acme)
    result = render(str(target))
    assert result.exit_code == 0, result.output
    compose = yaml.safe_load((tmp_path / "compose" / "docker-compose.yml").read_text())
    assert "--email ops@example.com" in compose["services"]["certbot"]["command"][0]


def test_init_into_a_missing_folder_is_refused_without_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_kit("init", str(blocker / "site.yaml"))
    assert result.exit_code == 2 and f"cannot write {blocker / 'site.yaml'}" in result.output
    assert "in the way" in result.output


def test_schema_lists_the_spec_keys() -> None:
    import json

    result = run_kit("schema")
    schema = json.loads(result.output)
    assert {"site", "domain", "models_root", "services"} <= set(schema["required"])
    service = schema["$defs"]["Service"]["properties"]
    assert {"gpus", "max_num_seqs", "extra_args", "tensor_parallel"} <= set(service)


def test_validate_accepts_the_example(example_site: Path) -> None:
    result = run_kit("validate", str(example_site / "site.yaml"))
    assert result.exit_code == 0 and "valid" in result.output
    assert not (example_site / "compose").exists()


@pytest.mark.parametrize("user", ["a:b", "a\nb", "Root", ""])
def test_adversarial_user_names_are_refused(user: str) -> None:
    from kit.credentials.material import check_user_name
    from kit.errors import BadInput

    with pytest.raises(BadInput):
        check_user_name(user)


def test_auto_max_num_seqs_comes_from_the_capacity_plan(site: Path) -> None:
    from kit.plan.capacity import plan_capacity
    from kit.plan.modelinfo import inspect_model_dir

    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("max_num_seqs: 64", "max_num_seqs: auto")
                    + "gpu_memory_gib: 80\n")
    result = render(str(spec))
    assert result.exit_code == 0, result.output
    expected = plan_capacity(
        inspect_model_dir(site.parent / "models" / "llama-8b"), gpu_memory_gib=80,
        tensor_parallel=1, gpu_memory_utilization=0.9, max_model_len=8192,
    ).recommended_max_num_seqs
    command = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())[
        "services"]["llama8b"]["command"]
    assert command[command.index("--max-num-seqs") + 1] == str(expected)
    assert f"max_num_seqs {expected}" in result.output


def test_a_spec_that_cannot_start_is_refused_before_anything_is_written(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text() + "gpu_memory_gib: 12\n")  # 8B bf16 weights need ~15 GiB
    before = tree(site)
    result = render(str(spec))
    assert result.exit_code == 2
    assert "cannot start" in result.output and "kit plan" in result.output
    assert tree(site) == before


def test_a_fresh_clone_renders_over_its_golden_files(example_site: Path) -> None:
    """The README's first command: git checks the golden files out 0644 and there is no
    manifest yet; files whose content is what kit renders are not "edited by hand"."""
    for name in GOLDEN:
        target = example_site / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO / name).read_bytes())
        target.chmod(0o644)
    dry = render(str(example_site / "site.yaml"), "--dry-run")
    assert "would set mode 0600 on compose/llama8b.env (content unchanged)" in dry.output
    assert "would create compose/" not in dry.output and "(empty)" not in dry.output
    result = render(str(example_site / "site.yaml"))
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((example_site / "compose" / "llama8b.env").stat().st_mode) == 0o600
    # the env file's content is what git holds: only its mode was given back, not "updated"
    assert "set mode 0600 on compose/llama8b.env (content unchanged)" in result.output
    assert "updated compose/llama8b.env" not in result.output
    assert "updated compose/docker-compose.yml" not in result.output
