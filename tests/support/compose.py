"""Docker Compose as the unit tests run it on rendered files: the binaries installed here (v1
and the pinned v2, scripts/test.sh installs both) and the backend services of a site."""

import shutil
from pathlib import Path

import yaml

from kit.engine.desired import VERIFIER_SERVICE

COMPOSE_V2 = Path("/usr/local/lib/kit-test/docker-compose-v2")


def compose_binaries() -> list[list[str]]:
    found = []
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    if COMPOSE_V2.exists():
        found.append([str(COMPOSE_V2)])
    return found


def services_of(folder: Path) -> list[str]:
    compose = yaml.safe_load((folder / "compose" / "docker-compose.yml").read_text())
    return [name for name in compose["services"] if name not in {"nginx", VERIFIER_SERVICE}]


def pod_containers(value: object) -> list[dict]:
    """Every container (init containers too) of the pod templates in an exported manifest."""
    if isinstance(value, dict):
        found = [c for key in ("containers", "initContainers") for c in value.get(key) or []]
        return found + [c for child in value.values() for c in pod_containers(child)]
    if isinstance(value, list):
        return [c for item in value for c in pod_containers(item)]
    return []
