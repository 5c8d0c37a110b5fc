"""`kit adapters add|remove|list` and declared = loaded in a rolling update (issue 27), on the
fake engine: the adapter checked before any replica sees it, loaded and gated on every replica,
only then in site.yaml and routed by the door; a failure on one replica unloads it from the
others and changes nothing; remove makes it unroutable before it unloads; a replica whose
vLLM lacks a declared adapter is loaded and proven before a rolling update puts it back."""

from __future__ import annotations

from pathlib import Path

import pytest

import kit.commands.adapters
from kit.converge.reconcile import changes, up_actions
from kit.errors import KitError
from kit.site import Site
from tests.support.adapters import write_adapter
from tests.support.cli import run_kit
from tests.support.fake_stack import up
from tests.support.lora_engine import LoraEngine
from tests.support.sites import write_site

REPLICAS = [f"unit01-beta-r{index}-1" for index in range(4)]
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
HAND_ADDED = "  # the helpdesk's\n      - {name: legal, path: adapters/legal}\n"  # an edit by hand


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
    # no replica to recreate: the adapter list is in their --config file, not their identity
    site = Site.load(spec)
    assert changes(up_actions(site.desired, site.observe(engine))) == []
    assert "legal=/models/adapters/legal" in (
        spec.parent / "lora" / "beta" / "adapters.yaml").read_text()
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


def test_a_replica_restarted_after_an_add_loads_it_at_its_start(
        tmp_path: Path, engine: LoraEngine) -> None:
    """A crash after `kit adapters add` (the engine restarts the replica, no kit involved):
    its vLLM reads the --config file again and loads every declared adapter before it answers.
    `kit up` then starts a killed one as it was (no recreate), and nothing else changes."""
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    assert run_kit("adapters", "add", spec, "beta", "legal", "--path",
                   "adapters/legal").exit_code == 0
    crashed = engine.inspect(REPLICAS[2])["Id"]
    engine.stop(crashed)
    engine.start(crashed)  # the restart policy
    assert set(engine.held[REPLICAS[2]]) == {"support", "legal"}
    engine.stop(engine.inspect(REPLICAS[1])["Id"])
    engine.posts.clear()
    lines = up(Site.load(spec), engine)
    assert [line.split(":")[0] for line in lines
            if line.startswith(("recreate", "roll", "start"))] == [
        "start container unit01-beta-r1-1"], lines
    assert all(set(engine.held[name]) == {"support", "legal"} for name in REPLICAS)
    assert engine.posts == []  # nothing to hot-load


def test_kit_up_hot_loads_and_unloads_what_the_spec_edit_changed(
        tmp_path: Path, engine: LoraEngine) -> None:
    """An adapter added to site.yaml by hand + kit up: loaded and gated on every replica before
    nginx reloads with its route; one taken out: unloaded after the reload, once no request on
    it runs; no replica recreated."""
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    ids = {name: engine.inspect(name)["Id"] for name in REPLICAS}
    spec.write_text(spec.read_text().replace("  # the helpdesk's\n", HAND_ADDED))
    engine.watch = lambda: reloads(engine)
    reloaded = reloads(engine)
    lines = up(Site.load(spec), engine)
    assert "load adapter legal on beta-r0, beta-r1, beta-r2, beta-r3: declared, not loaded" in lines
    assert engine.seen == [reloaded] * 4 and reloads(engine) == reloaded + 1  # loads first
    assert sorted(engine.answered) == [(name, "legal") for name in REPLICAS]
    assert {name: engine.inspect(name)["Id"] for name in REPLICAS} == ids
    assert not any("adapter" in line for line in up(Site.load(spec), engine))  # converged

    # taken out: the door stops routing it first, then each replica waits for its requests
    spec.write_text(spec.read_text().replace("      - {name: support, path: adapters/support}"
                                             "  # the helpdesk's\n", ""))
    engine.posts.clear()
    engine.seen.clear()
    engine.watch = lambda: "support" in routes(spec) and reloads(engine) == reloaded + 1
    engine.busy[REPLICAS[3]] = {"support": 3}  # a stream on it for 3 more /metrics reads
    lines = up(Site.load(spec), engine)
    assert any(line.startswith("unload adapter support from beta-r0") for line in lines)
    assert sorted(name for name, route, _ in engine.posts if route == UNLOAD) == REPLICAS
    assert engine.seen == [False] * 4  # the door no longer routed it at any unload
    assert engine.unloaded_busy == []  # none unloaded while a request on it ran
    assert all(set(engine.held[name]) == {"legal"} for name in REPLICAS)
    assert {name: engine.inspect(name)["Id"] for name in REPLICAS} == ids


def test_kit_up_loads_all_or_nothing(tmp_path: Path, engine: LoraEngine) -> None:
    """A load failing on one replica under kit up: unloaded from the others, kit up fails
    naming it, and nginx was not reloaded (the door never routes it)."""
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    spec.write_text(spec.read_text().replace("  # the helpdesk's\n", HAND_ADDED))
    engine.refuse.add((REPLICAS[2], "legal"))
    reloaded = reloads(engine)
    with pytest.raises(KitError, match="adapter legal failed on beta-r2"):
        up(Site.load(spec), engine)
    assert reloads(engine) == reloaded
    assert not any("legal" in held for held in engine.held.values())


def test_remove_waits_for_requests_on_it_then_names_what_is_left(
        tmp_path: Path, engine: LoraEngine) -> None:
    """vllm:lora_requests_info read on each replica: a stream on the adapter delays its
    unload there; one still running at the drain timeout leaves it loaded there, named."""
    spec = lora_site(tmp_path)
    up(Site.load(spec), engine)
    assert run_kit("adapters", "add", spec, "beta", "legal", "--path",
                   "adapters/legal").exit_code == 0
    engine.busy[REPLICAS[0]] = {"support": 4}
    result = run_kit("adapters", "remove", spec, "beta", "support")
    assert result.exit_code == 0, result.output
    assert engine.unloaded_busy == [] and not any("support" in h for h in engine.held.values())
    assert "beta-r0: unloaded once the requests on it ended" in result.output
    engine.busy[REPLICAS[1]] = {"legal": 10**6}  # never ends
    result = run_kit("adapters", "remove", spec, "beta", "legal", "--drain-timeout", "1")
    assert result.exit_code == 1, result.output
    assert "still loaded on beta-r1: requests on it still running after 1s" in result.output
    assert "legal" in engine.held[REPLICAS[1]]
    assert all("legal" not in engine.held[name] for name in REPLICAS if name != REPLICAS[1])
    assert engine.unloaded_busy == []
