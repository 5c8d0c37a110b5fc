"""The vLLM stand-in (tests/standin), run as a local process on a free loopback port.

Its command line, HTTP bytes and start-up failures are checked against what a real vLLM printed
and sent (tests/standin/reference/: copies of shared/reference/vllm-0.20-observed/).
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.docker_engine import pick_free_port
from tests.support.standin_process import (
    LLAMA_8B,
    STANDIN,
    model_dir,
    run_standin,
    serving,
    standin_env,
    wait_listening,
)

REFERENCE = STANDIN / "reference"
TRACE = json.loads((REFERENCE / "http-trace.json").read_text())
STARTUP_ERRORS = (REFERENCE / "startup-errors.txt").read_text()
PREFIX = re.compile(r"^\((?:APIServer|EngineCore|Worker_TP\d+) pid=\d+\) ")
STAMP = re.compile(r"^(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d")


def normalise(line: str) -> str:
    """A log line without its process prefix and with a fixed time stamp."""
    return STAMP.sub(r"\1 MM-DD hh:mm:ss", PREFIX.sub("", line))

sys.path.insert(0, str(STANDIN))
from vllm_standin import cli  # noqa: E402


def reference_lines(command: str) -> list[str]:
    """The lines (process prefix removed) real vLLM printed for one start-up-errors.txt case."""
    block = STARTUP_ERRORS.split(f"################ vllm serve <llama-3.1-8b dims> {command}\n")
    assert len(block) == 2, command
    text = block[1].split("################")[0]
    return [normalise(line) for line in text.splitlines()
            if line and "WARNING" not in line and not line.startswith("rc=")]


def output_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [normalise(line) for line in (result.stdout + result.stderr).splitlines()]


def request(port: int, method: str, path: str, body: object = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), payload


def shape(obj: object) -> object:
    """Keys (in order) and value types of a JSON value, to compare layouts, not contents."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return None if obj is None else type(obj).__name__


def sse_events(payload: bytes) -> list[bytes]:
    events = payload.split(b"\n\n")
    assert events[-1] == b""
    return [e + b"\n\n" for e in events[:-1]]


def trace_event(case: str, index: int) -> bytes:
    return TRACE[case]["chunks"][index][1].encode()


def event_shape(event: bytes) -> object:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    body = event[6:-2]
    parsed = json.loads(body)
    # vLLM's bytes are compact JSON: nothing but the layout may differ.
    assert json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode() == body
    return shape(parsed)


# --- command line -----------------------------------------------------------------------------


def test_every_listed_option_is_accepted():
    lines = [line for line in cli.FLAGS_FILE.read_text().splitlines()
             if line and not line.startswith("#")]
    serve = cli.build_parser()._subparsers._group_actions[0].choices["serve"]
    options = serve._option_string_actions
    for line in lines[1:]:  # the first is the positional model_tag
        for name in line.split(" | ")[0].split(", "):
            assert name in options, name
    assert "--enable-cuda-graph" not in options and "--swap-space" not in options


@pytest.mark.parametrize("argv", [
    ["serve", "--model", "/models/x", "--served-model-name", "a", "b",
     "--tensor-parallel-size", "1", "--max-model-len", "8192", "--gpu-memory-utilization", "0.9",
     "--max-num-seqs", "64", "--port", "8000", "--enable-prefix-caching"],
    ["serve", "/models/x", "-tp", "2", "--max-model-len=32k", "--max_num_seqs", "8",
     "--enable-prefix-caching", "--disable-prefix-caching", "-q", "awq", "--dtype=half"],
    ["serve", "/models/x", "--api-key", "k1", "k2", "--compilation-config.mode", "3", "-O3",
     "--enforce-eager", "--no-enforce-eager", "--kv-cache-dtype", "fp8", "--max-model-len", "auto",
     "--middleware", "a.b", "--middleware", "c.d", "--hf-token"],
])
def test_accepts_vllm_flags(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.subparser == "serve"
    assert (args.model_tag or args.model) == "/models/x"


def test_flag_values_are_converted_like_vllm():
    args = cli.build_parser().parse_args(
        ["serve", "/m", "--max_model_len=32k", "-tp", "2", "--compilation-config.mode", "3",
         "--compilation-config.cudagraph_capture_sizes+", "1,2", "-O3", "--api-key", "a", "b",
         "--disable-prefix-caching", "--max-num-batched-tokens", "2K"])
    assert args.max_model_len == 32000
    assert args.tensor_parallel_size == 2
    assert args.compilation_config == {"mode": 3, "cudagraph_capture_sizes": ["1", "2"]}
    assert args.optimization_level == "3"
    assert args.api_key == ["a", "b"]
    assert args.enable_prefix_caching is False
    assert args.max_num_batched_tokens == 2048


@pytest.mark.parametrize("argv", [
    ["--swap-space", "4"], ["--worker-use-ray"], ["--num-gpus", "2"], ["--max-model-len", "lots"],
    ["--block-size", "x"], ["--kv-cache-dtype"], ["--tool-strict-level", "none"],
])
def test_refuses_removed_flags_and_bad_values(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["serve", "/models/x", *argv])
    assert exit_info.value.code == 2
    assert ": error: " in capsys.readouterr().err.splitlines()[-1]


MODEL_OPTION_WARNING = "The `--model` option will be removed in a future version."


def test_the_positional_model_is_served_without_a_warning(capsys):
    args = cli.build_parser().parse_args(["serve", "/models/x", "--served-model-name", "a"])
    assert (args.model_tag, args.served_model_name) == ("/models/x", ["a"])
    assert MODEL_OPTION_WARNING not in capsys.readouterr().out


def test_the_model_option_moves_to_the_positional_with_vllms_warning(capsys):
    args = cli.build_parser().parse_args(
        ["serve", "--served-model-name", "a", "--model=/models/x", "--port", "8000"])
    assert (args.model_tag, args.port) == ("/models/x", 8000)
    assert MODEL_OPTION_WARNING in capsys.readouterr().out


def test_a_positional_model_and_the_model_option_is_refused_like_vllm(capsys):
    """vLLM moves `--model`'s value to the front, so the positional one is left over."""
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["serve", "/models/x", "--model", "/models/y"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "main.py: error: unrecognized arguments: /models/x"


def test_served_model_name_before_the_model_is_vllms_value_error(tmp_path):
    """vLLM's parser raises a ValueError (a traceback, exit 1) when --served-model-name comes
    without the model as the first argument, even with the model later on."""
    model = model_dir(tmp_path, "m", LLAMA_8B)
    result = run_standin("serve", "--served-model-name", "a", str(model), "--port", "1")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ValueError: `model` should be provided as the first positional argument when using "
        "`vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.")


# --- start-up ---------------------------------------------------------------------------------


def test_refuses_connections_while_loading_then_serves(tmp_path):
    model = model_dir(tmp_path, "llama", LLAMA_8B)
    port = pick_free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN / "vllm"), "serve", "--model", str(model), "--port",
         str(port), "--max-model-len", "8192"],
        env=standin_env(STANDIN_LOAD_SECONDS="1"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    try:
        time.sleep(0.4)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1)
        wait_listening(port, proc)
        status, headers, body = request(port, "GET", "/health")
        assert (status, body, headers["Content-Length"]) == (200, b"", "0")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=1) == 0
    log = proc.stdout.read()
    proc.stdout.close()
    for text in ("non-default args: {'model_tag': ", "Starting to load model",
                 "Model loading took 14.96 GiB", "GPU KV cache size: ",
                 "Maximum concurrency for 8,192 tokens per request: ",
                 "Application startup complete."):
        assert text in log


@pytest.mark.parametrize(("architecture", "runner", "embeds"), [
    ("BertModel", "auto", True), ("BertModel", "generate", False),
    ("LlamaForCausalLM", "auto", False), ("LlamaForCausalLM", "pooling", True),
])
def test_the_runner_decides_the_routes_like_vllm(tmp_path, architecture, runner, embeds):
    """vLLM registers /v1/embeddings for a pooling model and the completion routes otherwise;
    under --runner auto a bare *Model encoder is a pooling model."""
    model = model_dir(tmp_path, "m", {**LLAMA_8B, "architectures": [architecture]})
    with serving(str(model), "--max-model-len", "4096", "--runner", runner) as (port, _):
        embedded, _, _ = request(port, "POST", "/v1/embeddings",
                                 json.dumps({"model": str(model), "input": "x"}).encode())
        chat = json.dumps({"model": str(model), "max_tokens": 1,
                           "messages": [{"role": "user", "content": "x"}]}).encode()
        chatted, _, _ = request(port, "POST", "/v1/chat/completions", chat)
    assert (embedded, chatted) == ((200, 404) if embeds else (404, 200))


def test_sigterm_while_loading_exits_at_once(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN / "vllm"), "serve", str(model_dir(tmp_path, "m", LLAMA_8B)),
         "--port", str(pick_free_port()), "--max-model-len", "4096"],
        env=standin_env(STANDIN_LOAD_SECONDS="30"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None and proc.stdout.readline()  # its banner: the handler is set
    time.sleep(0.5)  # and it is loading
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=2) == 0
    assert time.monotonic() - start < 1


# Failing start-ups: (model config or a missing path, arguments, environment). They all run at
# once (each spends most of its time in the simulated delay), then each test reads its result.
CUSTOM_CODE = {**LLAMA_8B, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
FAILING = {
    "unknown flag": (LLAMA_8B, ["--enable-cuda-graph"], {}),
    "bad choice": (LLAMA_8B, ["--dtype", "fp4"], {}),
    "max_model_len": (LLAMA_8B, ["--max-model-len", "200000"], {}),
    "world size": (LLAMA_8B, ["--tensor-parallel-size", "2"], {}),
    "quantization": (LLAMA_8B, ["--quantization", "fp4"], {}),
    "no cache memory": (LLAMA_8B, ["--gpu-memory-utilization", "0.05"],
                        {"STANDIN_GPU_MEMORY_GIB": "140.4"}),
    "kv too small": (LLAMA_8B, ["--gpu-memory-utilization", "0.13", "--max-model-len", "131072"],
                     {"STANDIN_GPU_MEMORY_GIB": "140.4"}),
    "missing path": (None, [], {}),
    "heads": ({**LLAMA_8B, "num_attention_heads": 6, "num_key_value_heads": 6},
              ["-tp", "4", "--max-model-len", "4096"], {"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}),
    "remote code": (CUSTOM_CODE, ["--max-model-len", "4096"], {}),
    "no gpu runtime": (LLAMA_8B, ["--max-model-len", "4096"], {"NVIDIA_VISIBLE_DEVICES": ""}),
    "no cuda device": (LLAMA_8B, ["--max-model-len", "4096"], {"CUDA_VISIBLE_DEVICES": "1"}),
    "weights too big": (LLAMA_8B, ["--max-model-len", "4096"], {"STANDIN_WEIGHTS_GIB": "100"}),
    "weight files too big": (LLAMA_8B, ["--max-model-len", "4096"], {}),
    "port in use": (LLAMA_8B, ["--max-model-len", "4096", "--host", "127.0.0.1"], {}),
}


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    root = tmp_path_factory.mktemp("failing")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    procs = {}
    for name, (config, args, env) in FAILING.items():
        if config is None:
            model = "/models/nonexistent"
        else:
            path = model_dir(root, name.replace(" ", "-"), config)
            model = str(path)
        if name == "weight files too big":
            with open(path / "model.safetensors", "wb") as f:
                f.truncate(90 << 30)  # sparse: 90 GiB of weights that take no disk space
        port = holder.getsockname()[1] if name == "port in use" else pick_free_port()
        procs[name] = (time.monotonic(), subprocess.Popen(
            [sys.executable, str(STANDIN / "vllm"), "serve", model, "--port", str(port), *args],
            env=standin_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results: dict[str, tuple[subprocess.CompletedProcess, float]] = {}

    def result(name: str) -> subprocess.CompletedProcess:
        if name not in results:
            started, proc = procs[name]
            out, err = proc.communicate(timeout=20)
            results[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                             time.monotonic() - started)
        return results[name][0]

    yield result
    holder.close()
    for _, proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("name,command", [
    ("unknown flag", "--enable-cuda-graph"), ("bad choice", "--dtype fp4"),
])
def test_refuses_flags_exactly_like_vllm(failing, name, command):
    result = failing(name)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == reference_lines(command)[0]
    assert result.stderr.startswith("usage: ")


@pytest.mark.parametrize("name,command", [
    ("max_model_len", "--max-model-len 200000"),
    ("world size", "--tensor-parallel-size 2"),
    ("quantization", "--quantization fp4"),
    ("no cache memory", "--gpu-memory-utilization 0.05"),
])
def test_start_up_failures_print_vllms_text(failing, name, command):
    result = failing(name)
    assert result.returncode == 1
    out = output_lines(result)
    positions = [out.index(line) for line in reference_lines(command)]  # each one is there
    assert positions == sorted(positions)


def test_kv_cache_too_small_is_computed_from_config(failing):
    result = failing("kv too small")
    assert result.returncode == 1
    reference = reference_lines("--gpu-memory-utilization 0.13 --max-model-len 131072")[-2]
    masked = re.escape(reference)
    for number in ("0\\.57", "4656"):  # the available memory and what fits: simulated values
        masked = masked.replace(number, r"[0-9.]+")
    ours = [line for line in output_lines(result) if line.startswith("ValueError: To serve")]
    assert len(ours) == 1 and re.fullmatch(masked, ours[0])
    # 131072 tokens x 128 KiB/token (32 layers x 2 x 8 KV heads x 128 x 2 bytes) = 16.0 GiB
    assert "(16.0 GiB KV cache is needed" in ours[0]


def test_missing_local_model_is_taken_for_a_repo_id(failing):
    result = failing("missing path")
    assert result.returncode == 1
    block = STARTUP_ERRORS.split("################ ")[-1]
    expected = [normalise(line) for line in block.splitlines() if "Repo id must be" in line]
    assert len(expected) == 2
    assert all(line in output_lines(result) for line in expected)


@pytest.mark.parametrize("name,expected", [
    ("heads", "Value error, Total number of attention heads (6) must be divisible by tensor "
     "parallel size (4)."),
    ("remote code", "contains custom code which must be executed to correctly load the model."),
    ("no gpu runtime", "RuntimeError: Failed to infer device type, please set the environment "
     "variable `VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue."),
    ("no cuda device", "RuntimeError: No CUDA GPUs are available"),
    ("weights too big", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "),
    ("weight files too big", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "),
    ("port in use", "OSError: [Errno 98] Address already in use"),
])
def test_start_up_failures(failing, name, expected):
    result = failing(name)
    assert result.returncode == 1
    assert any(expected in line for line in output_lines(result)), result.stderr


def test_trust_remote_code_lets_a_custom_model_start(tmp_path):
    config = {**LLAMA_8B, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    with serving(str(model_dir(tmp_path, "m", config)), "--trust-remote-code",
                 "--max-model-len", "4096") as (port, _):
        assert request(port, "GET", "/health")[0] == 200


# --- HTTP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = model_dir(tmp_path_factory.mktemp("models"), "tiny-chat", LLAMA_8B)
    # no access log: nobody reads the stand-in's output pipe, which would fill and stop it
    with serving(str(model), "--served-model-name", "tiny", "--max-model-len", "4096",
                 "--disable-uvicorn-access-log", STANDIN_TOKEN_INTERVAL_MS="5") as (port, proc):
        yield port


def test_health_version_models(server):
    assert request(server, "GET", "/health")[::2] == (200, b"")
    status, headers, body = request(server, "GET", "/version")
    assert (status, json.loads(body)) == (200, {"version": "0.33.0"})
    status, headers, body = request(server, "GET", "/v1/models")
    models = json.loads(body)
    assert shape(models) == shape(json.loads(TRACE["models"]["chunks"][0][1]))
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 4096)]
    assert headers["Content-Type"] == TRACE["models"]["headers"]["Content-Type"]


def test_chat_not_streamed_matches_the_trace(server):
    status, headers, body = request(server, "POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5})
    assert status == 200
    reply = json.loads(body)
    assert shape(reply) == shape(json.loads(TRACE["chat"]["chunks"][0][1]))
    assert reply["usage"]["completion_tokens"] == 5
    assert reply["choices"][0]["finish_reason"] == "length"


def test_return_token_ids_puts_the_prompts_ids_after_the_usage(server):
    """vLLM 0.33's `return_token_ids` on a whole chat: the choice's token ids, and the prompt's
    after the usage (the door must find the usage away from the answer's end)."""
    status, _, body = request(server, "POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 3, "return_token_ids": True})
    assert status == 200
    reply = json.loads(body)
    keys = list(reply)
    assert keys.index("usage") < keys.index("prompt_token_ids")
    assert len(reply["prompt_token_ids"]) == reply["usage"]["prompt_tokens"]
    assert len(reply["choices"][0]["token_ids"]) == 3


def test_chat_stream_bytes_match_the_trace(server):
    status, headers, body = request(server, "POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    for name in ("Content-Type", "Transfer-Encoding"):
        assert headers[name] == TRACE["chat_stream_usage"]["headers"][name]
    events = sse_events(body)
    # role, 3 tokens, the last token (finish_reason), usage, [DONE]
    assert len(events) == 7
    case = "chat_stream_usage"
    assert event_shape(events[0]) == event_shape(trace_event(case, 0))
    assert all(event_shape(e) == event_shape(trace_event(case, 2)) for e in events[1:4])
    assert event_shape(events[4]) == event_shape(trace_event(case, 4))
    assert event_shape(events[5]) == event_shape(trace_event(case, 5))
    assert events[6] == trace_event(case, 6) == b"data: [DONE]\n\n"
    usage = json.loads(events[5][6:])["usage"]
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4


def test_completions_stream_bytes_match_the_trace(server):
    status, headers, body = request(server, "POST", "/v1/completions", {
        "model": "tiny", "prompt": "hello", "max_tokens": 3, "stream": True})
    events = sse_events(body)
    trace = [e[1].encode() for e in TRACE["completions_stream"]["chunks"]]
    assert len(events) == len(trace) == 4
    for ours, theirs in zip(events[:3], trace[:3], strict=True):
        assert event_shape(ours) == event_shape(theirs)
    assert [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:3]] == [
        None, None, "length"]
    assert events[3] == trace[3]


def usage_of(events: list[bytes]) -> list[object]:
    """Each data event's `usage` (KeyError: absent) as the stream carried it."""
    return [json.loads(e[6:]).get("usage", "absent") for e in events[:-1]]


@pytest.mark.parametrize(("options", "chat", "completions"), [
    # no stream_options: chat chunks have no usage key, completions chunks "usage": null
    (None, ["absent"] * 4, [None] * 3),
    # include_usage: the same, then a last chunk with "choices": [] and the totals
    ({"include_usage": True}, ["absent"] * 4 + ["total"], [None] * 3 + ["total"]),
    ({}, ["absent"] * 4 + ["total"], [None] * 3 + ["total"]),  # StreamOptions' default: true
    ({"include_usage": False, "continuous_usage_stats": True}, ["absent"] * 4, [None] * 3),
    # continuous_usage_stats: the usage so far on every chunk, the role chunk's with 0
    ({"include_usage": "yes", "continuous_usage_stats": 1},
     [0, 1, 2, 3, "total"], [1, 2, 3, "total"]),
])
def test_stream_usage_follows_vllms_stream_options(server, options, chat, completions):
    """vLLM 0.33's stream_options (protocol.py StreamOptions, serving_chat.py,
    serving_completion.py), booleans read as pydantic reads them."""
    for path, body, expected in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, chat),
            ("/v1/completions", {"prompt": "hi"}, completions)):
        request_body = {"model": "tiny", "max_tokens": 3, "stream": True, **body}
        if options is not None:
            request_body["stream_options"] = options
        events = sse_events(request(server, "POST", path, request_body)[2])
        usages = usage_of(events)
        prompt = next((u["prompt_tokens"] for u in usages if isinstance(u, dict)), None)
        seen = []
        for event, usage in zip(events, usages, strict=False):
            if not isinstance(usage, dict):
                seen.append(usage)
                continue
            assert usage["total_tokens"] == usage["prompt_tokens"] == prompt or usage[
                "total_tokens"] == prompt + usage["completion_tokens"]
            final = json.loads(event[6:])["choices"] == []
            seen.append("total" if final else usage["completion_tokens"])
            if final:  # exclude_none: no prompt_tokens_details
                assert list(usage) == ["prompt_tokens", "total_tokens", "completion_tokens"]
            elif path == "/v1/completions":  # a completions chunk dumps every field
                assert usage["prompt_tokens_details"] is None
        assert seen == expected, path


def test_stream_options_without_a_stream_is_refused_as_vllm_does(server):
    status, _, body = request(server, "POST", "/v1/completions", {
        "model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}})
    assert status == 400
    assert json.loads(body)["error"]["message"] == (
        "Stream options can only be defined when `stream=True`.")


def test_an_aborted_stream_counts_the_tokens_generated_until_it_stopped(server):
    """As measured on a real vLLM (issue 24): generation_tokens_total grows by what an aborted
    stream generated up to the abort, nothing more afterwards."""
    def generated() -> int:
        metrics = request(server, "GET", "/metrics")[2].decode()
        return int(float(re.search(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", metrics,
                                   re.MULTILINE).group(1)))

    before = generated()
    body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 3000, "stream": True})
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                     f"\r\n\r\n{body}".encode())
        data = b""
        while data.count(b"data: ") < 5:
            data += sock.recv(65536)
    time.sleep(0.5)
    settled = generated()
    time.sleep(0.5)
    assert generated() == settled
    assert data.count(b"data: ") <= settled - before < 3000


def test_errors_match_the_trace(server):
    status, _, body = request(server, "POST", "/v1/chat/completions", {
        "model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert (status, body.decode()) == (404, TRACE["unknown_model"]["chunks"][0][1])
    status, _, body = request(server, "POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 10000000})
    assert (status, body.decode()) == (400, TRACE["too_long"]["chunks"][0][1])
    status, _, body = request(server, "POST", "/v1/chat/completions", b"{bad")
    ours = body.decode().replace("/usr/local/lib/python3.12/dist-packages", "<site-packages>")
    assert (status, ours) == (400, TRACE["bad_json"]["chunks"][0][1])
    assert request(server, "GET", "/nowhere")[0] == 404
    assert request(server, "GET", "/v1/chat/completions")[0] == 405


def test_tokenize_and_invocations(server):
    status, _, body = request(server, "POST", "/tokenize", {"model": "tiny", "prompt": "a b c"})
    tokens = json.loads(body)
    assert shape(tokens) == shape(json.loads(TRACE["tokenize"]["chunks"][0][1]))
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 4096
    status, _, body = request(server, "POST", "/invocations", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200
    assert shape(json.loads(body)) == shape(json.loads(TRACE["invocations"]["chunks"][0][1]))


def test_metrics_count_what_was_served(server):
    def counters() -> dict[str, float]:
        status, headers, body = request(server, "GET", "/metrics")
        assert headers["Content-Type"] == TRACE["metrics"]["headers"]["Content-Type"]
        out = {}
        for line in body.decode().splitlines():
            m = re.match(r'(vllm:[a-z_]+)\{engine="0",(?:finished_reason="length",)?'
                         r'model_name="tiny"\} (\S+)$', line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    before = counters()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_count"):
        assert name in before
    request(server, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 7})
    after = counters()
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 7
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 1
    assert (after["vllm:time_to_first_token_seconds_count"]
            - before["vllm:time_to_first_token_seconds_count"]) == 1
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]


def test_keep_alive_serves_several_requests_on_one_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
    for _ in range(3):
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True}))
    assert sse_events(conn.getresponse().read())[-1] == b"data: [DONE]\n\n"
    conn.close()


def test_api_key_protects_only_v1_paths(tmp_path):
    with serving(str(model_dir(tmp_path, "m", LLAMA_8B)), "--api-key", "k1", "k2",
                 "--max-model-len", "4096") as (port, _):
        status, _, body = request(port, "GET", "/v1/models")
        assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
        assert request(port, "GET", "/v1/models", headers={"Authorization": "Bearer k1"})[0] == 200
        assert request(port, "GET", "/v1/models", headers={"Authorization": "Bearer k2"})[0] == 200
        assert request(port, "GET", "/v1/models", headers={"Authorization": "Basic k1"})[0] == 401
        for path, method, body in (("/health", "GET", None), ("/metrics", "GET", None),
                                   ("/tokenize", "POST", {"prompt": "x"}),
                                   ("/invocations", "POST", {"prompt": "x", "max_tokens": 1})):
            assert request(port, method, path, body)[0] == 200, path


async def _stream(port: int, max_tokens: int) -> list[float]:
    """Arrival times of each token chunk of one streamed completion."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": "x", "max_tokens": max_tokens, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(body), body))
    await reader.readuntil(b"\r\n\r\n")
    times = []
    while True:
        size = int(await reader.readuntil(b"\r\n"), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            break
        if b'"text"' in chunk:
            times.append(time.monotonic())
    writer.close()
    return times


def test_tokens_are_paced(tmp_path):
    with serving(str(model_dir(tmp_path, "m", LLAMA_8B)), "--max-model-len", "4096",
                 STANDIN_TOKEN_INTERVAL_MS="40") as (port, _):
        times = asyncio.run(_stream(port, 10))
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    assert len(times) == 10
    assert 0.03 < gaps[len(gaps) // 2] < 0.06
    assert times[-1] - times[0] >= 9 * 0.035


def test_sustains_200_concurrent_streams(tmp_path):
    with serving(str(model_dir(tmp_path, "m", LLAMA_8B)), "--max-model-len", "4096",
                 "--disable-uvicorn-access-log") as (port, _):
        async def many():
            return await asyncio.gather(*(_stream(port, 20) for _ in range(200)))
        results = asyncio.run(many())
    assert all(len(times) == 20 for times in results)
    gaps = sorted(b - a for times in results for a, b in itertools.pairwise(times))
    assert gaps[len(gaps) // 2] < 0.03  # 20 ms per token, not slowed by 200 streams


def test_max_num_seqs_queues_the_rest(tmp_path):
    with serving(str(model_dir(tmp_path, "m", LLAMA_8B)), "--max-model-len", "4096",
                 "--max-num-seqs", "2", STANDIN_TOKEN_INTERVAL_MS="20") as (port, _):
        async def four():
            started = time.monotonic()
            results = await asyncio.gather(*(_stream(port, 10) for _ in range(4)))
            return [times[0] - started for times in results]
        firsts = sorted(asyncio.run(four()))
    # two run at once; the other two wait for them (10 tokens x 20 ms)
    assert firsts[1] < 0.1 and firsts[2] > 0.15


def test_an_idle_keep_alive_connection_is_closed_like_uvicorn(tmp_path):
    """VLLM_HTTP_TIMEOUT_KEEP_ALIVE: reused before the timeout, closed by the server after it."""
    with serving(str(model_dir(tmp_path, "m", LLAMA_8B)),
                 VLLM_HTTP_TIMEOUT_KEEP_ALIVE="0.5") as (port, _):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.connect()
        time.sleep(1.0)  # uvicorn arms the timeout after a response, not when a client connects
        for _ in range(2):  # the second request reuses the connection within the timeout
            conn.request("GET", "/health")
            assert conn.getresponse().read() == b""
        sock = conn.sock
        time.sleep(1.0)
        sock.settimeout(2)
        assert sock.recv(1) == b""  # the server closed it (EOF), as uvicorn does
        conn.close()


def test_custom_histogram_buckets_replace_a_family_and_http_requests_are_counted(tmp_path):
    model = model_dir(tmp_path, "tiny-chat", LLAMA_8B)
    buckets = '{"time_to_first_token": [0.05, 0.2], "inter_token_latency": [0.03, 1.0]}'
    with serving(str(model), "--served-model-name", "tiny", "--max-model-len", "4096",
                 "--custom-histogram-buckets", buckets,
                 STANDIN_TOKEN_INTERVAL_MS="5") as (port, _):
        request(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "x",
                                                  "max_tokens": 3})
        text = request(port, "GET", "/metrics")[2].decode()
    bounds = {name: re.findall(rf'^{name}_bucket{{.*le="([^"]+)"', text, re.MULTILINE)
              for name in ("vllm:time_to_first_token_seconds",
                           "vllm:request_time_per_output_token_seconds",
                           "vllm:e2e_request_latency_seconds")}
    assert bounds["vllm:time_to_first_token_seconds"] == ["0.05", "0.2", "+Inf"]
    assert bounds["vllm:request_time_per_output_token_seconds"] == ["0.03", "1.0", "+Inf"]
    assert bounds["vllm:e2e_request_latency_seconds"][0] == "0.3"  # other families unchanged
    assert ('http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 1.0'
            in text)


@pytest.mark.parametrize("value", ['{"ttft": [0.1]}', '{"time_to_first_token": [0.2, 0.1]}',
                                   "[0.1]", "{not json"])
def test_bad_custom_histogram_buckets_exit_2(tmp_path, value):
    model = model_dir(tmp_path, "tiny-chat", LLAMA_8B)
    result = run_standin("serve", str(model), "--custom-histogram-buckets", value)
    assert result.returncode == 2
    assert "argument --custom-histogram-buckets:" in result.stderr
