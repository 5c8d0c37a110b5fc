"""The render wing's tools: Debian's promtool and amtool, for the rendered Prometheus and
Alertmanager files."""

import subprocess
from pathlib import Path

import pytest

from tests.support.sites import REPO

PROMETHEUS_SH = REPO / "tests" / "images" / "prometheus.sh"


@pytest.fixture(scope="module")
def promtool() -> str:
    """Prometheus 3.5's promtool (Debian forky's, unpacked by tests/images/prometheus.sh), the
    same build as the Prometheus test image's."""
    result = subprocess.run(["bash", str(PROMETHEUS_SH)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return str(Path(result.stdout.strip()) / "usr" / "bin" / "promtool")


@pytest.fixture(scope="module")
def amtool() -> str:
    """Alertmanager 0.33's amtool (Debian forky's, unpacked by `tests/images/prometheus.sh
    alertmanager`), the same build as the Alertmanager test image's."""
    result = subprocess.run(["bash", str(PROMETHEUS_SH), "alertmanager"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return str(Path(result.stdout.strip()) / "usr" / "bin" / "amtool")
