"""Level-1 sleep's CPU memory (kit/plan/host.py, docs/sleep.md): the weights of every service
that may sleep at level 1 must fit in this host's memory, else `kit validate` refuses with the
position and the fix; level 2 needs none."""

from __future__ import annotations

from pathlib import Path

import pytest

import kit.plan.host
from tests.support.cli import run_kit
from tests.support.sites import base_site

GIB = 1 << 30


@pytest.fixture
def small_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {32 * GIB // 1024} kB\nMemFree: 1 kB\n")
    monkeypatch.setattr(kit.plan.host, "MEMINFO", meminfo)


def sleepy_spec(root: Path, level: int, replicas_gpus: str = "[0]") -> Path:
    site = base_site(root)
    model = root / "models" / "llama-8b"
    with open(model / "pytorch_model.bin", "wb") as weights:  # sparse: 30 GiB of "weights"
        weights.truncate(30 * GIB)
    (model / "tokenizer.json").write_text("{}")  # a complete folder otherwise
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "    gpus: [0]\n", f"    gpus: {replicas_gpus}\n    tensor_parallel: 1\n"
        f"    idle_sleep: {{after: 15m, level: {level}}}\n"))
    return spec


def test_level_1_weights_beyond_the_hosts_memory_are_refused(tmp_path: Path,
                                                            small_host: None) -> None:
    spec = sleepy_spec(tmp_path, level=1, replicas_gpus="[0, 1]")
    result = run_kit("validate", spec)
    assert result.exit_code == 2, result.output
    assert "services[0].idle_sleep.level" in result.output
    assert ("level-1 sleep keeps the weights of every sleeping replica in CPU memory: llama8b "
            "60.0 GiB (60.0 GiB when all sleep) is more than 80% of this host's 32.0 GiB"
            ) in result.output
    assert "set `level: 2` for some of them" in result.output


def test_level_2_or_a_host_with_the_memory_passes(tmp_path: Path, small_host: None) -> None:
    assert run_kit("validate", sleepy_spec(tmp_path / "a", level=2)).exit_code == 0
    one = sleepy_spec(tmp_path / "b", level=1)  # 30 GiB > 80 % of 32: still refused
    assert run_kit("validate", one).exit_code == 2
    kit.plan.host.MEMINFO.write_text(f"MemTotal: {64 * GIB // 1024} kB\n")
    assert run_kit("validate", one).exit_code == 0


def test_memory_unknown_is_not_a_refusal(tmp_path: Path) -> None:
    assert kit.plan.host.host_memory_bytes(tmp_path / "absent") is None
