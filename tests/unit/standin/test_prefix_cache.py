"""The stand-in's prefix cache (tests/standin/vllm_standin/prefix_cache.py), as vLLM's V1
automatic prefix caching keeps one: blocks of 16 tokens, chained hashes, an adapter's own,
least recently used out first, hits in whole blocks short of the last token; TTFT falls with
the cached share of the prompt; vLLM's counters count tokens."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.support.standin_calls import call, metric
from tests.support.standin_process import LLAMA_8B, STANDIN, model_dir, serving

sys.path.insert(0, str(STANDIN))
from vllm_standin.prefix_cache import PrefixCache  # noqa: E402


def tokens(n: int, start: int = 0) -> list[str]:
    return [f"t{i}" for i in range(start, start + n)]


def test_hits_are_whole_blocks_of_a_shared_start_never_the_last_token():
    cache = PrefixCache(16, 100)
    prompt = tokens(40)
    assert cache.lookup(prompt, None) == 0
    cache.store(prompt, None)  # 2 full blocks kept, the 8 tokens after them not
    assert cache.lookup(prompt, None) == 32
    assert cache.lookup(prompt[:32], None) == 16  # the last token is computed again
    assert cache.lookup(prompt[:20] + tokens(20, 100), None) == 16  # diverges in block 2
    assert cache.lookup(tokens(1, 999) + prompt[1:], None) == 0  # a block's hash chains
    assert cache.lookup(prompt, "adapter-a") == 0  # an adapter's cache is its own
    assert (cache.queries, cache.hits) == (40 * 5 + 32, 32 + 16 + 16)


def test_the_least_recently_used_blocks_leave_first():
    cache = PrefixCache(16, 4)
    first, second = tokens(32), tokens(32, 500)
    cache.store(first, None)
    cache.store(second, None)
    assert cache.lookup(first + ["x"], None) == 32  # used: now the most recent
    cache.store(tokens(32, 900), None)  # two more blocks: the second prompt's leave
    assert cache.lookup(first + ["x"], None) == 32
    assert cache.lookup(second + ["x"], None) == 0


def test_a_served_prompt_found_cached_answers_sooner_and_is_counted(tmp_path: Path):
    """1 ms a prompt token beside the step (chunked prefill): a 1,600-word system prompt costs
    its prefill once; the next conversation on it computes only its own question."""
    model = model_dir(tmp_path, "m", LLAMA_8B)
    system = " ".join(f"w{i}" for i in range(1600))

    def ask(port: int, question: str) -> float:
        body = {"model": "tiny", "max_tokens": 1, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]}
        answer = call(port, "POST", "/v1/chat/completions", body)
        assert answer.status == 200, answer.body
        return answer.json()["usage"]["prompt_tokens"]

    with serving(str(model), "--served-model-name", "tiny", "--max-model-len", "4096",
                 "--max-num-batched-tokens", "8192", STANDIN_PREFILL_BUDGET="1",
                 STANDIN_PREFILL_US_PER_TOKEN="1000", STANDIN_TOKEN_INTERVAL_MS="5",
                 STANDIN_PREFIX_CACHE_BLOCKS="1000") as (port, _):
        start = time.monotonic()
        prompt = ask(port, "first question")
        cold = time.monotonic() - start
        start = time.monotonic()
        second = ask(port, "another one entirely")
        warm = time.monotonic() - start
        text = call(port, "GET", "/metrics").body.decode()
    assert cold > 1.5 and warm < 0.3, (cold, warm)  # 1,6xx tokens at 1 ms, then a few dozen
    queries = metric(text, "vllm:prefix_cache_queries_total")
    hits = metric(text, "vllm:prefix_cache_hits_total")
    assert queries == prompt + second  # both prompts asked, in tokens
    # the 1,608 tokens up to the question's own (<s>, the system message, the user's turn
    # opened) share 100 whole blocks
    assert hits == 1600
