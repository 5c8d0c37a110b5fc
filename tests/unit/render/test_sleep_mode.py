"""idle_sleep rendered (issue 26): `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1 for a service
that has it, and for no other; the rest of its command unchanged."""

from pathlib import Path

import yaml

from kit.spec.vllm_flags import DEV_MODE_ENV, SLEEP_MODE_FLAG
from tests.support.cli import run_kit
from tests.support.sites import SECOND_SERVICE, enable

SLEEPER = SECOND_SERVICE.replace("    max_num_seqs: 8\n",
                                 "    max_num_seqs: 8\n    idle_sleep: {after: 15m, level: 2}\n")


def _rendered(site: Path, services: str) -> dict:
    spec = enable(site, "", services)
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    return yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())["services"]


def test_only_the_sleeping_service_gets_sleep_mode_and_dev_mode(site: Path) -> None:
    services = _rendered(site, SLEEPER)
    assert services["small"]["command"].count(SLEEP_MODE_FLAG) == 1
    assert SLEEP_MODE_FLAG not in services["llama8b"]["command"]
    env = {name: (site / "compose" / f"{name}.env").read_text() for name in ("small", "llama8b")}
    assert f'{DEV_MODE_ENV}="1"' in env["small"].splitlines()
    assert DEV_MODE_ENV not in env["llama8b"]


def test_idle_sleep_adds_the_flag_and_nothing_else(site: Path, tmp_path: Path) -> None:
    sleeping = _rendered(site, SLEEPER)["small"]["command"]
    awake_site = tmp_path / "awake"
    (awake_site / "site").mkdir(parents=True)
    spec = (site / "site.yaml").read_text().split("  - name: small")[0]
    (awake_site / "site" / "site.yaml").write_text(spec + SECOND_SERVICE)
    result = run_kit("render", awake_site / "site" / "site.yaml")
    assert result.exit_code == 0, result.output
    awake = yaml.safe_load((awake_site / "site" / "compose" / "docker-compose.yml")
                           .read_text())["services"]["small"]["command"]
    assert [arg for arg in sleeping if arg != SLEEP_MODE_FLAG] == awake
