"""The stand-in's sleep mode, as vLLM defines it (tests/standin/vllm_standin/sleep.py; the
stand-in is NOT vLLM): the dev routes only with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode,
requests held while asleep and admitted when a wake completes, the programmed sleep and wake
times, a wake told to fail, and the stand-in's own GPU-memory figure dropping while asleep."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.standin_calls import call, in_flight, metric
from tests.support.standin_process import LLAMA_8B, model_dir, serving

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
SLEEPY = {"VLLM_SERVER_DEV_MODE": "1", "STANDIN_SLEEP_SECONDS": "0.2",
          "STANDIN_WAKE_SECONDS": "0.6", "STANDIN_TOKEN_INTERVAL_MS": "5"}


def _serve(tmp_path: Path, *flags: str, **env: str):
    model = model_dir(tmp_path, "m", LLAMA_8B)
    return serving(str(model), "--served-model-name", "tiny", "--max-model-len", "4096", *flags,
                   **env)


def test_without_dev_mode_the_routes_are_not_there(tmp_path: Path) -> None:
    with _serve(tmp_path, "--enable-sleep-mode") as (port, _):
        for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"),
                             ("GET", "/is_sleeping")):
            answer = call(port, method, path)
            assert (answer.status, answer.json()) == (404, {"detail": "Not Found"}), path


def test_dev_mode_without_sleep_mode_cannot_sleep(tmp_path: Path) -> None:
    with _serve(tmp_path, **SLEEPY) as (port, _):
        assert call(port, "GET", "/is_sleeping").json() == {"is_sleeping": False}
        answer = call(port, "POST", "/sleep?level=1")
        assert (answer.status, answer.body) == (500, b"Internal Server Error")
        assert call(port, "GET", "/is_sleeping").json() == {"is_sleeping": False}
        assert call(port, "POST", "/v1/chat/completions", CHAT).status == 200


def test_asleep_it_answers_health_and_models_holds_generation_until_woken(tmp_path: Path) -> None:
    with _serve(tmp_path, "--enable-sleep-mode", **SLEEPY) as (port, _):
        awake_bytes = call(port, "GET", "/standin/sleep").json()["gpu_memory_used_bytes"]
        started = time.monotonic()
        assert call(port, "POST", "/sleep?level=1").status == 200
        slept_in = time.monotonic() - started
        assert 0.2 <= slept_in < 2, slept_in
        assert call(port, "GET", "/is_sleeping").json() == {"is_sleeping": True}
        assert call(port, "GET", "/health").status == 200
        assert call(port, "GET", "/v1/models").json()["data"][0]["id"] == "tiny"
        asleep_bytes = call(port, "GET", "/standin/sleep").json()["gpu_memory_used_bytes"]
        assert asleep_bytes < 0.2 * awake_bytes, (asleep_bytes, awake_bytes)
        text = call(port, "GET", "/metrics").body.decode()
        assert metric(text, "vllm:engine_sleep_state", 'sleep_state="awake"') == 0.0
        assert metric(text, "vllm:engine_sleep_state", 'sleep_state="weights_offloaded"') == 1.0
        assert metric(text, "standin_gpu_memory_used_bytes") == asleep_bytes

        held = [in_flight(port, "POST", "/v1/chat/completions", CHAT) for _ in range(3)]
        time.sleep(1.0)
        assert all(flight.answer is None for flight in held), "answered while asleep"
        assert call(port, "GET", "/standin/sleep").json()["held"] == 3
        woke_at = time.monotonic()
        wake = call(port, "POST", "/wake_up")
        assert (wake.status, wake.body) == (200, b"")
        assert 0.6 <= wake.done_at - woke_at < 3, wake.done_at - woke_at
        for flight in held:
            flight.thread.join(timeout=10)
            assert flight.answer is not None and flight.answer.status == 200
            assert flight.answer.json()["choices"][0]["finish_reason"] == "length"
            assert flight.answer.done_at > woke_at + 0.6
        state = call(port, "GET", "/standin/sleep").json()
        assert state["gpu_memory_used_bytes"] == awake_bytes
        assert (state["sleeps"], state["wakes"], state["held"]) == (1, 1, 0)
        print(f"slept in {slept_in:.2f} s, woke in {wake.done_at - woke_at:.2f} s; GPU memory "
              f"{awake_bytes / 2**30:.1f} -> {asleep_bytes / 2**30:.1f} GiB "
              "asleep (the stand-in's figure)")


def test_sleep_and_wake_are_idempotent_and_one_at_a_time(tmp_path: Path) -> None:
    with _serve(tmp_path, "--enable-sleep-mode", **SLEEPY) as (port, _):
        assert call(port, "POST", "/wake_up").status == 200  # awake already: nothing to do
        sleeps = [in_flight(port, "POST", "/sleep?level=1") for _ in range(3)]
        for flight in sleeps:
            flight.thread.join(timeout=10)
            assert flight.answer is not None and flight.answer.status == 200
        wakes = [in_flight(port, "POST", "/wake_up") for _ in range(3)]
        for flight in wakes:
            flight.thread.join(timeout=10)
            assert flight.answer is not None and flight.answer.status == 200
        state = call(port, "GET", "/standin/sleep").json()
        assert (state["sleeps"], state["wakes"], state["is_sleeping"]) == (1, 1, False)


def test_a_wake_told_to_fail_leaves_it_asleep_with_the_request_still_held(tmp_path: Path) -> None:
    fail = tmp_path / "fail-wake"
    fail.touch()
    with _serve(tmp_path, "--enable-sleep-mode", STANDIN_WAKE_FAIL_FILE=str(fail),
                **SLEEPY) as (port, _):
        assert call(port, "POST", "/sleep?level=1").status == 200
        held = in_flight(port, "POST", "/v1/chat/completions", CHAT)
        answer = call(port, "POST", "/wake_up")
        assert (answer.status, answer.body) == (500, b"Internal Server Error")
        assert call(port, "GET", "/is_sleeping").json() == {"is_sleeping": True}
        assert held.answer is None
        fail.unlink()
        assert call(port, "POST", "/wake_up").status == 200
        held.thread.join(timeout=10)
        assert held.answer is not None and held.answer.status == 200
        state = call(port, "GET", "/standin/sleep").json()
        assert (state["failed_wakes"], state["wakes"]) == (1, 1)


def test_level_2_discards_the_weights_until_they_are_reloaded(tmp_path: Path) -> None:
    with _serve(tmp_path, "--enable-sleep-mode", **SLEEPY) as (port, _):
        assert call(port, "POST", "/sleep?level=2").status == 200
        text = call(port, "GET", "/metrics").body.decode()
        assert metric(text, "vllm:engine_sleep_state", 'sleep_state="discard_all"') == 1.0
        assert call(port, "POST", "/wake_up").status == 200
        assert call(port, "GET", "/standin/sleep").json()["weights_valid"] is False
        reload = call(port, "POST", "/collective_rpc", {"method": "reload_weights"})
        assert reload.status == 200
        assert call(port, "GET", "/standin/sleep").json()["weights_valid"] is True
        assert call(port, "POST", "/sleep?level=3").status == 500
