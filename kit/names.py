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
