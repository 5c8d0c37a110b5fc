"""`kit adapters add|remove|list` and declared = loaded in a rolling update (issue 27), on the
fake engine: the adapter checked before any replica sees it, loaded and gated on every replica,
only then in site.yaml and routed by the door; a failure on one replica unloads it from the
others and changes nothing; remove makes it unroutable before it unloads; a replica whose
vLLM lacks a declared adapter is loaded and proven before a rolling update puts it back."""

from __future__ import annotations

from pathlib import Path

import pytest

import kit.commands.adapters
from kit.errors import KitError
from kit.site import Site
from tests.support.adapters import write_adapter
from tests.support.cli import run_kit
from tests.support.fake_stack import up
from tests.support.lora_engine import LoraEngine
from tests.support.sites import write_site

REPLICAS = [f"unit01-beta-r{index}-1" for index in range(4)]
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def lora_site(root: Path) -> Path:
    """beta as 4 replicas declaring adapter `support` (a comment beside it), `legal` on disk."""
    spec = write_site(root)
    for name in ("support", "legal"):
        write_adapter(root / "models" / "adapters" / name, base="qwen", rank=8)
    spec.write_text(spec.read_text().replace(
        "    gpus: [1, 2]\n", "    gpus: [1, 2, 3, 4]\n    replicas: 4\n    adapters:\n"
        "      - {name: support, path: adapters/support}  # the helpdesk's\n"))
    return spec


def routes(spec: Path) -> str:
    return (spec.parent / "nginx" / "kit-routes.json").read_text()


def reloads(engine: LoraEngine) -> int:
    """The signals sent to nginx so far (a reload is one: the door routes what it read then)."""
    return sum(method == "signal" for method, _ in engine.calls)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> LoraEngine:
    engine = LoraEngine()
    monkeypatch.setattr(kit.commands.adapters, "connect", lambda _: engine)
    return engine


def test_add_checks_loads_and_gates_every_replica_before_the_door_routes_it(
        tmp_path: Path, engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    before = spec.read_text()
    reloaded = reloads(engine)
    engine.watch = lambda: reloads(engine)
    result = run_kit("adapters", "add", spec, "beta", "legal", "--path", "adapters/legal")
    assert result.exit_code == 0, result.output
    loads = [(name, adapter) for name, route, adapter in engine.posts if route == LOAD]
    assert sorted(loads) == [(name, "legal") for name in REPLICAS]
    assert engine.seen == [reloaded] * 4  # nginx not reloaded while any replica was loading
    assert reloads(engine) == reloaded + 1
    assert all(engine.held[name]["legal"] == "/models/adapters/legal" for name in REPLICAS)
    assert sorted(engine.answered) == [(name, "legal") for name in REPLICAS]  # each gated
    assert "legal" in routes(spec)
    # site.yaml: the entry added in the list's own style, every other byte kept
    assert spec.read_text() == before.replace(
        "  # the helpdesk's\n",
        "  # the helpdesk's\n      - {name: legal, path: adapters/legal}\n")
    assert "adapter legal loaded and routable on 4 replica(s) of beta" in result.output
    assert "next `kit up" in result.output
    listed = run_kit("adapters", "list", spec, "beta")
    assert listed.exit_code == 0, listed.output
    assert listed.output.count(" loaded\n") == 8, listed.output


@pytest.mark.parametrize("broken", ["base", "rank", "truncated", "sha256", "name"])
def test_a_bad_adapter_is_refused_before_any_replica_sees_it(
        tmp_path: Path, engine: LoraEngine, broken: str) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    folder = tmp_path / "models" / "adapters" / "bad"
    sha = write_adapter(folder, base="llama-3" if broken == "base" else "qwen",
                        rank=1024 if broken == "rank" else 8, truncate=broken == "truncated")
    options = ["--sha256", "0" * 64] if broken == "sha256" else ["--sha256", sha]
    name = "support" if broken == "name" else "bad"
    before, routed = spec.read_bytes(), routes(spec)
    result = run_kit("adapters", "add", spec, "beta", name, "--path", "adapters/bad", *options)
    assert result.exit_code == 2, result.output
    assert {"base": "trained on", "rank": "rank 1024", "truncated": "adapter_model",
            "sha256": "sha256", "name": "support"}[broken] in result.output
    assert engine.posts == [] and spec.read_bytes() == before and routes(spec) == routed


def test_a_load_failing_on_one_replica_is_unloaded_from_the_others_and_never_routed(
        tmp_path: Path, engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    before, routed = spec.read_bytes(), routes(spec)
    engine.refuse.add((REPLICAS[2], "legal"))
    result = run_kit("adapters", "add", spec, "beta", "legal", "--path", "adapters/legal")
    assert result.exit_code == 1, result.output
    assert "failed on beta-r2" in result.output and "CUDA out of memory" in result.output
    unloads = sorted(name for name, route, _ in engine.posts if route == UNLOAD)
    assert unloads == [REPLICAS[0], REPLICAS[1], REPLICAS[3]]
    assert not any("legal" in held for held in engine.held.values())
    assert spec.read_bytes() == before and routes(spec) == routed


def test_a_vllm_without_the_runtime_routes_is_named(tmp_path: Path, engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    engine.runtime_routes = False
    result = run_kit("adapters", "add", spec, "beta", "legal", "--path", "adapters/legal")
    assert result.exit_code == 1 and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in result.output


def test_a_service_without_adapters_cannot_hot_load(tmp_path: Path, engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    result = run_kit("adapters", "add", spec, "alpha", "legal", "--path", "adapters/legal")
    assert result.exit_code == 2 and "declares no adapters" in result.output
    assert engine.posts == []


def test_remove_makes_it_unroutable_before_it_unloads(tmp_path: Path,
                                                      engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    assert run_kit("adapters", "add", spec, "beta", "legal", "--path",
                   "adapters/legal").exit_code == 0
    engine.posts.clear()
    engine.seen.clear()
    engine.watch = lambda: "legal" in routes(spec)
    result = run_kit("adapters", "remove", spec, "beta", "legal")
    assert result.exit_code == 0, result.output
    assert sorted(name for name, route, _ in engine.posts if route == UNLOAD) == REPLICAS
    assert engine.seen == [False] * 4
    assert "legal" not in spec.read_text() and "# the helpdesk's" in spec.read_text()
    assert run_kit("adapters", "remove", spec, "beta", "legal").exit_code == 2


def test_a_rolling_update_loads_and_proves_declared_adapters_before_traffic(
        tmp_path: Path, engine: LoraEngine) -> None:
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    spec.write_text(spec.read_text().replace("    replicas: 4\n",
                                             "    replicas: 4\n    env: {ROLL: '1'}\n"))
    engine.skip_at_start.add("support")  # the new replicas come up without it
    engine.answered.clear()
    lines = up(Site.load(spec), engine)
    assert all("support" in engine.held[name] for name in REPLICAS)
    assert sorted(engine.answered) == [(name, "support") for name in REPLICAS]
    back = [line for line in lines if "back in nginx" in line]
    assert len(back) == 4 and all("adapters support answered" in line for line in back)
    # one that cannot load it stays out of nginx, and kit up fails naming it
    spec.write_text(spec.read_text().replace("ROLL: '1'", "ROLL: '2'"))
    engine.refuse.add((REPLICAS[0], "support"))
    with pytest.raises(KitError, match="declared adapter support"):
        up(Site.load(spec), engine)


def test_after_an_add_and_a_killed_replica_kit_up_replaces_the_dead_one_first(
        tmp_path: Path, engine: LoraEngine) -> None:
    """The replicas' commands predate the add, so kit up rolls all 4; the killed one (no name
    in Docker's DNS: any reload listing it would fail) is replaced first, with every declared
    adapter loaded at its start and proven before it is back in nginx."""
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    assert run_kit("adapters", "add", spec, "beta", "legal", "--path",
                   "adapters/legal").exit_code == 0
    engine.stop(engine.inspect(REPLICAS[1])["Id"])
    lines = up(Site.load(spec), engine)
    back = [line for line in lines if "back in nginx" in line]
    assert [line.split(":")[0].strip() for line in back] == [
        "beta-r1", "beta-r0", "beta-r2", "beta-r3"]
    assert all("adapters support, legal answered" in line for line in back)
    assert all(set(engine.held[name]) == {"support", "legal"} for name in REPLICAS)
