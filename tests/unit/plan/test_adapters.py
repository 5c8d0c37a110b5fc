"""LoRA adapters declared in the spec (issue 27): checked before anything starts, loaded at start.

Every bad adapter is exit 2 from `kit validate` and `kit render`, at the adapter's own line,
naming the fix, with nothing written; a good one becomes vLLM's --enable-lora, --max-lora-rank
(the smallest value vLLM accepts that holds the largest rank), --max-loras, --max-cpu-loras and
--lora-modules name=/models/..., and `kit plan` charges its buffers to the KV cache.
"""

import json
import re
from pathlib import Path

import pytest
import yaml

from kit.engine.desired import load_desired
from kit.layout import SiteLayout
from kit.plan.adapters import command_modules, declared_modules
from kit.plan.capacity import GIB, LoraSlots, lora_bytes, plan_capacity
from kit.plan.modelinfo import inspect_model_dir
from tests.standin.vllm_standin import cli
from tests.support import nginx_ns
from tests.support.adapters import adapters_yaml, write_adapter
from tests.support.cli import run_kit
from tests.support.nginx_structure import parse
from tests.support.sites import REPO, base_site, tree

BASE = "/data/models/llama-8b"  # as a local fine-tune records its base: the folder's path


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = base_site(tmp_path)
    write_adapter(tmp_path / "models" / "support-v3", base=BASE, rank=16)
    write_adapter(tmp_path / "models" / "legal", base="org/Llama-8B", rank=48,
                  targets=("q_proj", "v_proj"))
    return folder


def declare(site: Path, entries: list[dict], *, extra_args: list[str] | None = None,
            top: str = "") -> Path:
    spec = site / "site.yaml"
    text = spec.read_text() + adapters_yaml(entries)
    if extra_args is not None:
        text = text.replace('extra_args: ["--enable-prefix-caching"]',
                            f"extra_args: {json.dumps(extra_args)}")
    spec.write_text(text.replace("tls:", f"{top}tls:", 1))
    return spec


def command(site: Path) -> list[str]:
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    return compose["services"]["llama8b"]["command"]


TWO = [{"name": "support-v3", "path": "support-v3"}, {"name": "legal", "path": "legal"}]


def test_declared_adapters_are_loaded_at_start(site: Path) -> None:
    spec = declare(site, TWO)
    assert run_kit("validate", spec).exit_code == 0
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    argv = command(site)
    lora = argv[argv.index("--enable-lora"):argv.index("--enable-prefix-caching")]
    # rank 48 is no --max-lora-rank value: 64 is the smallest of {1,8,16,32,64,128,256,320,512}
    assert lora == ["--enable-lora", "--max-lora-rank", "64",
                    "--config", "/etc/kit/lora/adapters.yaml"]
    # what follows the adapter list is in vLLM's --config file, read at every start
    file = (site / "lora" / "llama8b" / "adapters.yaml").read_text()
    assert yaml.safe_load(file) == {
        "max-loras": "2", "max-cpu-loras": "2",
        "lora-modules": ["support-v3=/models/support-v3", "legal=/models/legal"]}
    # the stand-in's parser (vLLM's --config reading: the file's options after the model)
    config = str(site / "lora" / "llama8b" / "adapters.yaml")
    args = cli.build_parser().parse_args(
        ["serve", *[config if part.startswith("/etc/kit/lora/") else part for part in argv]])
    assert (args.max_loras, args.max_cpu_loras, args.lora_modules, args.max_lora_rank) == (
        2, "2", ["support-v3=/models/support-v3", "legal=/models/legal"], 64)
    routes = (site / "nginx" / "kit-routes.json").read_text()
    assert '"legal"' in routes and '"support-v3"' in routes
    assert command_modules(argv) == {}
    assert declared_modules(argv, lambda: file) == {"support-v3": "/models/support-v3",
                                                    "legal": "/models/legal"}
    volumes = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())[
        "services"]["llama8b"]["volumes"]
    assert {"type": "bind", "source": "../lora/llama8b", "target": "/etc/kit/lora",
            "read_only": True} in volumes
    # vLLM's runtime load/unload routes, for kit adapters add|remove (refused at the door)
    env = (site / "compose" / "llama8b.env").read_text()
    assert 'VLLM_ALLOW_RUNTIME_LORA_UPDATING="True"\n' in env


def test_extra_args_override_the_derived_sizes(site: Path) -> None:
    spec = declare(site, TWO, extra_args=["--max-loras", "1", "--max-lora-rank", "128"])
    assert run_kit("render", spec).exit_code == 0
    argv = command(site)
    assert argv.count("--max-loras") == 1 and argv.count("--max-lora-rank") == 1
    assert argv[argv.index("--max-loras") + 1] == "1"
    assert argv[argv.index("--max-lora-rank") + 1] == "128"
    file = yaml.safe_load((site / "lora" / "llama8b" / "adapters.yaml").read_text())
    assert file["max-cpu-loras"] == "2" and "max-loras" not in file  # the command's wins


def test_an_adapter_added_to_the_spec_does_not_change_the_replicas_identity(
        site: Path, tmp_path: Path) -> None:
    """The adapter list lives in the --config file, which is no part of the config hash: a spec
    edit adding one changes the file, not the container (kit up hot-loads it)."""
    write_adapter(tmp_path / "models" / "billing", base=BASE, rank=16)  # support-v3's rank
    original = (site / "site.yaml").read_text()
    spec = declare(site, TWO[:1])
    assert run_kit("render", spec).exit_code == 0
    before = load_desired(SiteLayout(site), "t").service("llama8b")
    spec.write_text(original)
    declare(site, [*TWO[:1], {"name": "billing", "path": "billing"}])
    assert run_kit("render", spec).exit_code == 0, (site / "site.yaml").read_text()
    after = load_desired(SiteLayout(site), "t").service("llama8b")
    assert "billing=/models/billing" in (site / "lora" / "llama8b" / "adapters.yaml").read_text()
    assert after.config_hash == before.config_hash


def refused(spec: Path, *expected: str) -> str:
    """Both verbs exit 2 naming every expected text; nothing is written."""
    before = tree(spec.parent)
    for verb in ("validate", "render"):
        result = run_kit(verb, spec)
        assert result.exit_code == 2, (verb, result.output)
        for text in expected:
            assert text in result.output, (verb, text, result.output)
    assert tree(spec.parent) == before
    return result.output


def test_bad_adapters_are_refused_at_their_entry(site: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_adapter(models / "other-base", base="mistralai/Mistral-7B-v0.3")
    write_adapter(models / "cut", base=BASE, truncate=True)
    write_adapter(models / "wide", base=BASE, rank=1024)
    digest = write_adapter(models / "pinned", base=BASE)
    write_adapter(models / "dora", base=BASE, peft_type="IA3")
    spec = declare(site, [
        {"name": "a", "path": "other-base"}, {"name": "b", "path": "cut"},
        {"name": "c", "path": "wide"}, {"name": "d", "path": "pinned", "sha256": "0" * 64},
        {"name": "e", "path": "missing"}, {"name": "f", "path": "pinned", "sha256": digest},
        {"name": "g", "path": "dora"}, {"name": "h", "path": "pinned", "revision": "main"},
    ])
    output = refused(
        spec,
        "services[0].adapters[0]: adapter a was trained on 'mistralai/Mistral-7B-v0.3', not on "
        "the service's model 'llama-8b'",
        "services[0].adapters[1]: adapter_model.safetensors is shorter than its header says",
        "services[0].adapters[2]: adapter c has rank 1024, above vLLM's largest --max-lora-rank "
        "512",
        f"services[0].adapters[3]: adapter_model.safetensors has sha256 {digest}, not the "
        f"{'0' * 64} the spec gives",
        f"services[0].adapters[4]: adapter folder {models / 'missing'} does not exist",
        "services[0].adapters[6]: peft_type is 'IA3': vLLM serves LoRA adapters only",
        "services[0].adapters[7]: revision main is read for a Hub adapter only",
    )
    assert "adapters[5]" not in output  # the right sha256 passes
    # each at its own entry (flow YAML: one line, one column each)
    assert len(set(re.findall(r"site\.yaml:15:(\d+): services", output))) == 7


def test_rank_above_the_services_max_lora_rank(site: Path) -> None:
    spec = declare(site, TWO, extra_args=["--max-lora-rank", "32"])
    refused(spec, "services[0].adapters[1]: adapter legal has rank 48, above the service's "
                  "--max-lora-rank 32", "fix: raise --max-lora-rank in extra_args to 64")


def test_names_collide_with_served_names_and_other_adapters(site: Path) -> None:
    spec = declare(site, [{"name": "llama-3.1-8b", "path": "support-v3"},
                          {"name": "legal", "path": "legal"},
                          {"name": "legal", "path": "support-v3"}])
    refused(spec,
            "services[0].adapters[0].name: adapter name 'llama-3.1-8b' is also the served name "
            "of services[0]",
            "services[0].adapters[2].name: adapter name 'legal' is also adapter "
            "services[0].adapters[1]")


def test_lora_flags_adapters_own(site: Path) -> None:
    spec = declare(site, TWO, extra_args=["--lora-modules", "x=/models/x", "--disable-lora",
                                          "--max-cpu-loras", "1"])
    refused(spec,
            "services[0].extra_args[0]: --lora-modules: declare adapters in services[].adapters",
            "services[0].extra_args[2]: --disable-lora contradicts the service's adapters",
            "services[0].extra_args[3]: --max-cpu-loras 1 is below --max-loras 2")


def test_hub_adapter_needs_a_rank_and_opens_the_backend(site: Path) -> None:
    spec = declare(site, [{"name": "hub", "path": "org/some-adapter"}])
    result = run_kit("validate", spec)
    assert result.exit_code == 2 and "rank of adapter(s) hub is unknown" in result.output
    assert "set --max-lora-rank in services[llama8b].extra_args" in result.output
    spec.write_text(spec.read_text().replace('"--enable-prefix-caching"',
                                             '"--max-lora-rank", "32"'))
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    assert "DOWNLOAD: services[0].adapters[0] (hub)" in result.output
    assert "hub=org/some-adapter" in (site / "lora" / "llama8b" / "adapters.yaml").read_text()
    compose = yaml.safe_load((site / "compose" / "docker-compose.yml").read_text())
    assert not any(network.get("internal") for network in compose["networks"].values()
                   if network and "backend" in str(network.get("name", "")))


def test_hub_adapter_pinned_from_hf_cache(site: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    commit = "a" * 40
    repo = cache / "hub" / "models--org--support"
    write_adapter(repo / "snapshots" / commit, base="meta-llama/llama-8b", rank=8)
    (repo / "refs").mkdir()
    (repo / "refs" / "v3").write_text(commit)
    spec = declare(site, [{"name": "support", "path": "org/support", "revision": "v3"}],
                   top=f"hf_cache: {cache}\n")
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    argv = command(site)
    # the site's cache, read-only in every replica (each service writes only its own)
    assert (f"support=/kit/hf-cache/hub/models--org--support/snapshots/{commit}"
            in (site / "lora" / "llama8b" / "adapters.yaml").read_text())
    assert argv[argv.index("--max-lora-rank") + 1] == "8"
    spec.write_text(spec.read_text().replace('"revision": "v3"', '"revision": "v4"'))
    refused(spec, "services[0].adapters[0]: adapter folder "
                  f"{repo / 'snapshots' / 'v4'} does not exist")


def test_lora_memory_is_charged_to_the_kv_cache(site: Path, tmp_path: Path) -> None:
    """2 slots of rank 64 on Llama-3.1-8B dims: per layer lora_A + lora_B = q 4096+4096,
    k 4096+1024, v 4096+1024, o 4096+4096, gate and up 4096+14336 each, down 14336+4096 =
    81,920 x rank; x 32 layers x 2 bytes x 2 slots = 0.625 GiB; half of q/k/v/gate/up's
    lora_B and of o/down's lora_A per GPU at TP 2."""
    model = inspect_model_dir(tmp_path / "models" / "llama-8b")
    assert lora_bytes(model, LoraSlots(2, 64), 1, 2) / GIB == 0.625
    # TP 2: q 4096+2048, k and v 4096+512, o 2048+4096, gate and up 4096+7168, down 7168+4096
    assert lora_bytes(model, LoraSlots(2, 64), 2, 2) == 2 * 64 * 32 * 2 * 55296
    only_attention = lora_bytes(model, LoraSlots(2, 64, ("qkv_proj", "o_proj")), 1, 2)
    assert only_attention == 2 * 64 * 32 * 2 * (8192 + 5120 + 5120 + 8192)
    numbers = dict(gpu_memory_gib=80, tensor_parallel=1, gpu_memory_utilization=0.9,
                   max_model_len=8192, max_num_seqs=64)
    plain = plan_capacity(model, **numbers)
    with_lora = plan_capacity(model, **numbers, lora=LoraSlots(2, 64))
    assert plain.kv_cache_gib - with_lora.kv_cache_gib == pytest.approx(0.625)
    assert with_lora.to_json()["overhead"]["lora_gib"] == 0.625
    assert "lora_gib" not in plain.to_json()["overhead"]  # no adapters: the same keys as before
    spec = declare(site, TWO, top="gpu_memory_gib: 80\n")
    result = run_kit("plan", spec)
    assert result.exit_code == 0, result.output
    assert "LoRA adapters         0.62 GiB  2 slots x rank 64" in result.output


def test_the_adapter_is_part_of_the_affinity_key(tmp_path: Path) -> None:
    """Header affinity hashes the header and the adapter a request names (route.js's
    adapterName); the map that picks the affinity pool still reads the header alone, so a
    request without one keeps least connections. Prefix affinity's choice (balance.js, keyed by
    route.js's prefixKey, which holds the adapter itself) reaches nginx as its own key. nginx -t
    accepts the result."""
    spec = tmp_path / "site.yaml"
    text = (REPO / "tests" / "data" / "replicas" / "site.yaml").read_text()
    lora = ('    extra_args: ["--max-lora-rank", "16"]\n'
            '    adapters: [{name: qwen-support, path: qwen-support}]\n')
    spec.write_text(text.replace("    routing: {affinity: header", lora + "    routing: "
                                 "{affinity: header", 1))
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    conf = parse((tmp_path / "nginx" / "nginx.conf").read_text())
    affinity = conf.one("upstream", "kit_qwen32b_affinity")
    assert affinity.values("hash") == [("$http_x_session_id$kit_adapter", "consistent")]
    pick = conf.one("map", "$http_x_session_id", "$kit_qwen32b_pool")
    assert pick.values("") == [("kit_qwen32b",)]
    assert conf.one("js_set", "$kit_adapter").args == ("$kit_adapter", "route.adapterName")
    assert conf.one("upstream", "kit_llama8b_affinity").values("hash") == [("$kit_pick",)]
    if nginx_ns.available() is None:
        checked = nginx_ns.nginx_t(tmp_path / "nginx", ["llama8b-r0", "llama8b-r1", "llama8b-r2",
                                                        "llama8b-r3", "qwen32b-r0", "qwen32b-r1"])
        assert checked.returncode == 0, checked.stderr


def test_lora_target_modules_narrow_the_charge(site: Path) -> None:
    spec = declare(site, TWO, top="gpu_memory_gib: 80\n",
                   extra_args=["--lora-target-modules", "qkv_proj", "o_proj"])
    result = run_kit("plan", spec)
    assert result.exit_code == 0, result.output
    # 2 x 64 x (8192 + 5120 + 5120 + 8192) x 32 layers x 2 bytes = 0.203 GiB
    assert ("LoRA adapters         0.20 GiB  2 slots x rank 64 x (lora_A + lora_B of qkv_proj, "
            "o_proj)") in result.output
