"""The front door's route allow-list against the pinned vLLM's own route table.

tests/standin/vllm-0.33.0-routes.txt is every route vLLM 0.33.0 registers, extracted from its
wheel by scripts/gen_vllm_routes.py. Every one must be classified in kit/names.py (passed,
answered by the door, or refused with a reason): a route a new vLLM adds fails here until
someone decides about it. The e2e proof through the real nginx is tests/e2e/test_door_routes.py.
"""

import importlib.util
import re
import zipfile
from pathlib import Path

from kit.names import DOOR_ROUTES, OPENAI_ROUTES, REFUSED_ROUTES
from tests.support.sites import REPO
from tests.support.vllm_routes import classify, vllm_routes

SCRIPT = REPO / "scripts" / "gen_vllm_routes.py"


def test_every_route_of_the_pinned_vllm_is_classified() -> None:
    routes = vllm_routes()
    assert len(routes) > 80, "the route table is vLLM 0.33.0's whole table"
    unclassified = [f"{method} {path}" for method, path in routes if classify(method, path) is None]
    assert not unclassified, (
        f"vLLM routes kit/names.py does not classify: {unclassified}; add each to OPENAI_ROUTES, "
        "DOOR_ROUTES or REFUSED_ROUTES (and say why in docs/auth.md)")
    passed = sorted({path for method, path in routes if classify(method, path) == "passed"})
    print(f"{len(routes)} vLLM routes: {len(passed)} passed ({passed}), "
          f"{sum(classify(m, p) == 'door' for m, p in routes)} answered by the door, "
          f"{sum(classify(m, p) == 'refused' for m, p in routes)} refused")


def test_the_admin_and_dev_routes_are_refused() -> None:
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up",
                 "/is_sleeping", "/reset_prefix_cache", "/collective_rpc", "/scale_elastic_ep",
                 "/pause", "/resume", "/server_info", "/start_profile"):
        assert classify("POST", path) == classify("GET", path) == "refused", path


def test_each_path_is_classified_once_and_exists_in_vllm() -> None:
    refused = [path for paths in REFUSED_ROUTES.values() for path in paths]
    assert len(refused) == len(set(refused))
    assert not set(refused) & (set(OPENAI_ROUTES) | set(DOOR_ROUTES))
    assert not set(OPENAI_ROUTES) & set(DOOR_ROUTES)
    table = set(vllm_routes())
    # Derived from vLLM's table: each passed route is one vLLM registers with that method.
    assert all((method, path) in table for path, method in OPENAI_ROUTES.items())
    paths = {path for _, path in table}
    kit_only = {"/v1/models/{model}"}  # answered from /v1/models by the door
    assert set(refused) | set(DOOR_ROUTES) - kit_only <= paths, "a refused path vLLM lacks"


def test_a_path_is_passed_only_with_its_method() -> None:
    assert classify("POST", "/v1/chat/completions") == "passed"
    assert classify("GET", "/v1/chat/completions") is None  # vLLM has no such route
    assert classify("POST", "/v1/chat/completions/") is None
    assert classify("POST", "/V1/chat/completions") is None


def test_nginx_passes_exactly_the_allow_list() -> None:
    """One exact location per passed route; no prefix location under /v1/ but the door's
    own /v1/models/ (a prefix would pass what the allow-list does not name). The bundled
    example's nginx.conf (its golden file: test_render keeps it what kit renders)."""
    conf = (REPO / "nginx" / "nginx.conf").read_text()
    locations = re.findall(r"^\s*location\s+(?:(=|\^~|~\*?)\s+)?(\S+)\s*\{", conf, re.M)
    exact = {path for kind, path in locations if kind == "="}
    assert set(OPENAI_ROUTES) <= exact
    v1 = [(kind, path) for kind, path in locations if path.startswith("/v1")]
    assert sorted(v1) == sorted([("=", p) for p in OPENAI_ROUTES] + [("=", "/v1/models"),
                                                                    ("^~", "/v1/models/")])
    assert not [path for kind, path in locations if kind.startswith("~")], "no regex locations"
    for path, method in OPENAI_ROUTES.items():
        block = conf[conf.index(f"location = {path} {{"):]
        assert f"if ($request_method != {method})" in block[:block.index("js_content")]
    # vLLM gets the path nginx normalized and matched, never the client's raw one.
    named = conf[conf.index("location @kit_llama8b {"):]
    assert named[:named.index("}")].count("proxy_pass http://kit_llama8b$uri$is_args$args;") == 1


def load_script():
    spec = importlib.util.spec_from_file_location("gen_vllm_routes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extractor_finds_every_way_a_route_is_registered(tmp_path: Path) -> None:
    """scripts/gen_vllm_routes.py on a small wheel holding each registration form vLLM uses."""
    source = '''
from fastapi import APIRouter, FastAPI
from starlette.routing import Mount
router = APIRouter()

@router.post("/v1/chat/completions", dependencies=[])
async def chat(): ...

@router.get("/health")
async def health(): ...

@router.api_route("/both", methods=["GET", "POST"])
async def both(): ...

@router.websocket("/v1/realtime")
async def realtime(): ...

router.add_api_route("/abort", handler, methods=["POST"])

def attach(app):
    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    async def redirect(): ...
    app.mount("/static", object())
    routes = [Mount("/metrics", object())]
    for route in existing:
        app.add_api_route(route.path, handler)

def build(args):
    if args.off:
        return FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    return FastAPI(docs_url=None)
'''
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/entrypoints/api.py", source)
        archive.writestr("vllm/entrypoints/cli/serve.py", '@router.get("/cli")\ndef f(): ...\n')
        archive.writestr("vllm/other.py", '@router.get("/elsewhere")\ndef f(): ...\n')
    found = {(method, path) for method, path, _ in load_script().routes_of(str(wheel))}
    assert found == {
        ("POST", "/v1/chat/completions"), ("GET", "/health"), ("GET", "/both"),
        ("POST", "/both"), ("WEBSOCKET", "/v1/realtime"), ("POST", "/abort"),
        ("GET", "/docs/oauth2-redirect"), ("*", "/static/{path}"), ("*", "/metrics/{path}"),
        ("GET", "/openapi.json"), ("GET", "/redoc"),  # the second FastAPI(): docs_url only off
    }

