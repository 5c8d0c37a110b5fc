"""Every numeric spec bound is one the real tools accept: a spec with each number at its minimum,
and one with each at its maximum, render configs that `nginx -t` and compose's `config` pass.

The bounds are read from the spec models themselves, so a new numeric key is covered here as
soon as it is added (and a bound nginx or Docker refuses fails this test).
"""

import subprocess
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from pydantic import BaseModel

from kit.spec.model import MAX_TIMEOUT, Spec
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries, services_of

# Keys whose extreme cannot be taken alone: (path, at minimum, at maximum).
PAIRED = {
    ("proxy", "http_port"): (2, 65534),  # differs from https_port at its own extreme
    ("services", 0, "tensor_parallel"): (1, 64),  # the number of GPUs listed (indexes 0..63)
    ("services", 0, "pipeline_parallel"): (1, 1),  # more stages: more nodes (test_multinode_core)
    # gpus / tensor_parallel: one replica at both ends (64 replicas: test_replicas_core.py)
    ("services", 0, "replicas"): (1, 1),
}
LISTS = ("services", "receivers")  # lists of models: their first entry takes the extremes
FLOAT_STEP = 0.01  # the smallest float above an exclusive lower bound that the spec is given
# Keys read in tls.mode acme only, which needs a public domain: they reach neither nginx nor
# compose's checks, only the certbot loop's shell (tests/unit/front_door/test_acme.py runs it).
ACME_ONLY = {("tls", "acme_retry_s")}


def numeric_bounds(model: type[BaseModel], prefix: tuple = ()) -> dict[tuple, tuple[Any, Any]]:
    """{key path: (lowest, highest)} of every number in the spec, from its ge/gt/le rules."""
    found: dict[tuple, tuple[Any, Any]] = {}
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        nested = _model_of(info.annotation)
        if nested is not None:
            found.update(numeric_bounds(nested, (*path, 0) if name in LISTS else path))
            continue
        rules, kind = _number_rules(info.annotation)
        rules += info.metadata
        low = high = None
        for rule in rules:
            if isinstance(rule, annotated_types.Ge):
                low = rule.ge
            elif isinstance(rule, annotated_types.Gt):
                low = rule.gt + (FLOAT_STEP if kind is float else 1)
            elif isinstance(rule, annotated_types.Le):
                high = rule.le
        if low is not None and high is not None:
            found[path] = PAIRED.get(path, (low, high))
    return found


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _number_rules(annotation: Any) -> tuple[list, type | None]:
    """The rules and type of the number in `int`, `int | Literal['auto']`, `float | dict | None`
    (pydantic keeps a union member's rules in its own Annotated metadata)."""
    for arg in (annotation, *getattr(annotation, "__args__", ())):
        kind = getattr(arg, "__origin__", arg)
        if kind in (int, float):
            rules = []
            for item in getattr(arg, "__metadata__", ()):
                rules += getattr(item, "metadata", [item])
            return rules, kind
    return [], None


def extreme_spec(models: Path, end: int) -> dict:
    """The spec with every number at its lowest (end 0) or highest (end 1) allowed value."""
    data: dict = {
        "site": "limits", "domain": "llm.test.internal", "models_root": str(models),
        "tls": {"mode": "self-signed"}, "auth": {"users": ["ops"]}, "proxy": {},
        # a Hub id: no model directory, so no capacity plan limits the numbers
        "services": [{"name": "svc", "model": "org/model", "gpus": [0]}],
        # observability on, with Alertmanager mailing through an SMTP relay (no secret file)
        "observability": {"enabled": True, "alerts": {"receivers": [{"email": {
            "to": "ops@test.example", "from": "kit@test.example",
            "smtp": {"host": "smtp.test.example"}}}]}},
    }
    for path, bounds in numeric_bounds(Spec).items():
        if path in ACME_ONLY:
            continue
        target = data
        for part in path[:-1]:
            target = target[part] if isinstance(target, list) else target.setdefault(part, {})
        target[path[-1]] = bounds[end]
    service = data["services"][0]
    service["gpus"] = list(range(service["tensor_parallel"]))  # GPU 0 alone, or 0 to 63
    service["env"] = {"VLLM_ENGINE_READY_TIMEOUT_S": str((1, MAX_TIMEOUT)[end])}
    data["proxy"]["max_body"] = ("1k", "1g")[end]
    service["idle_sleep"]["after"] = ("10s", "168h")[end]
    service["routing"]["affinity"] = "prefix"  # epsilon is read with it only
    return data


def test_the_bounds_cover_the_keys_nginx_and_docker_read() -> None:
    paths = {".".join(map(str, path)) for path in numeric_bounds(Spec)}
    assert {"proxy.https_port", "proxy.max_connections_per_ip", "proxy.read_timeout",
            "healthcheck_interval", "services.0.max_num_seqs", "services.0.startup_timeout",
            "services.0.max_model_len", "services.0.tensor_parallel", "gpu_memory_gib",
            "proxy.password_recheck_s"} <= paths


@pytest.fixture(scope="module")
def extremes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("extremes")
    (root / "models").mkdir()
    folders = {}
    for end, label in enumerate(("min", "max")):
        folder = root / label
        folder.mkdir()
        (folder / "site.yaml").write_text(yaml.safe_dump(extreme_spec(root / "models", end)))
        result = run_kit("render", str(folder / "site.yaml"))
        assert result.exit_code == 0, f"{label}: {result.output}"
        folders[label] = folder
    return folders


def test_extremes_render_what_the_spec_says(extremes: dict[str, Path]) -> None:
    conf = (extremes["max"] / "nginx" / "nginx.conf").read_text()
    assert "client_body_buffer_size 1024m;" in conf  # nginx's size slots take no `g`
    assert "client_max_body_size 1024m;" in conf
    assert "limit_conn kit_conn_per_ip 65535;" in conf
    assert "proxy_cache_valid 204 401 3600s;" in conf  # proxy.password_recheck_s
    low = (extremes["min"] / "nginx" / "nginx.conf").read_text()
    assert "client_body_buffer_size 1k;" in low
    assert "proxy_cache_valid 204 401 5s;" in low


@pytest.mark.parametrize("end", ["min", "max"])
def test_nginx_accepts_the_extremes(extremes: dict[str, Path], end: str) -> None:
    reason = nginx_ns.available()
    if reason:
        pytest.skip(reason)
    result = nginx_ns.nginx_t(extremes[end] / "nginx", services_of(extremes[end]))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("end", ["min", "max"])
def test_compose_accepts_the_extremes(extremes: dict[str, Path], end: str) -> None:
    binaries = compose_binaries()
    if not binaries:
        pytest.skip("neither docker-compose v1 nor v2 is installed (scripts/test.sh installs them)")
    for binary in binaries:
        result = subprocess.run(
            [*binary, "-p", "kit-limits-test", "-f", "compose/docker-compose.yml", "config", "-q"],
            cwd=extremes[end], capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, f"{binary} {end}: {result.stderr}"
