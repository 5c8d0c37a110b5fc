"""The pinned vLLM's route table (scripts/gen_vllm_routes.py) and how kit/names.py classifies
each route: the unit test checks the classification, the e2e test sends every route."""

from kit.names import DOOR_ROUTES, OPENAI_ROUTES, REFUSED_ROUTES
from tests.support.sites import REPO

VLLM_ROUTES = REPO / "tests" / "standin" / "vllm-0.33.0-routes.txt"


def vllm_routes() -> list[tuple[str, str]]:
    """(METHOD, PATH) of every route vLLM 0.33.0 registers, once each."""
    lines = [line.split(" ") for line in VLLM_ROUTES.read_text().splitlines()
             if line and not line.startswith("#")]
    return sorted({(method, path) for method, path, _ in lines}, key=lambda r: (r[1], r[0]))


def classify(method: str, path: str) -> str | None:
    """passed (to vLLM), door (answered by the front door), refused, or None: not decided."""
    if OPENAI_ROUTES.get(path) == method:
        return "passed"
    if path in OPENAI_ROUTES:
        return None  # a passed path with a method nobody decided about
    if path in DOOR_ROUTES:
        return "door"
    if any(path in paths for paths in REFUSED_ROUTES.values()):
        return "refused"
    return None


DEV_MODULE = "vllm.entrypoints.serve.dev."  # the routers vLLM mounts with VLLM_SERVER_DEV_MODE=1


def dev_mode_routes() -> list[tuple[str, str]]:
    """(METHOD, PATH) of every route vLLM 0.33.0 opens only in dev mode (its serve.dev
    routers: /sleep, /wake_up, /is_sleeping, caches, /collective_rpc, /server_info, ...)."""
    lines = [line.split(" ") for line in VLLM_ROUTES.read_text().splitlines()
             if line and not line.startswith("#")]
    return sorted({(method, path) for method, path, module in lines
                   if module.startswith(DEV_MODULE)}, key=lambda r: (r[1], r[0]))
