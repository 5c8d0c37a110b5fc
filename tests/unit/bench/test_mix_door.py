"""`kit bench --mix` (kit/bench/mix.py) through the real nginx + njs door and the stand-in with
vLLM's priority scheduler, without Docker: a batch key at twice the service's 8 slots and an
interactive key at once; the door caps batch at 4 in flight (429, sent again), the stand-in
orders its queue by the priority the door sets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.bench.client import Endpoint
from kit.bench.mix import TTFT_GOAL, MixOptions, batch_authorization, mix_report, run_mix
from kit.errors import BadInput
from kit.render.site_files import render_site
from kit.site import Site
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.sites import base_site

pytestmark = pytest.mark.skipif(nginx_ns.available() is not None,
                                reason=str(nginx_ns.available()))

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"


def add_key(spec: Path, name: str, *options: str) -> str:
    added = run_kit("keys", "add", spec, name, "--offline", *options)
    assert added.exit_code == 0, added.output
    return added.output.split(f"key {name}: ")[1].split()[0]


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Door, Site, dict]]:
    root = tmp_path_factory.mktemp("mix")
    spec = base_site(root) / "site.yaml"
    spec.write_text(spec.read_text().replace("max_num_seqs: 64", "max_num_seqs: 8"))
    render_site(Site.load(spec))
    keys = {"chat": add_key(spec, "chat"), "nightly": add_key(spec, "nightly", "--class", "batch")}
    site = Site.load(spec)
    render_site(site)  # with a batch key: the door's cap and the priority scheduler
    (root / "work").mkdir()
    with serving_door(spec.parent / "nginx", root / "work", ["llama8b"],
                      root / "models" / "llama-8b", SERVED, HOST,
                      standin_args=("--max-num-seqs", "8", "--scheduling-policy", "priority"),
                      STANDIN_TOKEN_INTERVAL_MS="20", STANDIN_TTFT_MS="150",
                      STANDIN_LOAD_SECONDS="0.1") as serving:
        yield serving, site, keys


def test_the_mix_prints_each_class_and_batch_is_capped(
        door: tuple[Door, Site, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    serving, site, keys = door
    monkeypatch.setenv("KIT_BENCH_BATCH_KEY", keys["nightly"])
    endpoint = Endpoint(address="127.0.0.1", port=443, host=HOST, tls=True,
                        ca_file=str(serving.ca_file), authorization=f"Bearer {keys['chat']}",
                        model=SERVED, prompt="tell me a story", output_tokens=16)
    with serving.inside():
        result = run_mix(site, "llama8b", endpoint, MixOptions(4, 2), print)
    print(mix_report(result))
    assert (result.slots, result.batch_cap, result.batch_streams) == (8, 4, 16)
    assert not result.failed
    assert result.batch_mixed.refused > 0 and result.batch_alone.refused > 0  # the door's cap
    assert result.idle.outcomes and result.batch_mixed.outcomes
    assert result.ttft_ratio <= 1.25 * TTFT_GOAL, mix_report(result)  # a noisy, shared machine
    assert result.batch_share >= 0.5, mix_report(result)
    # batch is not starved: admitted, it waits in the engine no longer than with no interactive
    # load, give or take a few steps of 20 ms
    assert result.batch_mixed.ttft_p99_s() <= result.batch_alone.ttft_p99_s() + 0.2
    # each class's TPOT and throughput, as `vllm bench serve` computes TPOT: the stand-in paces
    # tokens 20 ms apart, so no class's median can be below that
    report, figures = mix_report(result), result.to_json()
    for name, part in (("interactive alone", "idle"), ("batch alone", "batch_alone"),
                       ("interactive with batch", "interactive_mixed"),
                       ("batch with interactive", "batch_mixed")):
        assert f"{name}: TTFT p95 " in report, report
        assert figures[part]["tpot_p50_ms"] >= 19, figures


def test_the_batch_credential_must_be_a_batch_key(
        door: tuple[Door, Site, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    _, site, keys = door
    for value, says in (("", "KIT_BENCH_BATCH_KEY is not set"),
                        ("sk-kit-unknown", "is not a key of"),
                        (keys["chat"], "is key chat, whose class is interactive")):
        monkeypatch.setenv("KIT_BENCH_BATCH_KEY", value)
        with pytest.raises(BadInput) as refused:
            batch_authorization(site)
        assert says in refused.value.message
