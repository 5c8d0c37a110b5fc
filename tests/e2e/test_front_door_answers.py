"""What the front door answers besides streams: OpenAI-style errors, and models by exact name.

vLLM answers errors as `{"error": {"message", "type", "param", "code"}}`; clients (the OpenAI
SDKs) parse that shape, so nginx's own refusals (401, 413, 429) use it too. Model names are
compared exactly and case-sensitively, as vLLM compares them.
"""

from collections.abc import Iterator

import pytest

from kit.front_door.client import basic_header
from tests.support.live_stack import SERVED_NAME, LiveSite, running

pytestmark = pytest.mark.e2e

ERROR_KEYS = ["message", "type", "param", "code"]


@pytest.fixture
def site(tmp_path, docker_client, test_images) -> Iterator[LiveSite]:
    with running(tmp_path / "site", docker_client, prefix="ans",
                 proxy={"max_body": "2k", "rate_limit_per_ip": 30}) as site:
        yield site


@pytest.fixture(scope="module")
def two_services(tmp_path_factory, docker_client, test_images) -> Iterator[LiveSite]:
    """Two services behind the door, with kit's default limits; the tests only read from it."""
    with running(tmp_path_factory.mktemp("two") / "site", docker_client, prefix="two",
                 more_services={"second": "Second-Chat"}) as site:
        yield site


def error_of(reply, status: int) -> dict:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"] == "application/json"
    assert "max-age" in reply.headers["Strict-Transport-Security"]
    error = reply.json()["error"]
    assert list(error) == ERROR_KEYS and error["code"] == status, error
    return error


def test_refusals_are_openai_errors(site: LiveSite) -> None:
    gate = site.gate()
    missing = gate.fetch("GET", "/v1/models", credentials=None)
    assert error_of(missing, 401)["type"] == "AuthenticationError"
    assert missing.headers["WWW-Authenticate"].startswith("Basic realm=")  # browsers, curl
    wrong = gate.fetch("GET", "/v1/models", credentials=basic_header("ops", "wrong-password"))
    assert error_of(wrong, 401)["type"] == "AuthenticationError"
    assert len(wrong.headers.get_all("WWW-Authenticate")) == 1

    ops = site.basic("ops")
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "x" * 4096}]}
    assert error_of(gate.fetch("POST", "/v1/chat/completions", body=body, credentials=ops),
                    413)["type"] == "BadRequestError"

    statuses = [gate.fetch("GET", "/v1/models", credentials=ops) for _ in range(80)]
    limited = [reply for reply in statuses if reply.status == 429]
    assert limited, "30 a minute with a burst of 30: 80 requests must hit the limit"
    assert error_of(limited[0], 429)["type"] == "RateLimitError"
    assert int(limited[0].headers["Retry-After"]) >= 1


def without_ids(model: dict) -> dict:
    """A model object without what vLLM makes up per answer (the permission's id and time)."""
    return {**model, "permission": [{k: v for k, v in p.items() if k not in ("id", "created")}
                                    for p in model["permission"]]}


def test_models_are_found_by_their_exact_name(two_services: LiveSite) -> None:
    """On the two-service site (the refusals' site has spent its request rate)."""
    gate, ops = two_services.gate(), two_services.basic("ops")
    listed = {m["id"]: m for m in gate.fetch("GET", "/v1/models", credentials=ops).json()["data"]}
    one = gate.fetch("GET", f"/v1/models/{SERVED_NAME}", credentials=ops)
    assert one.status == 200 and without_ids(one.json()) == without_ids(listed[SERVED_NAME])
    assert list(one.json()) == list(listed[SERVED_NAME])  # vLLM's model object, in its order
    for name in (SERVED_NAME.upper(), SERVED_NAME + "x", "default"):
        error = error_of(gate.fetch("GET", f"/v1/models/{name}", credentials=ops), 404)
        assert error["message"] == f"The model `{name}` does not exist."
        chat = {"model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        assert error_of(gate.fetch("POST", "/v1/chat/completions", body=chat, credentials=ops),
                        404)["param"] == "model"
    assert gate.fetch("GET", f"/v1/models/{SERVED_NAME}").status == 401


def test_each_model_is_answered_by_the_service_that_serves_it(two_services: LiveSite) -> None:
    gate, ops = two_services.gate(), two_services.basic("ops")
    listed = {m["id"]: m for m in gate.fetch("GET", "/v1/models", credentials=ops).json()["data"]}
    assert set(listed) == {SERVED_NAME, "Second-Chat"}
    for name, model in listed.items():
        one = gate.fetch("GET", f"/v1/models/{name}", credentials=ops)
        assert one.status == 200 and without_ids(one.json()) == without_ids(model)
        chat = {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        reply = gate.fetch("POST", "/v1/chat/completions", body=chat, credentials=ops)
        assert reply.status == 200 and reply.json()["model"] == name
    for name in ("second-chat", "SECOND-CHAT", "Second-Chat "):  # vLLM compares exactly
        path = f"/v1/models/{name}".replace(" ", "%20")
        assert error_of(gate.fetch("GET", path, credentials=ops), 404)["message"] == (
            f"The model `{name}` does not exist.")
        chat = {"model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        assert error_of(gate.fetch("POST", "/v1/chat/completions", body=chat, credentials=ops),
                        404)["param"] == "model"
