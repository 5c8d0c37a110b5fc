"""idle_sleep rendered (issue 26): `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1 for a service
that has it, and for no other; the rest of its command unchanged."""

import json
from pathlib import Path

import yaml

from kit.engine.desired import WAKER_SERVICE
from kit.plan.waker import SWAP_IDLE_GRACE_S
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


def test_a_swap_groups_min_awake_reaches_the_waker(site: Path) -> None:
    """idle_sleep.min_awake (default 30 s) is each member's in the waker's configuration."""
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "    gpus: [0]\n", "    gpus: [0]\n    idle_sleep: {after: 15m, swap_group: g0}\n", 1))
    partner = SECOND_SERVICE.replace("gpus: [1]", "gpus: [0]").replace(
        "    max_num_seqs: 8\n",
        "    max_num_seqs: 8\n    idle_sleep: {after: 15m, swap_group: g0, min_awake: 45s}\n")
    command = _rendered(site, partner)[WAKER_SERVICE]["command"]
    config = json.loads(command[command.index("--config") + 1])
    assert {s["name"]: s["min_awake"] for s in config["services"]} == {"llama8b": 30,
                                                                       "small": 45}
    assert config["idle_grace"] == SWAP_IDLE_GRACE_S
