"""A service with idle_sleep runs vLLM in dev mode (issue 26): its /sleep, /wake_up and every
other dev-mode route (tests/standin/vllm-0.33.0-routes.txt, vLLM's serve.dev routers) must stay
unreachable through the front door whatever the credential, and so must the other admin routes.

The real nginx + njs door, rendered from a spec with idle_sleep, before the stand-in started as
kit starts it (`--enable-sleep-mode`, VLLM_SERVER_DEV_MODE=1), no Docker. Each route, with every
method and with no credential, a bogus one, and a valid Basic and Bearer one, is an OpenAI-style
JSON 404; the stand-in's access log (it serves these routes in dev mode, as vLLM does) shows none
of them arrived, while the same /sleep sent straight to it (inside the stack) does put it to
sleep: the witness can see them.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator

import pytest

from kit.names import REFUSED_ROUTES
from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.raw_http import request as raw_request
from tests.support.sites import base_site
from tests.support.vllm_routes import dev_mode_routes

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
ERROR_KEYS = ["message", "type", "param", "code"]
ADMIN = next(paths for why, paths in REFUSED_ROUTES.items() if why.startswith("changes the engine"))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, dict[str, str]]]:
    root = tmp_path_factory.mktemp("sleep-door")
    site = base_site(root)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace(
        "read_timeout: 900}", "read_timeout: 900, rate_limit_per_ip: 100000, "
        "rate_limit_per_credential: 100000, failed_logins_per_ip: 10000}").replace(
        "    max_num_seqs: 64\n", "    max_num_seqs: 64\n    idle_sleep: {after: 15m}\n"))
    password = render_site(Site.load(spec)).new_passwords[0].password
    added = run_kit("keys", "add", spec, "ops-key", "--offline")
    assert added.exit_code == 0, added.output
    key = added.output.split("key ops-key: ")[1].split()[0]
    rendered = (site / "compose" / "docker-compose.yml").read_text()
    assert "--enable-sleep-mode" in rendered, "the door test must run what kit renders"
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b"], root / "models" / "llama-8b",
                      SERVED, HOST, verifier=True,
                      standin_args=("--enable-sleep-mode", "--enable-uvicorn-access-log"),
                      VLLM_SERVER_DEV_MODE="1", STANDIN_LOAD_SECONDS="0.1",
                      STANDIN_SLEEP_SECONDS="0.05", STANDIN_WAKE_SECONDS="0.05") as running:
        basic = base64.b64encode(f"ops:{password}".encode()).decode()
        yield running, {"none": "", "bogus Basic": "Basic " + "a" * 20,
                        "bogus Bearer": "Bearer sk-kit-nope", "Basic": f"Basic {basic}",
                        "Bearer": f"Bearer {key}"}


def reached(door: Door) -> list[str]:
    """Paths of the requests the stand-in received so far, in order (its access log, turned
    back on after the door helper's --disable-uvicorn-access-log)."""
    time.sleep(0.3)  # it writes its line after the answer
    log = (door.work / "standin.out").read_text(errors="replace")
    return [target.split("?")[0] for target in re.findall(r'"[A-Z]+ (\S+) HTTP/1\.[01]"', log)]


def test_the_dev_mode_routes_are_the_ones_the_brief_names() -> None:
    paths = {path for _, path in dev_mode_routes()}
    assert {"/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache",
            "/collective_rpc"} <= paths, paths
    print(f"{len(paths)} dev-mode routes: {', '.join(sorted(paths))}")


def test_dev_and_admin_routes_are_json_404_for_every_credential(
        door: tuple[Door, dict[str, str]]) -> None:
    running, credentials = door
    mark = len(reached(running))
    paths = sorted({path for _, path in dev_mode_routes()} | set(ADMIN))
    sent = 0
    for path in paths:
        for target in (path, path + "?level=1"):
            for method in ("POST", "GET", "PUT", "DELETE"):
                for name, credential in credentials.items():
                    headers = [("Content-Type", "application/json")]
                    if credential:
                        headers.append(("Authorization", credential))
                    body = json.dumps({"method": "reload_weights"}).encode()
                    reply = running.exchange(raw_request(method, target, HOST, headers, body))
                    sent += 1
                    assert reply.status == 404, (method, target, name, reply.status, reply.body)
                    assert reply.headers["content-type"] == "application/json", (target, name)
                    error = json.loads(reply.body)["error"]
                    assert list(error) == ERROR_KEYS, error
                    assert (error["type"], error["code"]) == ("NotFoundError", 404), error
    arrived = reached(running)[mark:]
    assert not set(arrived) & set(paths), f"reached the stand-in: {sorted(set(arrived))}"
    print(f"{len(paths)} routes x 2 targets x 4 methods x {len(credentials)} credentials: "
          f"{sent} requests, all JSON 404, none reached vLLM")


def test_the_witness_sees_a_dev_route_sent_from_inside(door: tuple[Door, dict[str, str]]) -> None:
    running, _ = door
    mark = len(reached(running))
    slept = running.exchange(raw_request("POST", "/sleep?level=1", HOST), direct=True)
    assert slept.status == 200, slept
    asleep = running.exchange(raw_request("GET", "/is_sleeping", HOST), direct=True)
    assert json.loads(asleep.body) == {"is_sleeping": True}
    assert running.exchange(raw_request("POST", "/wake_up", HOST), direct=True).status == 200
    assert reached(running)[mark:] == ["/sleep", "/is_sleeping", "/wake_up"]


def test_the_rendered_door_has_no_sleep_route(door: tuple[Door, dict[str, str]]) -> None:
    running, _ = door
    conf = (running.work.parent / "site" / "nginx" / "nginx.conf").read_text()
    assert not re.search(r"/(sleep|wake_up|is_sleeping|collective_rpc)\b", conf)
