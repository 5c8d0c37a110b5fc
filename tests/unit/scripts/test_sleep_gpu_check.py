"""scripts/sleep_gpu_check.py, built for the real-GPU measurement of sleep mode (issue 26): its
reading of nvidia-smi and its verdict against the goals, without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kit.errors import KitError
from kit.site import Site
from kit.stack.up import up_site
from tests.support.sites import REPO, spec_in_folder
from tests.support.sleepy_engine import SleepyEngine


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sleep_gpu_check", REPO / "scripts" / "sleep_gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_nvidia_smi_is_read_per_gpu_in_bytes(check: ModuleType) -> None:
    # what nvidia-smi printed on the H200 of issue 26 awake (129,649 MiB) and asleep (2,505)
    assert check.gpu_memory("0, 129649, 143771\n") == {0: (129649 << 20, 143771 << 20)}
    two = check.gpu_memory("0, 2505, 143771\n1, 2480, 143771\n")
    assert sum(used for used, _ in two.values()) == (2505 + 2480) << 20


@pytest.mark.parametrize("printed", ["", "[N/A], 10, 20", "0, 10", "index, memory.used [MiB]",
                                     "0, 12.5, 20"])
def test_anything_else_is_refused(check: ModuleType, printed: str) -> None:
    with pytest.raises(ValueError):
        check.gpu_memory(printed)


def test_the_verdict_against_the_goals(check: ModuleType) -> None:
    good = [check.Round(2505 << 20, 129649 << 20, 0.69, 0.02),
            check.Round(2505 << 20, 129649 << 20, 0.67, 0.02),
            check.Round(2505 << 20, 129649 << 20, 0.90, 0.02)]
    result = check.summary(good)
    assert result["wake_first_token_s"] == {"median": 0.69, "min": 0.67, "max": 0.9,
                                            "goal": 0.75, "met": True}
    assert result["released"]["median"] == pytest.approx(0.9807, abs=1e-4)
    assert result["released"]["met"] is True
    slow = [check.Round(20 << 30, 100 << 30, 0.8, 0.02)]
    verdict = check.summary(slow)
    assert verdict["wake_first_token_s"]["met"] is False
    assert verdict["released"] == {"median": 0.8, "goal": 0.95, "met": False}
    assert check.released_share(0, 0) == 0.0


def test_replica_memory_is_asked_of_each_replica_through_the_engine(
        check: ModuleType, tmp_path: Path) -> None:
    """nvidia-smi runs in every replica's container (the fake engine answers for two
    tensor-parallel-2 replicas); a failed nvidia-smi or a stopped replica is named."""
    spec = spec_in_folder(REPO / "tests" / "data" / "replicas" / "site.yaml", tmp_path / "s")
    spec = spec / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "    replicas: 2\n", "    replicas: 2\n    idle_sleep: {after: 15m}\n"))
    engine = SleepyEngine()
    site = Site.load(spec, check_host=False)
    up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    engine.exec_results[tuple(check.NVIDIA_SMI)] = [(0, "0, 1000, 81559\n1, 1200, 81559\n")]
    assert check.replica_memory(engine, site, "qwen32b") == 2 * (1000 + 1200) << 20
    assert sum(" ".join(check.NVIDIA_SMI) == about for _, about in engine.calls) == 2
    engine.exec_results[tuple(check.NVIDIA_SMI)] = [(9, "NVIDIA-SMI has failed")]
    with pytest.raises(KitError, match="qwen32b-r0: nvidia-smi failed: NVIDIA-SMI has failed"):
        check.replica_memory(engine, site, "qwen32b")
    engine.stop("gpu02-qwen32b-r1-1")
    engine.exec_results[tuple(check.NVIDIA_SMI)] = [(0, "0, 1, 2\n")]
    with pytest.raises(KitError, match="qwen32b-r1 is not running"):
        check.replica_memory(engine, site, "qwen32b")
