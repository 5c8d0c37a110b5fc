"""What a name, host or size may be: one definition for the spec, the CLI and credential files.

Every value here lands in a rendered file (YAML, nginx, htpasswd, argv), so each is allow-listed
by what it is and matched whole. The patterns are anchored `^…$` for pydantic, whose Rust regex
engine reads `$` as the end of the text; Python's `$` also matches before a final newline, so
Python code only ever uses them through `fullmatch` (see `is_name`).
"""

import ipaddress
import re

SITE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
SERVICE_NAME = r"^[a-z][a-z0-9-]{0,40}$"
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$"
MODEL_REF = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
# a Hub revision: a 40-hex commit, or a branch or tag name (resolved to a commit by `kit lock`)
REVISION = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
COMMIT = r"^[0-9a-f]{40}$"
SHA256 = r"^[0-9a-f]{64}$"  # a file's digest, as sha256sum prints it
USER_NAME = r"^[a-z][a-z0-9._-]{0,31}$"  # auth.users, `kit users`, `kit keys` names
IMAGE_REF = r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[a-f0-9]{64})?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENV_VALUE = r"^[^\n\r\x00$]*$"  # compose expands `$`; argv and env cannot hold NUL
HEADER_NAME = r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$"  # an HTTP header name nginx can read as $http_*
SIZE = r"^[1-9][0-9]{0,6}[kmg]?$"
ACME_SERVER = r"^https://[A-Za-z0-9.:/_-]+$"
# an address certbot takes as the value of --email: never an option ('-' first), no dot first
EMAIL = (r"^[A-Za-z0-9_%+][A-Za-z0-9._%+-]*"  # the local part
         r"@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$")
SMTP_USER = r"^[A-Za-z0-9_%+@.-]{1,254}$"  # an SMTP login: a name or an address
PATH_TEXT = r"^/[^\s\"'`$;{}\\:,\x00]*$"  # host paths in compose bind mounts
HOSTNAME_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
INTERFACE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$"  # a Linux network interface (IFNAMSIZ)
# Kubernetes object names: Services (DNS-1035 label) are the strictest rule every kind accepts.
K8S_NAME = r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"
SSH_USER = r"^[a-z_][a-z0-9._-]{0,31}$"  # the login of an `engine: ssh://user@host` URL

SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

# Host folders kit never binds into a container (models_root, hf_cache: vLLM runs a model's code
# there). Each tree is refused with everything below it, and so is every folder above one (a
# bind of /var holds /var/run): the host's configuration and secrets, kernel interfaces,
# devices, binaries and libraries, root's home, the engine's data, and the runtime folders that
# hold the Docker socket (a read-only bind does not stop connect(): the socket is root on the
# host). docs/operations.md lists them.
SYSTEM_TREES = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/snap", "/sys", "/usr", "/var/lib/containerd", "/var/lib/docker",
    "/var/lock", "/var/run",
)
# Refused themselves (every user's files, other processes' sockets); a folder below is fine.
SHARED_FOLDERS = ("/home", "/tmp", "/var/tmp")


def is_name(pattern: str, value: str) -> bool:
    """Whether `value` is wholly of the kind `pattern` describes (a trailing newline is not)."""
    return re.fullmatch(pattern, value) is not None


def host(value: str) -> str:
    """A DNS name (lower case, no trailing dot) or an IP address without a scope id.

    Raises ValueError saying what it is not. `%zone` is refused: Python's parser takes anything
    after `%` (`::1%x; location …`), and no rendered file needs a link-local scope.
    """
    if "%" not in value:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    name = value.lower().removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(is_name(HOSTNAME_LABEL, label) for label in labels):
        raise ValueError(f"{value!r} is not a DNS name or IP address (e.g. llm.example.com)")
    return name


def ip(value: str) -> str:
    """An IP address without a scope id, in its normal form; raises ValueError otherwise."""
    if "%" not in value:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not an IP address without a %zone (e.g. 0.0.0.0 or ::)")


def normal_path(path: str) -> str:
    """An absolute path in its lexical normal form: no `.`, `..`, doubled or trailing `/`."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def bind_refusal(path: str, sockets: tuple[str, ...] = ()) -> str | None:
    """Why `path` may not be a bind source (None: it may): a system tree or what lies below it,
    a folder above one, a shared folder, or the `sockets` (the engine's) or a folder above them.
    Lexical: callers that can see the disk pass the path with symlinks resolved as well."""
    normal = normal_path(path)
    if normal == "/":
        return "is the host's whole file system"
    for tree in SYSTEM_TREES:
        if _within(normal, tree):
            return f"is {tree}" + ("" if normal == tree else " or below it") + \
                ", a system folder"
        if _within(tree, normal):
            return f"holds the system folder {tree}"
    if normal in SHARED_FOLDERS:
        return "is a folder every user or process shares"
    for socket in sockets:
        if _within(normal_path(socket), normal):
            return f"holds the Docker engine's socket {socket}"
    return None


PRIVATE_SUBNET_PREFIXES = (16, 29)  # the metrics network: room for the 4 addresses kit fixes


def private_subnet(value: str) -> str:
    """A private IPv4 network in its normal form (`10.9.8.0/28`), host bits zero, its prefix
    within PRIVATE_SUBNET_PREFIXES; raises ValueError saying what it is not."""
    low, high = PRIVATE_SUBNET_PREFIXES
    try:
        network = ipaddress.IPv4Network(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 network with zero host bits "
                         "(e.g. 10.89.7.0/28)") from None
    if not network.is_private or network.is_loopback or network.is_link_local:
        raise ValueError(f"{value} is not a private network (use one of 10.0.0.0/8, "
                         "172.16.0.0/12, 192.168.0.0/16, 198.18.0.0/15)")
    if not low <= network.prefixlen <= high:
        raise ValueError(f"{value}: the prefix must be /{low} to /{high}")
    return str(network)


def size_bytes(value: str) -> int:
    """`512k` → 524288; the value must already match SIZE."""
    unit = value[-1] if value[-1] in SIZE_UNITS else ""
    return int(value.removesuffix(unit)) * SIZE_UNITS[unit]


def nginx_size(size: int) -> str:
    """A byte count as every nginx size directive reads it: `k`/`m` only (no `g`)."""
    for unit in ("m", "k"):
        if size % SIZE_UNITS[unit] == 0:
            return f"{size // SIZE_UNITS[unit]}{unit}"
    return str(size)


# ---- vLLM's HTTP routes at the front door ------------------------------------------------------
# The pinned vLLM's whole route table is tests/standin/vllm-0.33.0-routes.txt (extracted from its
# wheel by scripts/gen_vllm_routes.py); a unit test fails on a route of it not classified here.
# docs/auth.md says why each route is in or out. The door matches a path exactly, after nginx
# normalized it (percent-decoding, `..`, duplicate slashes), and sends vLLM that normal form.

# Passed to vLLM with their one method, routed by the JSON body's "model" (route.js): the OpenAI
# API a client needs.
OPENAI_ROUTES: dict[str, str] = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/embeddings": "POST",
    "/v1/responses": "POST",
}

# Answered by the front door itself from what every service reports (never passed as asked).
DOOR_ROUTES: dict[str, str] = {
    "/v1/models": "GET",  # the union of every service's list (route.js)
    "/v1/models/{model}": "GET",  # one entry of that list (route.js); not a vLLM route
    "/health": "GET",  # every service's readiness, nothing else
    "/metrics/{path}": "GET",  # as /metrics/<service>, with credentials (kit bench's gauges)
}

# The rest of vLLM's routes, refused with a JSON 404 whatever the credential, by why.
REFUSED_ROUTES: dict[str, tuple[str, ...]] = {
    "changes the engine, its weights or adapters for every user (admin, development, RL)": (
        "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up",
        "/release_kv_cache_memory", "/reset_prefix_cache", "/reset_mm_cache",
        "/reset_encoder_cache", "/collective_rpc", "/scale_elastic_ep", "/pause", "/resume",
        "/abort_requests", "/inference/v1/abort_requests", "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update",
        "/update_weights", "/finish_weight_update", "/update_weight_version", "/weight_checker",
        "/start_profile", "/stop_profile", "/fault_tolerance/apply",
    ),
    "reveals the server's configuration or state (debug, documentation, other probes)": (
        "/server_info", "/is_sleeping", "/is_paused", "/is_scaling_elastic_ep",
        "/get_world_size", "/weight_info", "/load", "/version", "/kv_event_sources",
        "/fault_tolerance/status", "/ping", "/ready", "/readyz", "/openapi.json", "/docs",
        "/docs/oauth2-redirect", "/redoc", "/static/{path}",
    ),
    "holds state in one replica's memory, readable by anyone who has the id": (
        "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel",
    ),
    "not the OpenAI API: other vendors' APIs and vLLM's own extensions": (
        "/v1/messages", "/v1/messages/count_tokens", "/cohere/v2/chat", "/v2/embed",
        "/v2/rerank", "/v1/rerank", "/rerank", "/v1/score", "/score", "/classify", "/pooling",
        "/tokenize", "/detokenize", "/tokenizer_info", "/invocations", "/generative_scoring",
        "/v1/decisions", "/v1/systemone", "/inference/v1/generate",
    ),
    "many requests in one, past the per-request limits": ("/v1/chat/completions/batch",),
    "scale-out rendering between vLLM servers, not for clients": (
        "/v1/chat/completions/render", "/v1/chat/completions/derender", "/v1/completions/render",
        "/v1/completions/derender", "/v1/messages/render", "/v1/responses/render",
        "/cohere/v2/chat/render",
    ),
    "not a JSON body kit can route by its model (multipart upload, WebSocket)": (
        "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/realtime",
    ),
}
