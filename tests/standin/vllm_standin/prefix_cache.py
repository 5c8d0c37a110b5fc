"""The stand-in's prefix cache, as vLLM's V1 automatic prefix caching keeps one (docs: "Automatic
Prefix Caching", vLLM's design pages).

A prompt is cut into blocks of `block_size` tokens; a full block is known by a hash of its parent
block's hash, its own tokens and the LoRA adapter the request runs on (an adapter's cache is its
own). A new request hits the longest run of leading blocks the cache holds, at most its prompt
less one token (vLLM computes the last token again for its logits), so only whole blocks count.
Blocks are kept least recently used first out once `capacity_blocks` are held. What a request
hit and asked is counted in tokens, as vLLM's counters vllm:prefix_cache_hits and
vllm:prefix_cache_queries count them.

Where it differs from vLLM (tests/standin/README.md): blocks of generated tokens are not cached,
and the capacity is a number of blocks beside the running requests' own (vLLM evicts only the
blocks no running request holds, from the same pool).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, block_size: int, capacity_blocks: int):
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()  # block hash → (LRU order)
        self.queries = 0  # tokens asked (vllm:prefix_cache_queries)
        self.hits = 0  # tokens found (vllm:prefix_cache_hits)

    def _hashes(self, tokens: Sequence[str], lora: str | None) -> list[int]:
        """The chained hash of each full block of `tokens`."""
        hashes, parent = [], hash(("kit-standin", lora))
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(tokens[start:start + self.block_size])))
            hashes.append(parent)
        return hashes

    def lookup(self, tokens: Sequence[str], lora: str | None) -> int:
        """The prompt tokens found cached (a whole number of blocks, never the last token); the
        blocks it hit become the most recently used, the query and the hit are counted."""
        self.queries += len(tokens)
        hit = 0
        for block in self._hashes(tokens[:max(0, len(tokens) - 1)], lora):
            if block not in self.blocks:
                break
            self.blocks.move_to_end(block)
            hit += self.block_size
        self.hits += hit
        return hit

    def store(self, tokens: Sequence[str], lora: str | None) -> None:
        """The prompt's full blocks kept (computed now), the least recently used dropped."""
        for block in self._hashes(tokens, lora):
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def reset(self) -> None:
        """vLLM's /reset_prefix_cache (and a wake from level-2 sleep): nothing cached."""
        self.blocks.clear()

    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
