"""vLLM container log → why the service did not start, and which site.yaml key fixes it.

A failed start leaves a long log whose last lines are generic ("Engine core initialization
failed. See root cause above"); the cause is one line further up, in vLLM's, PyTorch's, NCCL's,
argparse's or the Hugging Face Hub's own words. Rules are listed from the most specific cause to
the most generic; the first rule that matches anywhere in the log wins, so a precise ValueError
beats the crash lines that follow it.
"""

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from kit.spec.vllm_flags import SPEC_KEY_FLAGS


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    fix: str
    spec_key: str  # the site.yaml key to change, e.g. services[].max_model_len
    evidence: str  # the log line that gave it away


@dataclass(frozen=True)
class _Finding:
    cause: str
    fix: str
    spec_key: str


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    explain: Callable[[re.Match[str], str], _Finding]  # (match, whole log) → finding


def diagnose(log_text: str) -> Diagnosis | None:
    """The cause of a failed vLLM start-up in `log_text`, or None when no rule recognises it."""
    for rule in RULES:
        match = rule.pattern.search(log_text)
        if match:
            finding = rule.explain(match, log_text)
            return Diagnosis(finding.cause, finding.fix, finding.spec_key, _line_of(match))
    return None


def _line_of(match: re.Match[str]) -> str:
    text = match.string
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start : end if end != -1 else len(text)].strip()


# --------------------------------------------------------------------------- explanations


def _kv_cache_too_small(match: re.Match[str], _log: str) -> _Finding:
    wanted = match["wanted"] or match["wanted_v0"]
    fits = (match["fits"] or match["fits_v0"]).replace(",", "")
    return _Finding(
        f"the KV cache left after loading the weights holds {fits} tokens, fewer than one "
        f"request of max_model_len {wanted} needs",
        f"set services[].max_model_len to at most {fits}, or raise "
        f"services[].gpu_memory_utilization, or give the service more GPUs (services[].gpus)",
        "services[].max_model_len",
    )


def _no_cache_memory(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "nothing was left for the KV cache after the weights and the warm-up run",
        "raise services[].gpu_memory_utilization, or use more GPUs (services[].gpus) or a "
        "smaller/quantized model",
        "services[].gpu_memory_utilization",
    )


def _gpu_busy(match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        f"only {match['free']} GiB of the GPU was free at start, less than the "
        f"{match['wanted']} GiB that gpu_memory_utilization {match['fraction']} reserves: "
        "another process or service holds memory on that GPU",
        "stop whatever else uses the GPU (nvidia-smi), or lower "
        "services[].gpu_memory_utilization so that the services sharing it fit",
        "services[].gpu_memory_utilization",
    )


def _above_model_limit(match: re.Match[str], _log: str) -> _Finding:
    limits = [float(v) for v in re.findall(r"=(\d+(?:\.\d+)?)", match["derived"])]
    limit = f"{min(limits):.0f}" if limits else "the model's limit"
    return _Finding(
        f"max_model_len {match['asked']} is above what the model supports ({match['derived']})",
        f"set services[].max_model_len to at most {limit}",
        "services[].max_model_len",
    )


def _heads_not_divisible(match: re.Match[str], _log: str) -> _Finding:
    heads, tp = int(match["heads"]), int(match["tp"])
    counts = [n for n in range(1, max(8, tp) + 1) if heads % n == 0]
    return _Finding(
        f"the model's {heads} attention heads cannot be split evenly over {tp} GPUs",
        f"list a number of GPUs in services[].gpus that divides {heads} "
        f"({', '.join(map(str, counts))})",
        "services[].gpus",
    )


def _too_few_gpus(match: re.Match[str], _log: str) -> _Finding:
    seen = f"sees {match['available']}" if match["available"] else "sees fewer"
    return _Finding(
        f"vLLM needs {match['world'] or 'more'} GPUs (tensor × pipeline parallel) but the "
        f"container {seen}",
        "list only GPU indices that exist (nvidia-smi -L) in services[].gpus, and do not add "
        "--pipeline-parallel-size in extra_args",
        "services[].gpus",
    )


def _unknown_quantization(match: re.Match[str], _log: str) -> _Finding:
    methods = re.findall(r"'([^']+)'", match["methods"] or "")
    close = difflib.get_close_matches(match["method"], methods, n=3)
    hint = f" (close: {', '.join(close)})" if close else ""
    return _Finding(
        f"vLLM has no quantization method {match['method']!r}",
        f"set services[].quantization to a method vLLM lists{hint}, or remove it to use the "
        "checkpoint's own",
        "services[].quantization",
    )


def _invalid_kv_dtype(match: re.Match[str], _log: str) -> _Finding:
    dtype = match["dtype"].strip("'")
    return _Finding(
        f"vLLM does not accept kv_cache_dtype {dtype!r}",
        "set services[].kv_cache_dtype to auto, or to a type this vLLM image and GPU support "
        "(kit validates against the vLLM version it ships with: does images.vllm pin another?)",
        "services[].kv_cache_dtype",
    )


def _invalid_choice(match: re.Match[str], _log: str) -> _Finding:
    flag = match["flag"]
    key = SPEC_KEY_FLAGS.get(flag, "")
    spec_key = f"services[].{key}" if key and not key.startswith("(") else "services[].extra_args"
    return _Finding(
        f"vLLM rejects {match['value']} for {flag}",
        f"change {spec_key} to one of the values vLLM lists ({match['choices'] or 'see --help'})",
        spec_key,
    )


def _unknown_flag(match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        f"this vLLM image does not know {match['flags'].strip()}",
        "remove it from services[].extra_args (kit checks extra_args against the vLLM version "
        "it ships with: does images.vllm pin a different one?)",
        "services[].extra_args",
    )


def _remote_code(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "the model ships its own Python code, which vLLM runs only when trusted",
        "set services[].trust_remote_code: true if you trust this model's code",
        "services[].trust_remote_code",
    )


def _gated(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "the Hugging Face Hub refused the download: the model is gated or private and no "
        "authorised token was sent",
        "accept the model's licence on its Hub page and set services[].env.HF_TOKEN to a token "
        "of that account (kit writes it only to compose/<service>.env, mode 0600, never to the "
        "compose file; keep the spec private too: chmod 600 site.yaml), or put the model under "
        "models_root",
        "services[].env.HF_TOKEN",
    )


def _repo_not_found(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "the Hugging Face Hub has no such model (or it is private)",
        "check the org/name in services[].model; for a private model set "
        "services[].env.HF_TOKEN (kept in the 0600 compose/<service>.env; chmod 600 the spec)",
        "services[].model",
    )


def _missing_local_model(match: re.Match[str], _log: str) -> _Finding:
    path = match["path"]
    return _Finding(
        f"{path} does not exist in the container, so vLLM took it for a Hub id",
        f"put the model folder under models_root (mounted at /models) or fix services[].model "
        f"({path} is models_root/<model>)",
        "services[].model",
    )


def _no_gpu(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "the container got no GPU: Docker has no NVIDIA runtime, or the requested device is "
        "missing",
        "install the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker, "
        "then restart docker) and check that services[].gpus lists indices nvidia-smi shows",
        "services[].gpus",
    )


def _shared_memory(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "the tensor-parallel workers ran out of shared memory (/dev/shm); Docker gives a "
        "container 64 MiB unless told otherwise",
        "kit runs every service with more than one GPU with `ipc: host`: check the container "
        "has it (docker inspect -f '{{.HostConfig.IpcMode}}'), and if the compose file was "
        "edited or another tool started it, run `kit render` and `kit up` again",
        "services[].gpus",
    )


def _shm_stall(match: re.Match[str], log: str) -> _Finding:
    finding = _shared_memory(match, log)
    return _Finding(
        "a worker stopped answering over shared memory; harmless while a long compile runs, "
        "a fault when the service never becomes healthy: " + finding.cause,
        finding.fix,
        finding.spec_key,
    )


def _cuda_oom(match: re.Match[str], log: str) -> _Finding:
    loaded = LOADED_WEIGHTS.search(log, 0, match.start())
    if loaded is None:
        return _Finding(
            "the GPU ran out of memory while loading the weights: the model does not fit",
            "spread it over more GPUs (services[].gpus), or serve a quantized checkpoint",
            "services[].gpus",
        )
    return _Finding(
        "the GPU ran out of memory after the weights loaded (warm-up, CUDA graphs or memory "
        "used outside PyTorch)",
        "lower services[].gpu_memory_utilization (e.g. by 0.05) to leave headroom, or lower "
        "max_num_seqs / max_model_len",
        "services[].gpu_memory_utilization",
    )


def _port_in_use(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "a port the stack listens on is taken by another process or container",
        "stop the other process (ss -ltnp) or move the front door with proxy.https_port / "
        "proxy.http_port",
        "proxy.https_port",
    )


# --------------------------------------------------------------------------- multi-node services


def _unknown_interface(match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        f"this node has no network interface {match['ifname']!r}, which NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME name (kit sets both from network_interface)",
        "set services[].network_interface to the interface that holds this node's address in "
        "services[].nodes (`ip -br addr` on each node; every node needs the same name)",
        "services[].network_interface",
    )


def _loopback_fallback(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "Gloo found no routable address for this node and fell back to the loopback address, "
        "so the other nodes cannot reach it",
        "set services[].network_interface to the interface of the nodes' own network (the one "
        "holding their services[].nodes addresses, `ip -br addr`)",
        "services[].network_interface",
    )


def _master_unreachable(match: re.Match[str], _log: str) -> _Finding:
    host, port = match["host"], match["port"]
    return _Finding(
        f"this node could not reach {host}:{port} (the head's rendezvous) within "
        f"{match['after']}: a firewall drops the port, or the head is not listening there",
        f"open TCP {port} on the head to the other nodes (and vLLM's dynamic ports: host "
        "networking), check that services[].nodes[0].address is the head's address on the "
        "nodes' network, or choose a free services[].master_port",
        "services[].master_port",
    )


def _node_missing(match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        f"only {match['joined']} of {match['total']} nodes joined the head within "
        f"{match['seconds']} s: a worker is not running, was started from another spec (its "
        "--nnodes or --node-rank differ), or cannot reach the head",
        "start every worker from the same render (compose/node-<name>.yml on each node, whose "
        "--nnodes and --node-rank follow services[].nodes), then check each worker's log",
        "services[].nodes",
    )


def _collective_timeout(match: re.Match[str], _log: str) -> _Finding:
    seconds = int(match["ms"]) // 1000
    return _Finding(
        f"a {match['op']} between the GPUs of the nodes did not finish in {seconds} s: a node "
        "stopped answering or NCCL's traffic takes a path that drops it",
        "check every node's container (kit status, kit logs), that services[].network_interface "
        "is the nodes' fast network, and run once with NCCL_DEBUG=INFO in services[].env",
        "services[].network_interface",
    )


def _node_lost(_match: re.Match[str], _log: str) -> _Finding:
    return _Finding(
        "another node of this multi-node service went away (its process exited or the network "
        "between the nodes failed), so the whole model stopped",
        "find which node stopped (kit logs on each node, kit status), fix it, then start the "
        "service again: every node restarts together",
        "services[].nodes",
    )


LOADED_WEIGHTS = re.compile(r"Model loading took|Loading (?:model )?weights took")

RULES: list[_Rule] = [
    _Rule(re.compile(
        r"max seq len \((?P<wanted>\d+)\), \(.*?estimated maximum model length is "
        r"(?P<fits>[\d,]+)|max seq len \((?P<wanted_v0>\d+)\) is larger than the maximum number of "
        r"tokens that can be stored in KV cache \((?P<fits_v0>[\d,]+)\)"
    ), _kv_cache_too_small),
    _Rule(re.compile(r"No available memory for the cache blocks"), _no_cache_memory),
    _Rule(re.compile(
        r"Free memory on device.*?\((?P<free>[\d.]+)/[\d.]+ GiB\) on startup is less than desired "
        r"GPU memory utilization \((?P<fraction>[\d.]+), (?P<wanted>[\d.]+) GiB\)"
    ), _gpu_busy),
    _Rule(re.compile(
        r"User-specified max_model_len \((?P<asked>\d+)\) is greater than the derived "
        r"max_model_len \((?P<derived>[^)]*?)(?: in model's config\.json)?\)"
    ), _above_model_limit),
    _Rule(re.compile(
        r"Total number of attention heads \((?P<heads>\d+)\) must be divisible by tensor "
        r"parallel size \((?P<tp>\d+)\)"
    ), _heads_not_divisible),
    _Rule(re.compile(
        r"World size \((?P<world>\d+)\) is larger than the number of available GPUs "
        r"\((?P<available>\d+)\)|The number of required GPUs exceeds the total number of "
        r"available GPUs"
    ), _too_few_gpus),
    _Rule(re.compile(
        r"Unknown quantization method: (?P<method>[^\s.]+)\.(?: Must be one of "
        r"\[(?P<methods>[^\]]*)\])?"
    ), _unknown_quantization),
    _Rule(re.compile(r"Invalid kv_cache_dtype: (?P<dtype>'?[^\s.']+'?)"), _invalid_kv_dtype),
    _Rule(re.compile(
        r"argument (?P<flag>--[\w-]+)(?:/-\w+)?: invalid choice: (?P<value>'[^']*')"
        r"(?: \(choose from (?P<choices>[^)]*)\))?"
    ), _invalid_choice),
    _Rule(re.compile(r"error: unrecognized arguments: (?P<flags>.+)"), _unknown_flag),
    _Rule(re.compile(
        r"contains custom code which must be executed|requires you to execute the configuration "
        r"file in that repo"
    ), _remote_code),
    _Rule(re.compile(
        r"GatedRepoError|Cannot access gated repo|Access to model \S+ is restricted|"
        r"trying to access a gated repo"
    ), _gated),
    _Rule(re.compile(r"Repository Not Found for url|RepositoryNotFoundError"), _repo_not_found),
    _Rule(re.compile(
        r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '(?P<path>/[^']*)'"
    ), _missing_local_model),
    _Rule(re.compile(
        r"Failed to infer device type|No CUDA GPUs are available|"
        r"could not select device driver \"[^\"]*\" with capabilities: \[\[gpu\]\]"
    ), _no_gpu),
    _Rule(re.compile(
        r"ncclShmOpen|Error while creating shared memory segment|"
        r"Error while attaching to shared memory segment|posix_fallocate failed"
    ), _shared_memory),
    _Rule(re.compile(r"No available shared memory broadcast block"), _shm_stall),
    _Rule(re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError"), _cuda_oom),
    _Rule(re.compile(r"Bus error"), _shared_memory),
    _Rule(re.compile(r"[Aa]ddress already in use|port is already allocated"), _port_in_use),
    _Rule(re.compile(r"Unable to find address for: (?P<ifname>\S+)"), _unknown_interface),
    _Rule(re.compile(
        r"Unable to resolve hostname to a \(local\) address\. Using the loopback address"
    ), _loopback_fallback),
    _Rule(re.compile(
        r"The client socket has timed out after (?P<after>\S+) while trying to connect to "
        r"\((?P<host>[^,()]+), (?P<port>\d+)\)"
    ), _master_unreachable),
    _Rule(re.compile(
        r"Timed out after (?P<seconds>\d+) seconds waiting for (?:clients|workers)\. "
        r"(?P<joined>\d+)/(?P<total>\d+) (?:clients|workers) joined"
    ), _node_missing),
    _Rule(re.compile(
        r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(?P<op>\w+).*?"
        r"Timeout\(ms\)=(?P<ms>\d+)\)"
    ), _collective_timeout),
    _Rule(re.compile(r"remote process exited or there was a network error"), _node_lost),
]
