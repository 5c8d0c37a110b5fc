"""kit's plan of the house, kept by a test: every module sits in a wing, every import (deferred and
TYPE_CHECKING ones included) runs down the wings' order, no modules import each other in a
circle, and a data-plane program imports nothing of kit's outside its own sub-package.
docs/architecture.md draws the same order; a test below holds the two together."""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.sites import REPO

KIT = REPO / "kit"
# The wings, lowest first. A wing imports only wings before it (and itself); wings on one rank
# are siblings and never import each other.
ORDER: tuple[tuple[str, ...], ...] = (
    ("ground",), ("dataplane",), ("engine",), ("spec",), ("credentials",), ("weights",),
    ("plan",), ("site",), ("front_door", "render", "usage", "supply"), ("converge",), ("nodes",),
    ("views",), ("stack",), ("bench",), ("fleet",), ("commands",), ("entry",),
)
# The top-level modules of kit/, each a wing of its own name unless named here.
GROUND = {"kit", "kit.errors", "kit.files", "kit.layout", "kit.names", "kit.site_lock",
          "kit.state", "kit.table"}
ENTRY = {"kit.cli", "kit.__main__"}
RANK = {wing: rank for rank, wings in enumerate(ORDER) for wing in wings}


def wing_of(module: str) -> str:
    if module in GROUND:
        return "ground"
    if module in ENTRY:
        return "entry"
    return module.split(".")[1]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, package: bool) -> list[tuple[str, int]]:
    """(imported name, line) for every import statement anywhere in the module: at the top, in
    a function (deferred), under `if TYPE_CHECKING:`; relative ones resolved."""
    found = []
    here = module if package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module → {kit module it imports: line}, from {module: (source, is a package)}."""
    graph: dict[str, dict[str, int]] = {}
    for module, (source, package) in sources.items():
        edges: dict[str, int] = {}
        for name, line in imports(source, module, package):
            while name and name not in sources:  # `from kit.x import name` → kit.x
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return graph


def against_direction(graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for module, edges in graph.items():
        for target, line in edges.items():
            here, there = wing_of(module), wing_of(target)
            if here != there and RANK[there] >= RANK[here]:
                problems.append(f"{module}:{line} ({here}) imports {target} ({there})")
    return problems


def outside_own_package(graph: dict[str, dict[str, int]]) -> list[str]:
    """A data-plane program runs alone in a container (the vLLM image's python3, no kit there):
    it may import only its own sub-package of kit/dataplane/ (the fetcher its hash rules), never
    the ground or another program. kit's wings may import it (record_hash, the hash rules)."""
    problems = []
    for module, edges in graph.items():
        if wing_of(module) != "dataplane":
            continue
        own = ".".join(module.split(".")[:3])  # kit.dataplane.<sub-package>
        problems += [f"{module}:{line} (dataplane) imports {target}, outside {own}"
                     for target, line in edges.items()
                     if target != own and not target.startswith(own + ".")]
    return problems


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def kit_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(path, REPO): (path.read_text(), path.name == "__init__.py")
            for path in sorted(KIT.rglob("*.py")) if not {"templates", "data"} & set(path.parts)}


def test_every_module_sits_in_a_known_wing() -> None:
    unknown = sorted(m for m in kit_sources() if wing_of(m) not in RANK)
    assert not unknown, f"place these in a wing (tests/unit/test_wings.py ORDER): {unknown}"


def test_no_import_runs_against_the_wings_order() -> None:
    problems = against_direction(import_graph(kit_sources()))
    assert not problems, "imports against the direction:\n" + "\n".join(problems)


def test_a_data_plane_program_imports_only_its_own_package() -> None:
    problems = outside_own_package(import_graph(kit_sources()))
    assert not problems, "the data plane runs without kit:\n" + "\n".join(problems)


@pytest.mark.parametrize(("statement", "line", "target"), [
    ("from kit.names import USER_NAME", 1, "kit.names"),  # the ground: below, still not there
    ("from kit.dataplane.waker import waker", 1, "kit.dataplane.waker.waker"),  # another program
    ("from ..fetcher import weights_hashes", 1, "kit.dataplane.fetcher.weights_hashes"),
    ("def later():\n    from kit.usage.audit import verify\n", 2, "kit.usage.audit"),
], ids=["ground", "sibling", "relative", "deferred"])
def test_the_data_plane_check_fails_on_a_planted_import(statement: str, line: int,
                                                        target: str) -> None:
    """The real tree with one import planted at the end of a copy of the collector's source:
    found, and nothing else is."""
    sources = kit_sources()
    module = "kit.dataplane.collector.usage_ledger"
    source, package = sources[module]
    sources[module] = (source + statement, package)
    line += len(source.splitlines())
    assert outside_own_package(import_graph(sources)) == [
        f"{module}:{line} (dataplane) imports {target}, outside kit.dataplane.collector"]


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = cycles(import_graph(kit_sources()))
    assert not found, f"import cycles: {found}"


def test_wing_packages_import_nothing() -> None:
    """An empty package keeps every verb's imports lazy: importing kit.stack.up must not pull in
    the rest of the stack wing (python -X importtime)."""
    for package in sorted(KIT.glob("*/__init__.py")):
        if package.parent.name in ("commands", "data"):
            continue
        body = ast.parse(package.read_text()).body
        assert all(isinstance(node, ast.Expr) for node in body), f"{package}: docstring only"


@pytest.mark.parametrize(("statement", "line"), [
    ("from kit.stack.up import up_site", 1),  # at the top
    ("def later():\n    from kit.stack import up\n", 2),  # deferred
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kit.stack.up import X\n", 3),
    ("import kit.stack.up", 1),
    ("from ..stack.up import up_site", 1),  # relative
], ids=["top", "deferred", "type-checking", "import", "relative"])
def test_the_check_sees_every_form_of_import(statement: str, line: int) -> None:
    """The checker itself: an import from the spec wing up to the stack wing, in any form, is
    found, and so is the circle it closes."""
    sources = {"kit.spec.model": (statement, False),
               "kit.stack.up": ("from kit.spec.model import Spec\n", False)}
    graph = import_graph(sources)
    assert against_direction(graph) == [
        f"kit.spec.model:{line} (spec) imports kit.stack.up (stack)"]
    assert cycles(graph) == [["kit.spec.model", "kit.stack.up"]]


def test_siblings_do_not_import_each_other() -> None:
    sources = {"kit.render.k8s": ("from kit.front_door.gate import Gate\n", False),
               "kit.front_door.gate": ("", False)}
    assert against_direction(import_graph(sources)) == [
        "kit.render.k8s:1 (render) imports kit.front_door.gate (front_door)"]


def test_the_map_draws_the_same_order() -> None:
    """docs/architecture.md states the direction in one line; it is this test's ORDER."""
    line = " → ".join(" | ".join(wings) for wings in ORDER)
    assert f"**{line}**" in (REPO / "docs" / "architecture.md").read_text()


# The verb rule: a verb is usage plus one core call. A module of kit/commands reaches at most one
# wing above `site` (its core); the wings up to `site` it may read for its usage and output
# (parsing an argument, Site.load, the engine to connect to); kit.commands modules share the
# options and output helpers.
USAGE_WINGS = {wing for wing, rank in RANK.items() if rank <= RANK["site"]} | {"commands"}


def verb_problems(graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for module, edges in graph.items():
        if wing_of(module) != "commands":
            continue
        core = sorted({wing_of(target) for target in edges} - USAGE_WINGS)
        if len(core) > 1:
            problems.append(f"{module} reaches {len(core)} core wings ({', '.join(core)}): "
                            "one core call, composed in its own wing")
    return problems


def test_every_verb_is_usage_plus_one_core_call() -> None:
    problems = verb_problems(import_graph(kit_sources()))
    assert not problems, "verbs that compose core calls themselves:\n" + "\n".join(problems)


@pytest.mark.parametrize(("verb", "problem"), [
    ("from kit.stack.probe import probe_site\n", None),
    ("from kit.site import Site\nfrom kit.engine.docker_api import connect\n"
     "from kit.commands.options import spec_argument\nfrom kit.stack.probe import probe_site\n",
     None),
    ("from kit.stack.probe import probe_site\n"
     "def later():\n    from kit.converge.sleep import asleep_services\n",
     "kit.commands.probe reaches 2 core wings (converge, stack): one core call, composed in its "
     "own wing"),
], ids=["one-call", "with-usage-and-output", "a-second-core-wing"])
def test_the_verb_rule_fails_on_a_verb_that_composes(verb: str, problem: str | None) -> None:
    sources = {"kit.commands.probe": (verb, False), "kit.stack.probe": ("", False),
               "kit.converge.sleep": ("", False), "kit.site": ("", False),
               "kit.engine.docker_api": ("", False), "kit.commands.options": ("", False)}
    assert verb_problems(import_graph(sources)) == ([problem] if problem else [])


def test_every_wing_ships_in_the_wheel() -> None:
    """pyproject lists kit's packages by name: a wing missing there would install without it."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    packages = {module_name(path, REPO) for path in KIT.rglob("__init__.py")}
    assert packages - listed == set(), "add them to [tool.setuptools] packages in pyproject.toml"


# What `kit validate` and `kit render` must not load: the engine's client and what only other
# verbs use (docs/architecture.md: wing packages stay empty so each verb imports what it uses).
NOT_FOR_RENDER = {"docker", "paramiko", "requests", "matplotlib", "ruamel", "numpy"}
NOT_FOR_VALIDATE = NOT_FOR_RENDER | {"jinja2", "bcrypt", "cryptography", "grafana_foundation_sdk"}


@pytest.mark.parametrize(("verb", "unwanted"), [("validate", NOT_FOR_VALIDATE),
                                                ("render", NOT_FOR_RENDER)])
def test_validate_and_render_import_only_what_they_use(tmp_path: Path, verb: str,
                                                       unwanted: set[str]) -> None:
    shutil.copy(REPO / "site.yaml", tmp_path / "site.yaml")
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "kit", verb, "site.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout + run.stderr
    loaded = {line.rpartition("|")[2].strip().split(".")[0]
              for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "kit" in loaded and not loaded & unwanted, sorted(loaded & unwanted)


# The front door's njs (kit/dataplane/door/): a module imports only modules of its folder, by file
# name (njs resolves it beside the importer, then in js_path), down this order; siblings never
# import each other. njs's own modules are the only others it may require.
DOOR = KIT / "dataplane" / "door"
DOOR_ORDER: tuple[tuple[str, ...], ...] = (
    ("json", "verifier"), ("auth",), ("policy",), ("usage", "wake", "figures", "balance"),
    ("route",))
DOOR_RANK = {module: rank for rank, modules in enumerate(DOOR_ORDER) for module in modules}
NJS_BUILTINS = {"buffer", "crypto", "fs", "querystring", "xml", "zlib"}
NJS_IMPORT = re.compile(r"""^[ \t]*(?:import\b[^'"\n]*|export\b[^'"\n]*\bfrom\s*)(['"])(.*?)\1""",
                        re.MULTILINE)
NJS_REQUIRE = re.compile(r"""\brequire\(\s*(['"])(.*?)\1""")


def door_sources() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(DOOR.glob("*.js"))}


def door_graph(sources: dict[str, str]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """(module → {door module it imports: line}, the imports of anything else)."""
    graph: dict[str, dict[str, int]] = {}
    problems = []
    for module, source in sources.items():
        graph[module] = {}
        for found in NJS_IMPORT.finditer(source):
            line = source.count("\n", 0, found.start()) + 1
            target = found[2].removeprefix("./")
            if target.endswith(".js") and target[:-3] in sources and "/" not in target:
                graph[module].setdefault(target[:-3], line)
            else:
                problems.append(f"{module}.js:{line} imports {found[2]} (not of {DOOR.name}/)")
        for found in NJS_REQUIRE.finditer(source):
            if found[2] not in NJS_BUILTINS:
                line = source.count("\n", 0, found.start()) + 1
                problems.append(f"{module}.js:{line} requires {found[2]} (not njs's own)")
    return graph, problems


def door_against_order(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{module}.js:{line} imports {target}.js"
            for module, edges in graph.items() for target, line in edges.items()
            if DOOR_RANK.get(target, len(DOOR_ORDER)) >= DOOR_RANK.get(module, -1)]


def test_the_doors_modules_import_only_each_other_down_their_order() -> None:
    graph, problems = door_graph(door_sources())
    assert set(graph) == set(DOOR_RANK), "place each door module in DOOR_ORDER"
    assert sum(len(edges) for edges in graph.values()) >= 8  # the check sees the imports
    assert not problems, "\n".join(problems)
    assert not door_against_order(graph), door_against_order(graph)
    assert not cycles(graph)


@pytest.mark.parametrize(("planted", "found"), [
    ("import fetch from '../../../templates/x.js';", "imports ../../../templates/x.js (not"),
    ("import waker from '/etc/nginx/kit/waker.js';", "imports /etc/nginx/kit/waker.js (not"),
    ("import nope from 'nope.js';", "imports nope.js (not"),
    ("export {x} from 'elsewhere.js';", "imports elsewhere.js (not"),
    ("var cp = require('child_process');", "requires child_process (not njs's own)"),
], ids=["climbs-out", "absolute", "unknown", "re-export", "require"])
def test_the_door_check_finds_an_import_from_outside(planted: str, found: str) -> None:
    sources = door_sources()
    sources["auth"] = planted + "\n" + sources["auth"]
    _, problems = door_graph(sources)
    assert len(problems) == 1 and problems[0].startswith(f"auth.js:1 {found}"), problems


def test_the_door_check_finds_an_import_up_the_order_and_a_circle() -> None:
    sources = door_sources()
    sources["json"] = "import route from './route.js';\n" + sources["json"]
    graph, problems = door_graph(sources)
    assert not problems
    assert door_against_order(graph) == ["json.js:1 imports route.js"]
    assert any({"json", "route"} <= set(group) for group in cycles(graph))
