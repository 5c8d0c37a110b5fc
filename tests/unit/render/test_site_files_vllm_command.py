"""The `vllm serve` command kit renders: the model as the positional argument right after
`vllm serve` (compose, worker nodes, Kubernetes), and no flag the pinned vLLM marks deprecated
(its flag list, and `--model`, which vLLM's parser warns "will be removed")."""

import ast
from pathlib import Path

import yaml

from kit.engine.desired import parse_compose
from kit.plan.build import MODELS_MOUNT, VLLM_ENTRYPOINT, model_is_local
from kit.plan.host import load_spec, model_below
from kit.spec.vllm_flags import flag_table, flag_uses
from tests.standin.vllm_standin import cli
from tests.support.adapters import write_adapter
from tests.support.cli import run_kit
from tests.support.sites import MULTI_NODE, OBSERVABILITY, REPO, enable
from tests.support.vllm_deprecations import (
    deprecated_in,
    deprecated_options,
    rendered_vllm_commands,
)

# The modules that build vLLM's argv: every vLLM flag literal in them is one kit can render.
ARGV_SOURCES = ("kit/plan/build.py", "kit/plan/multinode.py", "kit/plan/observability.py",
                "kit/plan/adapters.py")
# A service that turns on every optional flag of kit/plan/build.py (and replicas: the
# --shutdown-timeout of a multi-replica service), beside the base site's, SLO, multi-node.
EVERY_OPTION = """\
  - name: tuned
    model: llama-8b
    gpus: [2, 3]
    tensor_parallel: 1
    max_num_seqs: 16
    dtype: bfloat16
    quantization: fp8
    kv_cache_dtype: fp8
    trust_remote_code: true
    slo: {ttft_p95_ms: 200, tpot_p95_ms: 30}
    adapters: [{name: tuned-lora, path: tuned-lora}]
    idle_sleep: {after: 15m}
  - name: hub
    model: org/some-model
    gpus: [5]
"""


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def _every_option_site(site: Path) -> list[dict]:
    """The base site with every option on and a batch credential, rendered: its compose file
    and worker node's."""
    write_adapter(site.parent / "models" / "tuned-lora", base="llama-8b")
    spec = enable(site, OBSERVABILITY, EVERY_OPTION + MULTI_NODE.replace("gpus: [0, 1]",
                                                                         "gpus: [6, 7]"))
    assert run_kit("render", spec).exit_code == 0
    batch = run_kit("keys", "add", spec, "nightly", "--class", "batch", "--offline")
    assert batch.exit_code == 0, batch.output  # so --scheduling-policy is rendered too
    result = run_kit("render", spec)
    assert result.exit_code == 0, result.output
    return [*_documents(site / "compose" / "docker-compose.yml"),
            *_documents(site / "compose" / "node-gpu02.yml")]


def _rendered_commands(site: Path) -> list[tuple[str, list[str]]]:
    """Every vLLM command kit rendered: the bundled example, the test sites' golden files
    (compose and Kubernetes) and the every-option site."""
    paths = [REPO / "compose" / "docker-compose.yml",
             REPO / "tests" / "data" / "replicas" / "golden" / "docker-compose.yml",
             *sorted((REPO / "tests" / "data" / "k8s").glob("*/expected/service-*.yaml"))]
    documents = [(str(path.relative_to(REPO)), doc) for path in paths for doc in _documents(path)]
    documents += [("every-option site", doc) for doc in _every_option_site(site)]
    # the options of a service's --config file (its adapters), as vLLM reads them
    parser = cli.build_parser()
    files = [(f"every-option site: {path.relative_to(site)}", parser.load_config_file(str(path)))
             for path in sorted((site / "lora").glob("*/adapters.yaml"))]
    return [(f"{where}: {name}", argv) for where, doc in documents
            for name, argv in rendered_vllm_commands(doc)] + files


def _derived_flags() -> set[str]:
    """The vLLM flags written as literals where kit builds vLLM's argv."""
    table = flag_table()
    found = set()
    for source in ARGV_SOURCES:
        for node in ast.walk(ast.parse((REPO / source).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                option = table.lookup(node.value) if node.value.startswith("--") else None
                if option is not None:
                    found.add(option.canonical)
    return found


def test_the_pinned_flag_list_marks_exactly_these_deprecated() -> None:
    """How deprecation reads in vLLM 0.33.0's list: the option's own name "is deprecated" /
    "will be removed"; options that only mention deprecated things are not marked."""
    assert sorted(deprecated_options()) == [
        "--disable-cascade-attn", "--enable-cascade-attn", "--log-config-file",
        "--mamba-cache-mode", "--model",
    ]


def test_a_deprecated_flag_in_a_command_is_found_in_any_spelling() -> None:
    argv = ["/models/m", "--mamba_cache_mode=align", "--model", "/models/m",
            "--enable-cascade-attn", "--enable-cuda-graph", "--port", "8000"]
    problems = deprecated_in(argv, deprecated_options())
    assert [p.split(":")[0] for p in problems] == [
        "--mamba_cache_mode", "--model", "--enable-cascade-attn", "--enable-cuda-graph"]
    assert "will be removed in v0.33.0" in problems[0]


def test_no_flag_kit_renders_is_deprecated_in_the_pinned_version(site: Path) -> None:
    commands = _rendered_commands(site)
    deprecated = deprecated_options()
    problems = [f"{where}: {problem}" for where, argv in commands
                for problem in deprecated_in(argv, deprecated)]
    assert problems == []
    rendered = {use.option.canonical for _, argv in commands
                for use in flag_uses(argv, flag_table()) if use.option}
    # Every flag kit derives was in a rendered command, so the check above saw it.
    assert _derived_flags() - rendered == set()
    assert len(commands) >= 15 and {"--custom-histogram-buckets", "--headless",
                                   "--shutdown-timeout", "--quantization"} <= rendered


def test_compose_runs_vllm_serve_with_the_model_first(site: Path) -> None:
    example = yaml.safe_load((REPO / "compose" / "docker-compose.yml").read_text())
    llama = example["services"]["llama8b"]
    assert llama["entrypoint"] == ["vllm", "serve"] == list(VLLM_ENTRYPOINT)
    assert llama["command"][:2] == ["/models/llama-3.1-8b-instruct", "--served-model-name"]
    documents = _every_option_site(site)
    services = {**documents[0]["services"], **documents[1]["services"]}
    assert services["hub"]["command"][0] == "org/some-model"  # a Hub id, not a local folder
    assert services["tuned-r0"]["command"][0] == f"{MODELS_MOUNT}/llama-8b"
    assert documents[1]["services"]["big"]["command"][0] == f"{MODELS_MOUNT}/llama-8b"  # worker
    for name, argv in rendered_vllm_commands(documents[0]) + rendered_vllm_commands(documents[1]):
        assert not argv[0].startswith("-") and "--model" not in argv, name


def test_kubernetes_runs_vllm_serve_with_the_model_first() -> None:
    """`kit export k8s` (golden manifests): `vllm serve` as the container's command, the
    spec's model (a local folder under the models mount, or a Hub id) as its first argument."""
    for path in sorted((REPO / "tests" / "data" / "k8s").glob("*/expected/service-*.yaml")):
        case = path.parent.parent
        spec = load_spec(REPO / "site.yaml" if case.name == "example" else case / "site.yaml")
        service = next(s for s in spec.services if path.name == f"service-{s.name}.yaml")
        model = (f"{MODELS_MOUNT}/{service.model}" if model_is_local(spec, service.model)
                 else service.model)
        commands = [command for doc in _documents(path) for command in rendered_vllm_commands(doc)]
        assert commands, path
        for where, args in commands:
            assert args[0] == model and "--model" not in args, where


def test_the_model_folder_is_read_from_both_forms(tmp_path: Path) -> None:
    """Preflight's model folder: the positional model kit renders, and `--model` in a compose
    file an older kit rendered (no entrypoint: the image's own)."""
    compose = {"services": {
        "new": {"image": "v", "entrypoint": ["vllm", "serve"],
                "command": ["/models/a", "--served-model-name", "a"]},
        "old": {"image": "v", "command": ["--model", "/models/b", "--served-model-name", "b"]},
        "hub": {"image": "v", "entrypoint": ["vllm", "serve"], "command": ["org/c"]},
    }}
    desired = parse_compose(compose, "p", tmp_path / "docker-compose.yml", tmp_path)
    assert [model_below(desired.service(name), MODELS_MOUNT) for name in ("new", "old", "hub")] \
        == ["a", "b", None]
