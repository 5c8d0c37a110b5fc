"""Where a site's Docker engine is: the spec's `engine:`, else DOCKER_HOST, else the local socket.

The spec accepts two kinds of address: `ssh://user@host[:port]` (a remote engine reached through
docker-py's SSH transport, host key checked against known_hosts) and `unix:///path` (a local
socket). Anything else is refused with the fix: plain `tcp://` would hand the engine, which is
root on that host, to whoever can reach the port. DOCKER_HOST keeps what the docker CLI accepts
(tcp:// with DOCKER_TLS_VERIFY included), since the operator set it for every docker tool.
"""

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from kit import names

DEFAULT_HOST = "unix:///var/run/docker.sock"
SSH_PORT = 22
ACCEPTED = "ssh://user@host[:port] (e.g. ssh://ops@gpu01.example.com) or unix:///path/docker.sock"


@dataclass(frozen=True)
class SshTarget:
    """The parts of an ssh:// engine address, as known_hosts and ssh-keyscan name them."""

    user: str
    host: str
    port: int

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == SSH_PORT else f"[{self.host}]:{self.port}"

    @property
    def keyscan(self) -> str:
        """The command that shows the host key to review before trusting it."""
        port = "" if self.port == SSH_PORT else f"-p {self.port} "
        return f"ssh-keyscan {port}{self.host}"

    @property
    def url(self) -> str:
        """The normal form: the port only when it is not 22, an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{self.user}@{host}" + ("" if self.port == SSH_PORT else f":{self.port}")

    def __str__(self) -> str:
        return self.url.removeprefix("ssh://")


def spec_engine(value: str) -> str:
    """The spec's `engine:` value, whole and normalised; ValueError naming what is accepted."""
    if value.startswith("ssh://"):
        return _ssh_parts(value).url
    if value.startswith("unix://"):
        path = value.removeprefix("unix://")
        if not path.startswith("/") or not names.is_name(names.PATH_TEXT, path):
            raise ValueError(f"{value!r}: a unix socket is unix:// and an absolute path without "
                             "spaces or quotes (e.g. unix:///var/run/docker.sock)")
        return value
    scheme = value.partition("://")[0] if "://" in value else value
    why = ("a plain tcp:// engine is unauthenticated and unencrypted: whoever reaches the port "
           "is root on that host" if scheme in ("tcp", "http") else f"{scheme!r} is not supported")
    raise ValueError(f"{value!r}: {why}; use {ACCEPTED} (a TLS tcp:// engine: leave engine unset "
                     "and set DOCKER_HOST with DOCKER_TLS_VERIFY=1 as for the docker CLI)")


def _ssh_parts(value: str) -> SshTarget:
    parts = urlsplit(value)
    try:
        port = SSH_PORT if parts.port is None else parts.port
    except ValueError:
        raise ValueError(f"{value!r}: the port must be a number from 1 to 65535") from None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.password:
        raise ValueError(f"{value!r}: nothing may follow host[:port] (no path, ?query or "
                         "password); use ssh://user@host[:port]")
    if not parts.username or not names.is_name(names.SSH_USER, parts.username):
        raise ValueError(f"{value!r}: name the login user, lower-case letters, digits, '.', '_', "
                         "'-' (ssh://user@host[:port])")
    if not parts.hostname or not 0 < port < 65536:
        raise ValueError(f"{value!r}: use ssh://user@host[:port] with a port from 1 to 65535")
    return SshTarget(parts.username, names.host(parts.hostname), port)


def resolve(configured: str | None) -> str:
    """The engine a site talks to: its spec's `engine:`, else DOCKER_HOST, else the socket."""
    return configured or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def is_local(address: str) -> bool:
    """The engine runs on this host (its paths and published ports are this host's own)."""
    return address.startswith(("unix://", "npipe://"))


def ssh_target(address: str) -> SshTarget | None:
    """The user, host and port of an ssh:// address; None for any other kind."""
    return _ssh_parts(address) if address.startswith("ssh://") else None
