#!/usr/bin/env python3
"""List every HTTP route a vLLM wheel registers, from its source, without installing it.

kit's front door passes only an allow-list of vLLM's routes (kit/names.py); a unit test checks
that list against the pinned version's whole route table, which this script extracts:

    pip download --no-deps vllm==0.33.0 -d /tmp/vllmwheel
    python3 scripts/gen_vllm_routes.py /tmp/vllmwheel/vllm-0.33.0-*.whl \
        > tests/standin/vllm-0.33.0-routes.txt

It parses (never imports) every module under vllm/entrypoints/ except the CLI and finds:
`@<router or app>.get/post/put/patch/delete/websocket/api_route("path")` decorators,
`<x>.add_api_route("path", …, methods=[…])` and `add_route` calls, `Mount("path", …)` and
`<x>.mount("path", …)` (a whole subtree: method `*`, path ending `/{path}`), and FastAPI's own
documentation routes for each `FastAPI(…)` constructor that does not switch them off. A call whose
path is not a literal (vLLM re-registering routes it already lists) is reported on stderr.
One output line per route: METHOD PATH MODULE:FUNCTION.
"""

import ast
import sys
import zipfile
from pathlib import PurePosixPath

DECORATOR_METHODS = {"get": "GET", "post": "POST", "put": "PUT", "patch": "PATCH",
                     "delete": "DELETE", "websocket": "WEBSOCKET"}
# What FastAPI() registers unless the keyword is None (fastapi.applications.FastAPI).
FASTAPI_DEFAULTS = {"openapi_url": "/openapi.json", "docs_url": "/docs", "redoc_url": "/redoc"}
SWAGGER_REDIRECT = "/docs/oauth2-redirect"  # FastAPI's swagger_ui_oauth2_redirect_url


def literal_path(node: ast.expr) -> str | None:
    """A route path given as a string literal, or FastAPI's attribute for the Swagger redirect."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and node.attr == "swagger_ui_oauth2_redirect_url":
        return SWAGGER_REDIRECT
    return None


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def methods_of(call: ast.Call) -> list[str]:
    value = keyword(call, "methods")
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return sorted(e.value.upper() for e in value.elts if isinstance(e, ast.Constant))
    return ["GET"]  # Starlette's and FastAPI's default


class RouteFinder(ast.NodeVisitor):
    """The routes one module registers, each with the function that handles it."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.routes: set[tuple[str, str, str]] = set()
        self.function = "<module>"

    def add(self, method: str, path: str, handler: str | None = None) -> None:
        self.routes.add((method, path, f"{self.module}:{handler or self.function}"))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                    and decorator.args):
                continue
            path = literal_path(decorator.args[0])
            verb = decorator.func.attr
            if path is None or verb not in (*DECORATOR_METHODS, "api_route", "route"):
                continue
            verbs = methods_of(decorator) if verb in ("api_route", "route") else [
                DECORATOR_METHODS[verb]]
            for method in verbs:
                self.add(method, path, node.name)
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        if name in ("add_api_route", "add_route", "add_websocket_route", "mount", "Mount"):
            path = literal_path(node.args[0]) if node.args else None
            if path is None:
                print(f"{self.module}:{self.function}: {name} with a computed path (skipped)",
                      file=sys.stderr)
            elif name in ("mount", "Mount"):
                self.add("*", path.rstrip("/") + "/{path}")
            elif name == "add_websocket_route":
                self.add("WEBSOCKET", path)
            else:
                for method in methods_of(node):
                    self.add(method, path)
        elif name == "FastAPI":
            for word, path in FASTAPI_DEFAULTS.items():
                value = keyword(node, word)
                if not (isinstance(value, ast.Constant) and value.value is None):
                    self.add("GET", path, "FastAPI")
            if not _is_none(keyword(node, "docs_url")):
                self.add("GET", SWAGGER_REDIRECT, "FastAPI")
        self.generic_visit(node)


def _is_none(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def routes_of(wheel: str) -> list[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            path = PurePosixPath(name)
            if (path.suffix != ".py" or path.parts[:2] != ("vllm", "entrypoints")
                    or "cli" in path.parts):
                continue
            finder = RouteFinder(".".join(path.with_suffix("").parts))
            finder.visit(ast.parse(archive.read(name), filename=name))
            found |= finder.routes
    return sorted(found, key=lambda route: (route[1], route[0], route[2]))


def main() -> None:
    wheel = sys.argv[1]
    version = PurePosixPath(wheel).name.split("-")[1]
    print(f"# Every HTTP route vLLM {version} registers (METHOD PATH MODULE:FUNCTION), extracted")
    print("# from the wheel's source by scripts/gen_vllm_routes.py. Which ones kit's front door")
    print("# passes: kit/names.py (OPENAI_ROUTES); why: docs/auth.md.")
    for method, path, where in routes_of(wheel):
        print(f"{method} {path} {where}")


if __name__ == "__main__":
    main()
