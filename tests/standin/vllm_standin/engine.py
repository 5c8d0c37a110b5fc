"""The stand-in's "engine": a scheduler that emits one token per running request per step.

Like vLLM's engine it runs requests in batched steps: at most --max-num-seqs run at once (and only
as many as the simulated KV cache holds), the rest wait in FIFO order. Every step (one every
STANDIN_TOKEN_INTERVAL_MS) gives each running request its next token. Metrics are real counts
of what was served, exposed in Prometheus text as vLLM names them.

The capacity model for benchmarks (both off by default): a programmed prefill time (`ttft_s`: a
request admitted at t sends its first token at exactly t + ttft_s, and a request that finds room
is admitted the moment it arrives; its second token comes with the first step at least half a
step later, so its gaps average one step), and a pace that slows with the batch (`per_seq_s`: a step
lasts interval + per_seq_s x running requests), so TPOT grows with load as on a real GPU.

Two more behaviours of vLLM's V1 scheduler, opt-in for benchmarks: chunked prefill under a
token budget (`prefill_budget`, its --max-num-batched-tokens: each step first gives every
decoding request its token, then spends what is left of the budget on prompt tokens — the
unfinished prompts first, then new requests while slots are free, each request's chunk at most
`long_prefill_tokens` when set, vLLM's --long-prefill-token-threshold; a step lasts
`prefill_s_per_token` longer per prompt token it computes, and a request's first token comes
with the step after its prompt's last chunk. So requests wait while sequence slots are free, and
a burst's prefills queue behind each other: TTFT comes from the prefill work, not from
`ttft_s`, which this mode does not use), and a KV cache that is
allocated block by block as tokens are generated (`preempt`): when a running request needs a
block and none is free, the newest running request is preempted (its blocks freed, back to the
head of the queue, counted in vllm:num_preemptions_total) and recomputed when readmitted.

vLLM's priority scheduler (`--scheduling-policy priority`; the stand-in's behaviour, as vLLM
defines it): the waiting queue is ordered by (priority, arrival), the lower `priority` first, ties
first come first served; a running request is never preempted to make room for a waiting one (it
finishes; measured on vLLM 0.20), and when the KV cache must preempt, the running request with
the highest (priority, arrival) goes back to the queue, in its order. With the default policy
(`fcfs`) a request's `priority` is accepted and ignored, as vLLM 0.20 did.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

from .prefix_cache import PrefixCache

# Token texts: short lowercase pieces, most with a leading space (no JSON escaping needed).
_rng = random.Random(20261129)
VOCAB = [
    (" " if _rng.random() < 0.7 else "")
    + "".join(_rng.choices("abcdefghijklmnopqrstuvwxyz", k=_rng.randint(1, 6)))
    for _ in range(4096)
]

# Histogram buckets as vLLM 0.20 exposed them (http-trace.json).
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple):
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip((*self.buckets, math.inf), self.counts, strict=True):
            total += count
            le = "+Inf" if bound == math.inf else repr(float(bound))
            bucket_labels = _labels(labels, 'le="' + le + '"')
            out.append(f"{self.name}_bucket{{{bucket_labels}}} {float(total)}")
        out.append(f"{self.name}_count{{{labels}}} {float(total)}")
        out.append(f"{self.name}_sum{{{labels}}} {self.sum!r}")
        out += [
            f"# HELP {self.name}_created {self.help}",
            f"# TYPE {self.name}_created gauge",
            f"{self.name}_created{{{labels}}} {self.created!r}",
        ]
        return out


class Request:
    """One generation. `on_token(index, text, last)` is called once per step it runs; `arrival`
    (time.monotonic's clock) is when the server read it, now if not given."""

    __slots__ = (
        "prompt_tokens",
        "max_tokens",
        "on_token",
        "arrival",
        "scheduled",
        "first_token",
        "last_token",
        "generated",
        "rng",
        "finished",
        "prefilling",
        "admission",
        "to_prefill",
        "priority",
        "lora",
        "tokens",
    )

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        on_token: Callable[[int, str, bool], None],
        arrival: float | None = None,
        priority: int = 0,
    ):
        self.prompt_tokens = prompt_tokens
        self.priority = priority
        self.max_tokens = max_tokens
        self.on_token = on_token
        self.arrival = time.monotonic() if arrival is None else arrival
        self.scheduled = self.first_token = self.last_token = 0.0
        self.generated = 0
        self.rng = random.Random()
        self.finished = False
        self.prefilling = False
        self.admission = 0  # admissions so far: a prefill timer of an earlier one is stale
        self.to_prefill = 0  # prompt tokens still to compute (chunked prefill)
        self.lora: str | None = None  # the LoRA adapter it runs on (None: the base model)
        self.tokens: Sequence[str] = ()  # its prompt's tokens, for the prefix cache

    def order(self) -> tuple[int, float]:
        """Its place in the priority scheduler's queue: the lower priority, then the earlier."""
        return (self.priority, self.arrival)

    def blocks(self, block_size: int) -> int:
        return -(-(self.prompt_tokens + self.max_tokens) // block_size)


class Engine:
    def __init__(
        self,
        *,
        model_name: str,
        interval_s: float,
        max_num_seqs: int,
        kv_tokens: int | None,
        block_size: int,
        cache_info: dict[str, str],
        bounds: dict[str, tuple[float, ...]] | None = None,
        ttft_s: float | None = None,
        per_seq_s: float = 0.0,
        prefill_budget: int | None = None,
        prefill_s_per_token: float = 0.0,
        long_prefill_tokens: int = 0,
        preempt: bool = False,
        priority_scheduling: bool = False,
        prefix_cache: PrefixCache | None = None,
    ):
        self.model_name = model_name
        self.prefix_cache = prefix_cache
        self.priority_scheduling = priority_scheduling
        self.interval = interval_s
        self.ttft_s = ttft_s
        self.per_seq_s = per_seq_s
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.total_blocks = kv_tokens // block_size if kv_tokens else None
        self.used_blocks = 0
        self.prefill_budget = prefill_budget
        self.prefill_s_per_token = prefill_s_per_token
        self.long_prefill_tokens = long_prefill_tokens  # --long-prefill-token-threshold
        self.preempt = preempt
        self.preemptions = 0
        self.cache_info = cache_info
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # vllm:lora_requests_info (with --enable-lora: max_lora set): every label set the gauge
        # had → the time it was last set, as prometheus_client keeps them all
        self.max_lora: int | None = None
        self.lora_series: dict[tuple[str, str], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._next_tick = 0.0
        self.created = time.time()
        self.counters = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
        }
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.window = {"prompt": 0, "generation": 0, "start": time.monotonic()}
        self.hist = {
            "request_prompt_tokens": Histogram(
                "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS
            ),
            "request_generation_tokens": Histogram(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                TOKEN_BUCKETS,
            ),
            "iteration_tokens_total": Histogram(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_BUCKETS,
            ),
            "request_params_max_tokens": Histogram(
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                TOKEN_BUCKETS,
            ),
            "time_to_first_token_seconds": Histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ),
            "inter_token_latency_seconds": Histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
            ),
            "request_time_per_output_token_seconds": Histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                ITL_BUCKETS,
            ),
            "e2e_request_latency_seconds": Histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                LATENCY_BUCKETS,
            ),
            "request_queue_time_seconds": Histogram(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                LATENCY_BUCKETS,
            ),
            "request_inference_time_seconds": Histogram(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                LATENCY_BUCKETS,
            ),
            "request_prefill_time_seconds": Histogram(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                LATENCY_BUCKETS,
            ),
            "request_decode_time_seconds": Histogram(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                LATENCY_BUCKETS,
            ),
        }
        for histogram in self.hist.values():  # --custom-histogram-buckets
            histogram.buckets = (bounds or {}).get(histogram.name, histogram.buckets)
            histogram.counts = [0] * (len(histogram.buckets) + 1)

    # --- scheduling ------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self._queue(request, head=False)
        self._record_lora()
        self.hist["request_params_max_tokens"].observe(request.max_tokens)
        if self.ttft_s is not None and self.prefill_budget is None:  # admitted on arrival
            self._admit(request.arrival)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._next_tick = loop.time()
            self._timer = loop.call_soon(self._step)

    def _queue(self, request: Request, *, head: bool) -> None:
        """Into the waiting queue: by (priority, arrival) under the priority scheduler; else at
        its end, or at its head for a preempted request (first come, first served)."""
        if self.priority_scheduling:
            orders = [waiting.order() for waiting in self.waiting]
            self.waiting.insert(bisect.bisect_right(orders, request.order()), request)
        elif head:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def pooled(self, prompt_tokens: int) -> None:
        """A pooling request (an embedding): its prompt computed, nothing generated."""
        self.counters["prompt_tokens"] += prompt_tokens
        self.window["prompt"] += prompt_tokens

    def abort(self, request: Request) -> None:
        if request.finished:
            return
        if request in self.running:
            self.running.remove(request)
            self.used_blocks -= request.blocks(self.block_size)
        elif request in self.waiting:
            self.waiting.remove(request)
        # else: never admitted (held while the engine slept, tests/standin/vllm_standin/sleep.py)
        self._finish(request, "abort", time.monotonic())

    def _fits(self, request: Request) -> bool:
        if self.total_blocks is None:
            return True
        if self.preempt:  # V1: blocks for what is computed so far, the rest as it grows
            needed = self._live_blocks(1) + self._blocks_for(request, 1)
            return needed <= self.total_blocks
        return self.used_blocks + request.blocks(self.block_size) <= self.total_blocks

    def _blocks_for(self, request: Request, extra: int) -> int:
        return -(-(request.prompt_tokens + request.generated + extra) // self.block_size)

    def _live_blocks(self, extra: int) -> int:
        return sum(self._blocks_for(r, extra) for r in self.running)

    def _admit(self, now: float) -> int:
        prefill = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if not self._fits(request) and self.running:  # alone, it runs: no deadlock
                break
            self._admit_one(request, now)
            prefill += request.prompt_tokens
        return prefill

    def _admit_one(self, request: Request, now: float) -> None:
        """The head of the queue into the running batch, its prefill begun."""
        self.waiting.popleft()
        self.used_blocks += request.blocks(self.block_size)
        if not request.scheduled:
            request.scheduled = now
        request.prefilling = True
        request.admission += 1
        # recomputed if preempted, less what the prefix cache holds
        request.to_prefill = request.prompt_tokens + request.generated - self._cached(request)
        self.running.append(request)
        if self.ttft_s is not None and self.prefill_budget is None:
            # the deadline from the admission, not from whenever this line runs; with the
            # prefix cache, longer by each prompt token it must compute
            prefill = self.ttft_s + (request.to_prefill * self.prefill_s_per_token
                                     if self.prefix_cache else 0.0)
            asyncio.get_running_loop().call_at(now + prefill, self._prefilled, request,
                                               request.admission)
        self.counters["prompt_tokens"] += request.prompt_tokens
        self.window["prompt"] += request.prompt_tokens

    def _cached(self, request: Request) -> int:
        """The prompt tokens the prefix cache holds for it (0 without the cache)."""
        if self.prefix_cache is None or not request.tokens:
            return 0
        return self.prefix_cache.lookup(request.tokens, request.lora)

    def _computed(self, request: Request) -> None:
        """Its prompt computed: the prompt's full blocks into the prefix cache."""
        if self.prefix_cache is not None and request.tokens:
            self.prefix_cache.store(request.tokens, request.lora)

    def _preempt_for_growth(self) -> None:
        """V1's recompute preemption: while the running requests' next tokens need more blocks
        than the cache has, the newest one goes back to the head of the queue."""
        while len(self.running) > 1 and self._live_blocks(1) > self.total_blocks:
            victim = (max(self.running, key=Request.order) if self.priority_scheduling
                      else self.running[-1])
            self.running.remove(victim)
            self.used_blocks -= victim.blocks(self.block_size)
            victim.prefilling = False
            self._queue(victim, head=True)
            self.preemptions += 1

    def _prefilled(self, request: Request, admission: int) -> None:
        """Programmed TTFT: the first token, on time; the next ones come with the steps."""
        if request.finished or admission != request.admission or request not in self.running:
            return  # preempted since (a readmission set its own deadline)
        request.prefilling = False
        self._computed(request)
        now = time.monotonic()
        self._emit(request, now)
        self.counters["generation_tokens"] += 1
        self.window["generation"] += 1
        if request.finished:
            self.running.remove(request)

    def _emit(self, request: Request, now: float) -> None:
        """One token to `request`; finishes it after its last."""
        index = request.generated
        request.generated += 1
        last = request.generated >= request.max_tokens
        if index == 0:
            request.first_token = now
        else:
            self.hist["inter_token_latency_seconds"].observe(now - request.last_token)
        request.last_token = now
        request.on_token(index, VOCAB[request.rng.getrandbits(12)], last)
        if last:
            self.used_blocks -= request.blocks(self.block_size)
            self._finish(request, "length", now)

    def _budget_step(self, now: float) -> float:
        """One step of chunked prefill under the token budget; returns its prefill time."""
        stepped = 0
        still_running = []
        for request in self.running:  # decoding requests first: one token each
            if not request.prefilling:
                stepped += 1
                self._emit(request, now)
            if not request.finished:
                still_running.append(request)
        self.running = still_running
        budget = self.prefill_budget - stepped
        computed = 0
        for request in self.running:  # prompts begun in an earlier step go on
            if request.prefilling and budget > 0:
                budget, computed = self._chunk(request, budget, computed)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if not self._fits(self.waiting[0]) and self.running:
                break
            self._admit_one(self.waiting[0], now)
            budget, computed = self._chunk(self.running[-1], budget, computed)
        self.counters["generation_tokens"] += stepped
        self.window["generation"] += stepped
        if stepped or computed:
            self.hist["iteration_tokens_total"].observe(stepped + computed)
        return computed * self.prefill_s_per_token

    def _chunk(self, request: Request, budget: int, computed: int) -> tuple[int, int]:
        """Computes as much of the request's prompt as the budget allows, and no more than
        --long-prefill-token-threshold when set (vLLM's V1 scheduler: a request's chunk in a step
        is capped there); with its last chunk it stops prefilling, so its first token comes with
        the next step."""
        chunk = min(request.to_prefill, budget, self.long_prefill_tokens or budget)
        request.to_prefill -= chunk
        if not request.to_prefill:
            request.prefilling = False
            self._computed(request)
        return budget - chunk, computed + chunk

    def _step(self) -> None:
        now = time.monotonic()
        if self.preempt and self.total_blocks is not None:
            self._preempt_for_growth()
        if self.prefill_budget is not None:
            self._schedule_next(self._budget_step(now))
            return
        tokens = self._admit(now)
        still_running = []
        stepped = 0
        for request in self.running:
            if self.ttft_s is not None and (
                request.prefilling or now - request.last_token < self.interval / 2
            ):  # still in its programmed prefill, or its first token came under half a step ago
                still_running.append(request)
                continue
            stepped += 1
            request.prefilling = False
            self._emit(request, now)
            if not request.finished:
                still_running.append(request)
        tokens += stepped
        self.counters["generation_tokens"] += stepped
        self.window["generation"] += stepped
        if stepped:
            self.hist["iteration_tokens_total"].observe(tokens)
        self.running = still_running
        self._schedule_next(0.0)

    def _record_lora(self) -> None:
        """vLLM's record of its scheduler stats, each engine step: the gauge's labels are the
        adapters requests run and wait on (names, comma-joined, first seen first), its value
        the time (set_to_current_time)."""
        if self.max_lora is None:
            return
        running = ",".join(dict.fromkeys(r.lora for r in self.running if r.lora))
        waiting = ",".join(dict.fromkeys(r.lora for r in self.waiting if r.lora))
        self.lora_series.pop((running, waiting), None)  # re-set: shown with the others' order
        self.lora_series[(running, waiting)] = time.time()

    def _schedule_next(self, extra_s: float) -> None:
        self._record_lora()
        if self.running or self.waiting:
            loop = asyncio.get_running_loop()
            step = self.interval + self.per_seq_s * len(self.running) + extra_s
            self._next_tick = max(self._next_tick + step, loop.time())
            self._timer = loop.call_at(self._next_tick, self._step)
        else:
            self._timer = None

    def _finish(self, request: Request, reason: str, now: float) -> None:
        request.finished = True
        self.success[reason] += 1
        if reason == "abort":
            return
        h = self.hist
        h["request_prompt_tokens"].observe(request.prompt_tokens)
        h["request_generation_tokens"].observe(request.generated)
        h["time_to_first_token_seconds"].observe(request.first_token - request.arrival)
        h["e2e_request_latency_seconds"].observe(now - request.arrival)
        h["request_queue_time_seconds"].observe(request.scheduled - request.arrival)
        h["request_inference_time_seconds"].observe(now - request.scheduled)
        h["request_prefill_time_seconds"].observe(request.first_token - request.scheduled)
        h["request_decode_time_seconds"].observe(now - request.first_token)
        if request.generated > 1:
            h["request_time_per_output_token_seconds"].observe(
                (now - request.first_token) / (request.generated - 1)
            )

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- reporting -------------------------------------------------------------------------

    def kv_usage(self) -> float:
        if not self.total_blocks:
            return 0.0
        used = sum(-(-(r.prompt_tokens + r.generated) // self.block_size) for r in self.running)
        return used / self.total_blocks

    def stats_line(self) -> str | None:
        """vLLM's periodic "Engine 000: Avg prompt throughput ..." line, if anything happened."""
        now = time.monotonic()
        elapsed = max(1e-9, now - self.window["start"])
        prompt, generation = self.window["prompt"], self.window["generation"]
        self.window.update(prompt=0, generation=0, start=now)
        if not (prompt or generation or self.running or self.waiting):
            return None
        return (
            f"Engine 000: Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {generation / elapsed:.1f} tokens/s, "
            f"Running: {len(self.running)} reqs, Waiting: {len(self.waiting)} reqs, "
            f"GPU KV cache usage: {100 * self.kv_usage():.1f}%, "
            f"Prefix cache hit rate: {100 * self._hit_rate():.1f}%"
        )

    def _hit_rate(self) -> float:
        return self.prefix_cache.hit_rate() if self.prefix_cache else 0.0

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.model_name}"'
        out: list[str] = []

        def gauge(name: str, help_text: str, value: float) -> None:
            out.extend(
                [
                    f"# HELP {name} {help_text}",
                    f"# TYPE {name} gauge",
                    f"{name}{{{labels}}} {float(value)!r}",
                ]
            )

        def counter(name: str, help_text: str, values: dict[str, int]) -> None:
            out.extend([f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"])
            for extra, value in values.items():
                out.append(f"{name}_total{{{_labels(labels, extra)}}} {float(value)}")
            out.extend([f"# HELP {name}_created {help_text}", f"# TYPE {name}_created gauge"])
            for extra in values:
                out.append(f"{name}_created{{{_labels(labels, extra)}}} {self.created!r}")

        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            len(self.running),
        )
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            len(self.waiting),
        )
        reasons = {'reason="capacity"': len(self.waiting), 'reason="deferred"': 0}
        out += [
            "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. "
            "Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred "
            "by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
            "reasons equals vllm:num_requests_waiting.",
            "# TYPE vllm:num_requests_waiting_by_reason gauge",
            *(f"vllm:num_requests_waiting_by_reason{{{_labels(labels, reason)}}} {float(n)!r}"
              for reason, n in reasons.items()),
        ]
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            self.kv_usage(),
        )
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            {"": self.prefix_cache.queries if self.prefix_cache
             else self.counters["prompt_tokens"]},
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            {"": self.prefix_cache.hits if self.prefix_cache else 0},
        )
        counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            {"": self.preemptions},
        )
        counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            {"": self.counters["prompt_tokens"]},
        )
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            {"": self.counters["generation_tokens"]},
        )
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            {f'finished_reason="{r}"': n for r, n in self.success.items()},
        )
        for histogram in self.hist.values():
            out.extend(histogram.render(labels))
        if self.max_lora is not None:
            out += [
                "# HELP vllm:lora_requests_info Running stats on lora requests.",
                "# TYPE vllm:lora_requests_info gauge",
                *(f'vllm:lora_requests_info{{max_lora="{self.max_lora}",running_lora_adapters='
                  f'"{running}",waiting_lora_adapters="{waiting}"}} {_go_float(stamp)}'
                  for (running, waiting), stamp in self.lora_series.items()),
            ]
        info = ",".join(f'{k}="{v}"' for k, v in sorted({**self.cache_info, "engine": "0"}.items()))
        out.extend(
            [
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f"vllm:cache_config_info{{{info}}} 1.0",
            ]
        )
        return "\n".join(out) + "\n"


def _labels(base: str, extra: str) -> str:
    """Labels sorted by name as prometheus_client prints them (engine, finished_reason, ...)."""
    if not extra:
        return base
    parts = sorted([*base.split(","), extra], key=lambda p: p.split("=", 1)[0])
    return ",".join(parts)


def _go_float(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's float format: 1.7e+09 for a time)."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text
