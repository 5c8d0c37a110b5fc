"""vLLM's API-server processes (`api_servers:`, `cpus:`; kit/plan/api_servers.py,
docs/capacity.md): what `auto` gives from the host's declared cores, where the spec refuses more
than one, what is rendered (the flag only above one) and what `kit plan` says."""

import json
from pathlib import Path

import pytest
import yaml

from kit.errors import BadInput
from kit.plan.api_servers import api_servers
from kit.plan.build import build_plan
from kit.spec.load import parse_spec
from kit.spec.vllm_flags import flag_table
from tests.support.cli import run_kit
from tests.support.sites import BASE_SPEC, MULTI_NODE


def spec_text(site_keys: str = "", service_keys: str = "", gpus: str = "[0]",
              models: str = "/srv/models") -> str:
    text = BASE_SPEC.format(models_root=models).replace("gpus: [0]", f"gpus: {gpus}")
    text = text.replace("services:\n", f"{site_keys}services:\n", 1)
    return text + "".join(f"    {line}\n" for line in service_keys.splitlines())


def planned(text: str) -> tuple[int, list[str], str]:
    """The one service's API-server count, its vLLM argv and why."""
    (service,) = build_plan(parse_spec(text, Path("site.yaml"))).services
    return service.api_servers.count, service.command, service.api_servers.reason


def refusal(text: str) -> str:
    with pytest.raises(BadInput) as caught:
        parse_spec(text, Path("site.yaml"))
    return str(caught.value)


@pytest.mark.parametrize(("site_keys", "gpus", "count"), [
    ("", "[0]", 1),  # no cores declared: vLLM's one
    ("cpus: 16\n", "[0]", 4),  # 16 - 2 - 1 nginx - 1 engine = 12, at most 4
    ("cpus: 6\n", "[0]", 2),  # 6 - 2 - 1 - 1 = 2
    ("cpus: 4\n", "[0]", 1),  # nothing to spare: at least one
    ("cpus: 32\n", "[0, 1, 2, 3, 4, 5, 6, 7]", 2),  # 32 - 2 - 4 - 8 = 18 over 8 replicas
    ("cpus: 16\n", "[0, 1, 2, 3, 4, 5, 6, 7]", 1),  # 16 - 2 - 4 - 8 = 2 over 8 replicas
])
def test_auto_gives_each_api_server_a_core_the_host_has_to_spare(
        site_keys: str, gpus: str, count: int) -> None:
    got, _, why = planned(spec_text(site_keys, "tensor_parallel: 1", gpus=gpus))
    assert got == count, why


def test_tensor_parallel_workers_take_their_cores_first() -> None:
    """Two GPUs in one replica: the engine core and two GPU workers, 10 - 2 - 1 - 3 = 4."""
    got, _, why = planned(spec_text("cpus: 10\n", "tensor_parallel: 2", gpus="[0, 1]"))
    assert (got, why) == (4, "auto: 10 cores - 2 the site's own - 1 nginx - 3 engine "
                             "process(es) = 4 for the API servers of 1 replica(s), a core each, "
                             "at most 4")


def test_the_flag_is_rendered_only_above_one() -> None:
    _, one, why = planned(spec_text())
    assert not any(arg.startswith("--api-server") for arg in one)
    assert why == "auto: the host's cores are not declared (cpus: in the spec)"
    _, two, _ = planned(spec_text("cpus: 6\n"))
    at = two.index("--api-server-count")
    assert two[at + 1] == "2" and flag_table().lookup("--api-server-count") is not None


def test_a_count_set_in_the_spec_is_rendered_without_cores_declared() -> None:
    assert planned(spec_text(service_keys="api_servers: 3"))[::2] == (3, "set in the spec")
    assert planned(spec_text("cpus: 64\n", "api_servers: 1"))[::2] == (1, "set in the spec")


def test_with_the_ledger_off_auto_keeps_one() -> None:
    got, _, why = planned(spec_text("cpus: 64\nusage: {enabled: false}\n"))
    assert got == 1 and why.startswith("auto: the usage ledger is off")


def test_other_services_counts_are_taken_before_auto_shares_the_rest() -> None:
    """A service with 3 set in the spec takes 3 cores; the auto one gets what is left."""
    text = spec_text("cpus: 10\n") + ("  - name: other\n    model: other\n    gpus: [1]\n"
                                       "    api_servers: 3\n")
    plan = build_plan(parse_spec(text, Path("site.yaml")))
    counts = {s.name: s.api_servers.count for s in plan.services}
    # 10 - 2 - 1 nginx - 2 engines - 3 = 2 for the one auto replica
    assert counts == {"llama8b": 2, "other": 3}
    assert "- 3 other services' API servers = 2" in plan.services[0].api_servers.reason


def test_a_service_with_adapters_keeps_one_api_server(tmp_path: Path) -> None:
    """vLLM refuses runtime LoRA updates with more than one API-server process: auto gives 1
    and says why; a count above one is refused at its key, naming why and the fix."""
    adapters = "adapters: [{name: support, path: support}]"
    why = refusal(spec_text("cpus: 64\n", f"{adapters}\napi_servers: 2"))
    assert "services[0]: api_servers 2 with adapters" in why
    assert "cannot be used with api_server_count > 1" in why and "write api_servers: auto" in why
    spec = tmp_path / "site.yaml"
    spec.write_text(spec_text("cpus: 64\n", f"{adapters}\napi_servers: 2", models=str(tmp_path)))
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and "api_servers 2 with adapters" in result.output
    auto = api_servers(parse_spec(spec_text("cpus: 64\n", adapters), Path("site.yaml")))
    assert auto["llama8b"].count == 1
    assert "refuses with more than one API-server process" in auto["llama8b"].reason


def test_a_multi_node_service_keeps_one_api_server() -> None:
    text = spec_text("cpus: 64\n").replace("gpus: [0]", "gpus: [4]") + MULTI_NODE
    plan = build_plan(parse_spec(text, Path("site.yaml")))
    big = plan.services[1]
    assert big.api_servers.count == 1 and "--headless" in big.api_servers.reason
    assert "--api-server-count" not in big.command
    assert plan.services[0].api_servers.count == 4
    why = refusal(text + "    api_servers: 2\n")
    assert "api_servers 2 with nodes" in why and "--headless" in why


@pytest.mark.parametrize(("keys", "where", "says"), [
    ("cpus: 0\n", "cpus", "0 is outside 1..1024: write the host's CPU cores"),
    ("cpus: 1025\n", "cpus", "1025 is outside 1..1024"),
    ("cpus: many\n", "cpus", "should be a valid integer"),
])
def test_bad_core_counts_are_refused_naming_the_fix(keys: str, where: str, says: str) -> None:
    why = refusal(spec_text(keys))
    assert f": {where}: " in why and says in why


@pytest.mark.parametrize("value", ["0", "17", "two", "-1"])
def test_bad_api_server_counts_are_refused_naming_the_fix(value: str) -> None:
    why = refusal(spec_text(service_keys=f"api_servers: {value}"))
    assert "services[0].api_servers: " in why
    if value in ("0", "17", "-1"):
        assert f"{value} API-server processes is outside 1..16: write auto" in why


def test_extra_args_cannot_set_the_count_behind_the_key() -> None:
    text = spec_text().replace('["--enable-prefix-caching"]', '["--api-server-count", "2"]')
    why = refusal(text)
    assert "--api-server-count" in why and "api_servers" in why


def test_kit_plan_says_the_count_and_why(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("services:\n", "cpus: 6\nservices:\n", 1))
    text = run_kit("plan", spec)
    assert text.exit_code == 0, text.output
    assert "  api_servers  2 (auto: 6 cores - 2 the site's own" in text.output
    as_json = run_kit("plan", spec, "--json")
    servers = json.loads(as_json.output)["services"]["llama8b"]["api_servers"]
    assert servers["count"] == 2 and servers["reason"].startswith("auto: 6 cores")


def test_the_highest_count_renders_a_compose_file(site: Path) -> None:
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("services:\n", "cpus: 1024\nservices:\n", 1)
                    + "    api_servers: 16\n")
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    command = compose["services"]["llama8b"]["command"]
    assert command[command.index("--api-server-count") + 1] == "16"
