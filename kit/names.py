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
