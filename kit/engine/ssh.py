"""A remote engine over SSH: the checks before docker-py's SSH transport, and its failures in
the operator's words.

docker-py (`docker[ssh]`) connects with paramiko, loads ~/.ssh/known_hosts and refuses a host
whose key is not there (RejectPolicy), then runs `docker system dial-stdio` on the remote for
every API connection. This module adds what it leaves out: a bounded TCP check first (paramiko
has no connect timeout there), a mapping of every paramiko failure to its cause and fix, and a
diagnosis when SSH works but the remote has no usable docker. paramiko is only needed for ssh://.
"""

import base64
import hashlib
import importlib.util
import socket
from typing import TYPE_CHECKING, Any, cast

from kit.engine.url import SshTarget
from kit.errors import BadInput, KitError

if TYPE_CHECKING:
    import paramiko

CONNECT_TIMEOUT = 10  # seconds for the TCP connection to sshd
DIAGNOSE_TIMEOUT = 5  # seconds to wait for `docker system dial-stdio` to fail on the remote
DIAL_STDIO = "docker system dial-stdio"  # what docker-py runs on the remote per connection
MAX_CONCURRENT_CALLS = 8  # per host: sshd's MaxSessions is 10 per connection by default
# The Engine API kit speaks to a remote engine (Docker 20.10 and newer): pinned, so the first
# call is the ping, whose failure is diagnosed, rather than a version query inside docker-py.
API_VERSION = "1.41"
KNOWN_HOSTS = "~/.ssh/known_hosts"


def require_paramiko() -> None:
    """docker-py's SSH transport needs paramiko, an optional dependency (`docker[ssh]`)."""
    if importlib.util.find_spec("paramiko") is None:
        raise BadInput(
            "the engine is ssh://, and docker-py's SSH transport needs paramiko, which is not "
            "installed",
            fix="python3 -m pip install 'docker[ssh]' (or reinstall kit, which depends on it)",
        )


def check_reachable(target: SshTarget) -> None:
    """sshd answers on host:port within CONNECT_TIMEOUT; KitError naming why not."""
    try:
        socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT).close()
    except OSError as error:
        raise unreachable(target, error) from None


def unreachable(target: SshTarget, error: OSError) -> KitError:
    if isinstance(error, socket.gaierror):
        why = f"the name {target.host} does not resolve"
    elif isinstance(error, TimeoutError):
        why = f"no answer within {CONNECT_TIMEOUT} s"
    elif isinstance(error, ConnectionRefusedError):
        why = f"connection refused: nothing listens on port {target.port} (sshd stopped?)"
    else:
        why = error.strerror or str(error)
    return KitError(
        f"cannot reach the SSH server of the engine at {target}: {why}",
        fix=f"check that {target.host} is up and sshd listens on port {target.port} "
        f"(`ssh -p {target.port} {target.user}@{target.host} true`), or fix engine: in the spec",
    )


def explain(error: BaseException, target: SshTarget, doing: str) -> KitError | None:
    """A paramiko (or socket) failure while `doing` → KitError/BadInput; None if not one."""
    name, module = type(error).__name__, type(error).__module__
    text = str(error)
    # an OSError of the socket itself; requests' and docker-py's errors are OSErrors too
    socket_error = isinstance(error, OSError) and module in ("builtins", "socket")
    if not module.startswith("paramiko") and not socket_error:
        return None
    if name == "BadHostKeyException":
        error = cast("paramiko.BadHostKeyException", error)  # paramiko is imported only on use
        return BadInput(
            f"the host key of {target.known_hosts_name} CHANGED: the server offers "
            f"{fingerprint(error.key)} but {KNOWN_HOSTS} has {fingerprint(error.expected_key)}; "
            "kit refuses to connect (this is what a man-in-the-middle looks like)",
            fix=f"if the server's key was really replaced, confirm the new fingerprint on the "
            f"server (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
            f"`ssh-keygen -R '{target.known_hosts_name}'` and `{target.keyscan} >> {KNOWN_HOSTS}`",
        )
    if "not found in known_hosts" in text:
        return BadInput(
            f"{target.known_hosts_name} is not in {KNOWN_HOSTS}: kit only talks to an engine "
            "whose SSH host key you have accepted",
            fix=f"review the key and add it: `{target.keyscan}` — compare its fingerprint with "
            f"the server's (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
            f"`{target.keyscan} >> {KNOWN_HOSTS}`",
        )
    if name in ("AuthenticationException", "BadAuthenticationType",
                "PartialAuthentication") or "No authentication methods available" in text:
        return BadInput(
            f"{target.host} refused the SSH login of {target.user} ({text or name})",
            fix=f"load a key that {target.user}@{target.host} accepts into ssh-agent or "
            "~/.ssh/id_ed25519 (or IdentityFile in ~/.ssh/config), and add its .pub to "
            f"~{target.user}/.ssh/authorized_keys there",
        )
    if name == "ChannelException" or "Administratively prohibited" in text:
        return KitError(
            f"the SSH server of {target} refused another session while {doing} ({text}): its "
            f"MaxSessions is below kit's {MAX_CONCURRENT_CALLS} concurrent API calls, or other "
            "clients share the connection",
            fix=f"set MaxSessions {MAX_CONCURRENT_CALLS + 2} (or more) in the server's "
            "sshd_config and reload sshd, then run this again",
        )
    if socket_error or name in ("NoValidConnectionsError", "ProxyCommandFailure"):
        return unreachable(target, error if isinstance(error, OSError) else OSError(text))
    return KitError(
        f"SSH to the engine at {target} failed while {doing}: {text or name}",
        fix=f"try `ssh -p {target.port} {target.user}@{target.host} {DIAL_STDIO}` to see why",
    )


def fingerprint(key: Any) -> str:
    """A paramiko key as OpenSSH prints it: SHA256:base64 (no padding)."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


def no_docker(ssh_client: Any, target: SshTarget, cause: str) -> KitError:
    """SSH works but the API does not answer: run dial-stdio once more and report its stderr."""
    try:
        channel = ssh_client.get_transport().open_session(timeout=DIAGNOSE_TIMEOUT)
        channel.settimeout(DIAGNOSE_TIMEOUT)
        channel.exec_command(DIAL_STDIO)
        channel.shutdown_write()
        said = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
        status = channel.recv_exit_status()
        channel.close()
    except Exception as error:  # the diagnosis must never hide the first failure
        said, status = f"(no diagnosis: {error})", -1
    what = ("docker is not installed there (or not on the PATH of a non-interactive login)"
            if status == 127 else f"`{DIAL_STDIO}` there fails: {said or cause}")
    return KitError(
        f"SSH to {target} works, but no Docker engine answers through it: {what}",
        fix=f"install Docker on {target.host}, start dockerd, and let {target.user} use it "
        f"(usermod -aG docker {target.user}); check with `ssh -p {target.port} "
        f"{target.user}@{target.host} docker version`",
    )
