"""`vllm serve` as the stand-in runs it: parse, validate, "load" (port refusing), serve.

Start-up takes STANDIN_LOAD_SECONDS (default 3) and prints lines shaped like a real vLLM start-up
log. The port is bound at once (so a port in use fails early, as in vLLM) but only listens once
loading is done, so connections are refused meanwhile. Failures print vLLM's texts and exit with
vLLM's codes. SIGTERM/SIGINT end the process within a second, with exit code 0.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from . import VERSION, buckets, cli, logs, lora, model, multinode
from .calibration import ApiServers, CalibrationError, profile, setting, setting_float
from .engine import Engine
from .prefix_cache import PrefixCache
from .server import App, Connection
from .sleep import SleepMode

PKG = "/usr/local/lib/python3.12/dist-packages/vllm"


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def prefix_cache(enabled: bool | None, block_size: int) -> PrefixCache | None:
    """The prefix cache (prefix_cache.py) of STANDIN_PREFIX_CACHE_BLOCKS blocks: opt-in, so the
    benchmarks that send one prompt again and again keep its cost; never with vLLM's
    --disable-prefix-caching."""
    blocks = setting("STANDIN_PREFIX_CACHE_BLOCKS")
    if blocks is None or enabled is False:
        return None
    return PrefixCache(block_size, int(blocks))


class Failure(Exception):
    """Start-up ends here; `report` prints what vLLM prints."""

    def __init__(self, report, exit_code: int = 1):
        super().__init__()
        self.report = report
        self.exit_code = exit_code


def api_traceback(frames: list[tuple[str, int, str, str]], last: str) -> None:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines += [f'  File "{path}", line {lineno}, in {func}', f"    {code}"]
    logs.raw(logs.API, "\n".join([*lines, last]))


SERVE_FRAMES = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (f"{PKG}/entrypoints/cli/main.py", 75, "main", "args.dispatch_function(args)"),
    (f"{PKG}/entrypoints/cli/serve.py", 118, "cmd", "uvloop.run(run_server(args))"),
]
# Where vLLM's own parser refuses the command line before any process is named (illustrative).
PARSE_FRAMES = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (f"{PKG}/entrypoints/cli/main.py", 66, "main", "args = parser.parse_args()"),
    (f"{PKG}/utils/argparse_utils.py", 329, "parse_args", "raise ValueError("),
]
# Where EngineArgs.create_engine_config builds each config class.
CONFIG_FRAMES = {
    "ModelConfig": (1721, "model_config = self.create_model_config()"),
    "ParallelConfig": (1852, "parallel_config = ParallelConfig("),
    "VllmConfig": (2034, "config = VllmConfig("),
}


def config_failure(error: model.ConfigError) -> Failure:
    lineno, code = CONFIG_FRAMES[error.config_class]
    frames = [*SERVE_FRAMES, (f"{PKG}/engine/arg_utils.py", lineno, "create_engine_config", code)]

    def report() -> None:
        api_traceback(
            frames,
            f"pydantic_core._pydantic_core.ValidationError: 1 "
            f"validation error for {error.config_class}\n  Value error, "
            f"{error.message} [type=value_error, input_value={error.input_value}, "
            "input_type=ArgsKwargs]",
        )

    return Failure(report)


def repo_id_failure(message: str) -> Failure:
    hub = "/usr/local/lib/python3.12/dist-packages/huggingface_hub/utils/_validators.py"
    config = f"{PKG}/transformers_utils/config.py"

    def report() -> None:
        api_traceback(
            [
                (config, 612, "get_config", "config_dict, _ = PretrainedConfig.get_config_dict("),
                (hub, 154, "validate_repo_id", "raise HFValidationError("),
            ],
            f"huggingface_hub.errors.HFValidationError: {message}\n\nThe above "
            "exception was the direct cause of the following exception:\n",
        )
        api_traceback(
            [*SERVE_FRAMES, (config, 640, "get_config", "raise OSError(str(e)) from e")],
            f"OSError: {message}",
        )

    return Failure(report)


def engine_failure(
    exc_type: str, message: str, worker: str | None = None, worker_lines: tuple[str, ...] = ()
) -> Failure:
    """An exception in the engine core (or one of its workers) during initialisation."""

    def report() -> None:
        if worker is not None:
            for text in worker_lines:
                sys.stderr.write(text + "\n")
            logs.error_block(
                worker,
                "multiproc_executor.py:862",
                "\n".join(
                    [
                        "WorkerProc failed to start.",
                        "Traceback (most recent call last):",
                        f'  File "{PKG}/v1/executor/multiproc_executor.py", line 833, '
                        "in worker_main",
                        "    worker = WorkerProc(*args, **kwargs)",
                        f"{exc_type}: {message}",
                    ]
                ),
            )
            core_type, core_message = (
                "Exception",
                (
                    "WorkerProc initialization failed due to an exception in a background process. "
                    "See stack trace for root cause."
                ),
            )
        else:
            core_type, core_message = exc_type, message
        logs.error_block(
            logs.ENGINE,
            "core.py:1136",
            "\n".join(
                [
                    "EngineCore failed to start.",
                    "Traceback (most recent call last):",
                    f'  File "{PKG}/v1/engine/core.py", line 1127, in run_engine_core',
                    "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
                    f"{core_type}: {core_message}",
                ]
            ),
        )
        logs.raw(
            logs.ENGINE,
            "\n".join(
                [
                    "Process EngineCore:",
                    "Traceback (most recent call last):",
                    f'  File "{PKG}/v1/engine/core.py", line 1140, in run_engine_core',
                    "    raise e",
                    f"{core_type}: {core_message}",
                ]
            ),
        )
        api_traceback(
            [
                *SERVE_FRAMES,
                (
                    f"{PKG}/v1/engine/utils.py",
                    1012,
                    "wait_for_engine_startup",
                    "raise RuntimeError(",
                ),
            ],
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        )

    return Failure(report)


class Standin:
    def __init__(self, args: argparse.Namespace, parser: argparse.ArgumentParser):
        self.args = args
        self.parser = parser
        self.load_s = _env_float("STANDIN_LOAD_SECONDS", 3.0)
        self.start = time.monotonic()
        self.sock: socket.socket | None = None
        self.engine: Engine | None = None
        self.app: App | None = None
        self.max_num_seqs = 0
        self.max_num_batched_tokens = 0
        self.weights = 0  # bytes on one GPU, once loaded
        self.peers: multinode.Head | multinode.Worker | None = None  # --nnodes > 1

    async def at(self, fraction: float) -> None:
        """Sleep until `fraction` of the simulated load time has passed."""
        delay = self.start + fraction * self.load_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    # --- start-up --------------------------------------------------------------------------

    def banner(self) -> None:
        a = self.args
        info = logs.line
        info(logs.API, "INFO", "utils.py:299", "")
        for text in (
            "       █     █     █▄   ▄█",
            f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {VERSION}",
            f"  █▄█▀ █     █     █     █  model   {a.model}",
            "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
            "",
        ):
            info(logs.API, "INFO", "utils.py:299", text)
        info(
            logs.API,
            "INFO",
            "utils.py:233",
            f"non-default args: {cli.non_default_args(a, self.parser)}",
        )

    def bind(self) -> None:
        host = self.args.host or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, self.args.port))
        except OSError as e:
            sock.close()
            text = f"OSError: [Errno {e.errno}] {os.strerror(e.errno or errno.EADDRINUSE)}"
            frames = [
                *SERVE_FRAMES,
                (
                    f"{PKG}/entrypoints/openai/api_server.py",
                    611,
                    "setup_server",
                    "sock = create_server_socket(sock_addr)",
                ),
                (
                    f"{PKG}/entrypoints/openai/api_server.py",
                    573,
                    "create_server_socket",
                    "sock.bind(addr)",
                ),
            ]
            raise Failure(lambda: api_traceback(frames, text)) from e
        self.sock = sock

    async def validate(self) -> tuple[model.ModelSource, int, int]:
        """Config checks in vLLM's order: device, model, context length, parallelism."""
        a = self.args
        runtime_ids = model.runtime_gpu_ids()
        if not runtime_ids:
            await self.at(0.05)
            logs.line(
                logs.API,
                "INFO",
                "__init__.py:245",
                "No platform detected, vLLM is running on UnspecifiedPlatform",
            )
            raise Failure(
                lambda: api_traceback(
                    [
                        *SERVE_FRAMES,
                        (f"{PKG}/config/device.py", 59, "__post_init__", "raise RuntimeError("),
                    ],
                    "RuntimeError: Failed to infer device type, please set the environment "
                    "variable `VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help "
                    "debug the issue.",
                )
            )
        await self.at(0.1)
        try:
            source = model.resolve_model(a.model)
        except model.RepoIdError as e:
            raise repo_id_failure(str(e)) from e
        try:
            model.check_remote_code(source, a.trust_remote_code)
            model.check_quantization(a.model, a.quantization)
            max_model_len = model.resolve_max_model_len(source, a.max_model_len)
            gpu_count = model.cuda_device_count(runtime_ids)
            tp, pp = a.tensor_parallel_size, a.pipeline_parallel_size
            multinode.check_flags(a)
            model.check_world_size(tp * pp // a.nnodes, gpu_count, a.distributed_executor_backend,
                                   pp, tp)
            model.check_heads(source, tp)
        except model.ConfigError as e:
            raise config_failure(e) from e
        if source.config_dir is None:
            logs.line(
                logs.API,
                "WARNING",
                "model.py:555",
                f"stand-in: no config.json for {a.model!r}; serving without model "
                "dimensions (memory checks skipped)",
            )
        else:
            arch = (source.config.get("architectures") or ["unknown"])[0]
            logs.line(logs.API, "INFO", "model.py:555", f"Resolved architecture: {arch}")
        logs.line(logs.API, "INFO", "model.py:1680", f"Using max model len {max_model_len}")
        return source, max_model_len, gpu_count

    async def load(
        self, source: model.ModelSource, max_model_len: int, gpu_count: int
    ) -> model.KvCache | None:
        a = self.args
        tp, pp = a.tensor_parallel_size, a.pipeline_parallel_size
        default_seqs, default_tokens = model.scheduler_defaults(model.gpu_memory())
        self.max_num_seqs = a.max_num_seqs or default_seqs
        batched = self.max_num_batched_tokens = a.max_num_batched_tokens or default_tokens
        logs.line(
            logs.API,
            "INFO",
            "scheduler.py:239",
            f"Chunked prefill is enabled with max_num_batched_tokens={batched}.",
        )
        await self.at(0.2)
        logs.line(
            logs.ENGINE,
            "INFO",
            "core.py:109",
            f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{a.model}', "
            f"tokenizer='{a.model}', trust_remote_code={a.trust_remote_code}, "
            f"dtype={a.dtype}, max_seq_len={max_model_len}, tensor_parallel_size={tp}, "
            f"pipeline_parallel_size={pp}, enforce_eager={bool(a.enforce_eager)}",
        )
        if gpu_count == 0:
            raise engine_failure("RuntimeError", "No CUDA GPUs are available")
        if tp * pp > 1:
            await self.at(0.25)
            limit = model.shm_bytes()
            if limit < model.GiB:
                host = socket.gethostname()
                pid = os.getpid()
                seg = f"/dev/shm/nccl-{os.urandom(3).hex()}"
                raise engine_failure(
                    "RuntimeError",
                    "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
                    worker="Worker_TP1",
                    worker_lines=(
                        f"{host}:{pid}:{pid} [1] misc/shmutils.cc:88 NCCL WARN Error: failed to "
                        f"extend {seg} to 9637892 bytes, error: No space left on device (28)",
                        f"{host}:{pid}:{pid} [1] misc/shmutils.cc:132 NCCL WARN Error while "
                        f"creating shared memory segment {seg} (size 9637888), error: No space "
                        "left on device (28)",
                    ),
                )
            for rank in range(tp * pp):
                logs.line(
                    f"Worker_TP{rank}",
                    "INFO",
                    "parallel_state.py:1402",
                    f"world_size={tp * pp} rank={rank} local_rank={rank} "
                    "distributed_init_method=tcp://127.0.0.1:43973 backend=nccl",
                )
        await self.at(0.3)
        logs.line(
            logs.ENGINE, "INFO", "gpu_model_runner.py:4777", f"Starting to load model {a.model}..."
        )
        await self.at(0.5)
        try:
            weights = self.weights = model.load_weights(source, dtype_flag=a.dtype, tp=tp, pp=pp)
        except model.EngineError as e:
            raise engine_failure(e.exc_type, e.message) from e
        logs.line(
            logs.ENGINE,
            "INFO",
            "gpu_model_runner.py:4879",
            f"Model loading took {weights / model.GiB:.2f} GiB memory and "
            f"{0.2 * self.load_s:.6f} seconds",
        )
        if not a.enforce_eager:
            await self.at(0.7)
            logs.line(
                logs.ENGINE,
                "INFO",
                "monitor.py:53",
                f"torch.compile took {0.2 * self.load_s:.2f} s in total",
            )
        await self.at(0.8)
        try:
            kv = model.size_kv_cache(
                source,
                weights,
                dtype_flag=a.dtype,
                kv_cache_dtype=a.kv_cache_dtype,
                tp=tp,
                pp=pp,
                gpu_memory_utilization=a.gpu_memory_utilization,
                max_model_len=max_model_len,
                max_num_batched_tokens=batched,
                enforce_eager=bool(a.enforce_eager),
            )
        except model.EngineError as e:
            raise engine_failure(e.exc_type, e.message) from e
        if kv is not None:
            logs.line(
                logs.ENGINE,
                "INFO",
                "gpu_worker.py:440",
                f"Available KV cache memory: {kv.available / model.GiB:.2f} GiB",
            )
            logs.line(
                logs.ENGINE,
                "INFO",
                "kv_cache_utils.py:1711",
                f"GPU KV cache size: {kv.tokens:,} tokens",
            )
            logs.line(
                logs.ENGINE,
                "INFO",
                "kv_cache_utils.py:1716",
                f"Maximum concurrency for {max_model_len:,} tokens per request: "
                f"{kv.tokens / max_model_len:.2f}x",
            )
        if not a.enforce_eager:
            await self.at(0.9)
            logs.line(
                logs.ENGINE,
                "INFO",
                "gpu_model_runner.py:6133",
                f"Graph capturing finished in {0.1 * self.load_s:.0f} secs, took "
                f"{model.CUDA_GRAPH_GIB:.2f} GiB",
            )
        await self.at(1.0)
        logs.line(
            logs.ENGINE,
            "INFO",
            "core.py:299",
            f"init engine (profile, create kv cache, warmup model) took {0.8 * self.load_s:.2f} s",
        )
        return kv

    async def serve(
        self, source: model.ModelSource, max_model_len: int, kv: model.KvCache | None
    ) -> asyncio.Server:
        a = self.args
        names = a.served_model_name or [a.model]
        keys = list(a.api_key or [])
        if os.environ.get("VLLM_API_KEY"):
            keys.append(os.environ["VLLM_API_KEY"])
        self.engine = Engine(
            model_name=names[0],
            # the capacity knobs: the environment's, else STANDIN_CALIBRATION's (calibration.py)
            interval_s=setting_float("STANDIN_TOKEN_INTERVAL_MS", 20) / 1000,
            ttft_s=_env_float("STANDIN_TTFT_MS", 0) / 1000 if "STANDIN_TTFT_MS" in os.environ
            else None,
            per_seq_s=setting_float("STANDIN_TOKEN_INTERVAL_PER_SEQ_MS", 0) / 1000,
            max_num_seqs=self.max_num_seqs,
            # opt-in (test infra): the prefill token budget per step, and a small KV cache
            # allocated block by block with preemption, as vLLM's V1 scheduler does
            prefill_budget=self.max_num_batched_tokens
            if setting("STANDIN_PREFILL_BUDGET") == "1" else None,
            prefill_s_per_token=setting_float("STANDIN_PREFILL_US_PER_TOKEN", 0) / 1e6,
            long_prefill_tokens=a.long_prefill_token_threshold or 0,
            kv_tokens=int(os.environ["STANDIN_KV_TOKENS"]) if "STANDIN_KV_TOKENS" in os.environ
            else kv.tokens if kv else None,
            preempt="STANDIN_KV_TOKENS" in os.environ,
            priority_scheduling=a.scheduling_policy == "priority",
            block_size=a.block_size or model.BLOCK_SIZE,
            cache_info={
                "block_size": str(a.block_size or model.BLOCK_SIZE),
                "cache_dtype": a.kv_cache_dtype,
                "gpu_memory_utilization": str(a.gpu_memory_utilization),
                "num_gpu_blocks": str(kv.tokens // model.BLOCK_SIZE if kv else 0),
                "enable_prefix_caching": str(a.enable_prefix_caching is not False),
            },
            bounds=a.histogram_bounds,
            prefix_cache=prefix_cache(a.enable_prefix_caching, a.block_size or model.BLOCK_SIZE),
        )
        # a pooling model embeds (--runner pooling, --convert embed, or under --runner auto an
        # architecture vLLM registers as pooling: the stand-in knows the bare *Model encoders)
        runner = getattr(a, "runner", "auto")
        arch = (source.config.get("architectures") or [""])[0]
        pooling = runner == "pooling" or getattr(a, "convert", "") == "embed" or (
            runner == "auto" and arch.endswith("Model")
            and not arch.endswith(("LMHeadModel", "ChatModel")))
        tasks = ("embed",) if pooling else ("generate",)
        adapters = self.static_loras(names[0])
        if adapters is not None and adapters.enabled:  # vLLM's LoRA gauge exists with LoRA on
            self.engine.max_lora = a.max_loras or 1
        self.app = App(
            engine=self.engine,
            served_names=names,
            root=a.model,
            max_model_len=max_model_len,
            api_keys=keys,
            vocab_size=int(source.config.get("vocab_size") or 32000),
            default_max_tokens=16,
            force_usage=bool(a.enable_force_include_usage),
            access_log=not a.disable_uvicorn_access_log,
            log_stats=not a.disable_log_stats,
            keep_alive_timeout=_env_float("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", 5.0),
            tasks=tasks,
            hidden_size=int(source.config.get("hidden_size") or 4096),
            adapters=adapters,
            sleep=self._sleep_mode(names[0], kv),
            api_server=ApiServers.from_environment(self.args.api_server_count or 1),
        )
        host = a.host or "0.0.0.0"
        logs.line(logs.API, "INFO", "api_server.py:598", f"Supported tasks: {list(tasks)}")
        logs.line(
            logs.API, "INFO", "api_server.py:602", f"Starting vLLM server on http://{host}:{a.port}"
        )
        logs.line(logs.API, "INFO", "launcher.py:37", "Available routes are:")
        for path, (methods, _) in self.app.routes.items():
            logs.line(
                logs.API,
                "INFO",
                "launcher.py:46",
                f"Route: {path}, Methods: {', '.join(sorted(methods))}",
            )
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: Connection(self.app), sock=self.sock, backlog=2048
        )
        for text in (
            f"INFO:     Started server process [{os.getpid()}]",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
        ):
            logs.raw(logs.API, text, sys.stdout)
        if not a.disable_log_stats:
            self._schedule_stats(loop)
        return server

    def static_loras(self, base: str) -> lora.Adapters | None:
        """--enable-lora and --lora-modules (vllm_standin/lora.py): every listed adapter loaded
        before the server answers; one that fails ends the server, as in vLLM."""
        a = self.args
        modules = lora.parse_modules(a.lora_modules)
        if not a.enable_lora and not modules:
            return None
        slots = a.max_loras or 1
        cpu = int(a.max_cpu_loras) if a.max_cpu_loras is not None else slots
        if a.enable_lora and cpu < slots:
            raise config_failure(model.ConfigError(
                "LoRAConfig", f"max_cpu_loras ({cpu}) must be >= max_loras ({slots})",
                f"max_cpu_loras={cpu}"))
        adapters = lora.Adapters(bool(a.enable_lora), a.max_lora_rank or 16, base,
                                 _env_float("STANDIN_LORA_LOAD_SECONDS", 0))
        for name, path in modules:
            try:
                adapters.load(name, path)
            except lora.LoraError as error:
                raise Failure(lambda message=error.message: api_traceback(
                    [*SERVE_FRAMES, (f"{PKG}/entrypoints/openai/models/serving.py", 96,
                                     "init_static_loras", "raise ValueError(load_result.error"
                                     ".message)")],
                    f"ValueError: {message}")) from error
            logs.line(logs.API, "INFO", "serving.py:93", f"Loaded new LoRA adapter: name '{name}', "
                      f"path '{path}'")
        return adapters

    def _sleep_mode(self, model_name: str, kv: model.KvCache | None) -> SleepMode | None:
        """vLLM registers its dev routes (/sleep, /wake_up, ...) only in dev mode."""
        if os.environ.get("VLLM_SERVER_DEV_MODE") != "1":
            return None
        kept = int((model.CUDA_GRAPH_GIB + model.NON_TORCH_GIB + model.CUDA_CONTEXT_GIB)
                   * model.GiB)
        return SleepMode(enabled=bool(self.args.enable_sleep_mode), model_name=model_name,
                         awake_bytes=kept + self.weights + (kv.available if kv else 0),
                         asleep_bytes=kept)

    def _schedule_stats(self, loop: asyncio.AbstractEventLoop) -> None:
        def tick() -> None:
            text = self.engine.stats_line()
            if text:
                logs.line(logs.API, "INFO", "loggers.py:257", text)
            loop.call_later(10, tick)

        loop.call_later(10, tick)

    async def join_nodes(self) -> None:
        """With --nnodes > 1: the head waits for every worker, a worker joins the head."""
        me = multinode.role(self.args)
        if me is None:
            return
        where = f"{me.master_addr}:{me.master_port}"
        try:
            multinode.check_interfaces()
            if me.is_head:
                logs.line(logs.ENGINE, "INFO", "multiproc_executor.py:118",
                          f"Waiting for {me.nnodes - 1} other node(s) to join at {where}")
                self.peers = multinode.Head(me)
                await self.peers.wait_for_workers()
            else:
                logs.line(logs.ENGINE, "INFO", "multiproc_executor.py:118",
                          f"Node rank {me.rank} joining the head at {where}")
                self.peers = multinode.Worker(me)
                await self.peers.join()
        except multinode.JoinError as e:
            lines = e.lines
            raise Failure(lambda: logs.error_block(
                logs.ENGINE, "multiproc_executor.py:912", "\n".join(lines))) from e
        logs.line(logs.ENGINE, "INFO", "multiproc_executor.py:140",
                  f"All {me.nnodes} nodes joined (world size {me.world})")

    async def until_a_node_is_lost(self) -> None:
        """Runs until stopped; a multi-node model fails as a whole when one node goes away."""
        if self.peers is None:
            await asyncio.Event().wait()
            return
        if isinstance(self.peers, multinode.Head):
            rank = await self.peers.lost()
            peer = f"node rank {rank}"
        else:
            await self.peers.lost()
            peer = f"{self.args.master_addr}<{self.args.master_port}>"
        lines = multinode.peer_lost(peer)
        raise Failure(lambda: logs.error_block(
            logs.ENGINE, "multiproc_executor.py:912", "\n".join(lines)))

    # --- lifecycle -------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        server = None
        try:
            self.banner()
            if not self.args.headless:  # a headless node serves no API
                self.bind()
            source, max_model_len, gpu_count = await self.validate()
            self.check_api_servers()
            await self.join_nodes()
            kv = await self.load(source, max_model_len, gpu_count)
            if self.args.headless:
                logs.line(logs.API, "INFO", "serve.py:160",
                          f"Running headless as node rank {self.args.node_rank}: no API server")
            else:
                server = await self.serve(source, max_model_len, kv)
            await self.until_a_node_is_lost()
        except Failure as f:
            await self.at(0.1)
            f.report()
            self.shutdown(server)
            return f.exit_code
        except asyncio.CancelledError:
            self.shutdown(server)
            return 0
        return 0

    def check_api_servers(self) -> None:
        """vLLM's run_multi_api_server, once the engine config is built: runtime LoRA updates
        register an adapter in one API-server process only, so they are refused with more."""
        count = self.args.api_server_count or 1
        if count > 1 and lora.runtime_updates():
            raise Failure(lambda: api_traceback(
                [*SERVE_FRAMES[:2], (f"{PKG}/entrypoints/cli/serve.py", 118, "cmd",
                                     "run_multi_api_server(args)"),
                 (f"{PKG}/entrypoints/cli/serve.py", 236, "run_multi_api_server",
                  "raise ValueError(")],
                "ValueError: VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with "
                "api_server_count > 1"))

    def shutdown(self, server: asyncio.Server | None) -> None:
        if self.peers is not None:
            self.peers.close()
        if server is None:
            return
        logs.raw(logs.API, "INFO:     Shutting down", sys.stdout)
        server.close()
        if self.engine is not None:
            self.engine.stop()
        for conn in list(self.app.connections):
            conn.transport.abort()
        for text in (
            "INFO:     Waiting for application shutdown.",
            "INFO:     Application shutdown complete.",
            f"INFO:     Finished server process [{os.getpid()}]",
        ):
            logs.raw(logs.API, text, sys.stdout)


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    argv = sys.argv[1:] if argv is None else argv
    parser = cli.build_parser()
    try:
        args = parser.parse_args(argv)
    except cli.ModelNotFirst as e:  # uncaught in vLLM: Python's traceback, exit 1
        print("\n".join([
            "Traceback (most recent call last):",
            *(f'  File "{path}", line {lineno}, in {func}\n    {code}'
              for path, lineno, func, code in PARSE_FRAMES),
            f"ValueError: {e}",
        ]), file=sys.stderr)
        return 1
    except cli.ParseFailure as e:  # uncaught in vLLM: Python's traceback, exit 1
        print("\n".join([
            "Traceback (most recent call last):",
            *(f'  File "{path}", line {lineno}, in {func}\n    {code}'
              for path, lineno, func, code in PARSE_FRAMES[:2]),
            e.error,
        ]), file=sys.stderr)
        return 1
    if args.subparser != "serve":
        print("vllm stand-in: only `vllm serve` is imitated", file=sys.stderr)
        return 2
    try:
        profile()  # the stand-in's own knob, checked before anything starts
    except CalibrationError as e:
        print(f"vllm stand-in: {e}", file=sys.stderr)
        return 2
    if args.model_tag is not None:
        args.model = args.model_tag
    problem = api_server_count(args)
    if problem:
        print("\n".join([
            "Traceback (most recent call last):",
            *(f'  File "{path}", line {lineno}, in {func}\n    {code}'
              for path, lineno, func, code in [*SERVE_FRAMES[:2], (
                  f"{PKG}/entrypoints/cli/serve.py", 48, "cmd", "raise ValueError(")]),
            f"ValueError: {problem}",
        ]), file=sys.stderr)
        return 1
    try:
        args.histogram_bounds = buckets.parse(args.custom_histogram_buckets)
    except ValueError as e:
        parser.error(f"argument --custom-histogram-buckets: {e}")
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(Standin(args, parser).run())


def api_server_count(args: argparse.Namespace) -> str | None:
    """vLLM's serve command on `--api-server-count` (an int, argparse's type): with
    `--headless` a count above 0 is refused (the problem returned); a count below 1 runs the
    engine headless, with no API server (vLLM's run_headless); unset, one process."""
    count = args.api_server_count
    if args.headless:
        if count is not None and count > 0:
            return (f"--api-server-count={count} cannot be used with --headless (no API "
                    "servers are started in headless mode).")
        args.api_server_count = 0
    elif count is not None and count < 1:
        args.headless = True
    return None


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when installed (the image has Debian's python3-uvloop), as vLLM serves
    on `uvloop.run(run_server(args))`: its timers and socket writes keep a programmed TTFT
    punctual under hundreds of streams. Without it, asyncio's own loop (None)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
