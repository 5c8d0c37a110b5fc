"""Run the host's real nginx on a rendered nginx/ folder, laid out as in the container.

A private mount namespace (unshare -m, as root) puts the folder at /etc/nginx/kit (or, for the
verifier, nginx/verifier and nginx/auth where its container has them), the njs module
at /etc/nginx/modules, an `nginx` user in /etc/passwd, the upstream service names in /etc/hosts
and fresh tmpfs at /run and /var/cache/nginx — so the rendered config is checked unmodified and
nothing on the host changes.
"""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kit.desired import VERIFIER_SERVICE
from kit.layout import NGINX_MOUNT, VERIFIER_AUTH_MOUNT, VERIFIER_MOUNT

MODULES = Path("/usr/lib/nginx/modules")
LISTEN_ADDRESS = re.compile(r"^\s*listen (\d+\.\d+\.\d+\.\d+):\d+", re.MULTILINE)


def available() -> str | None:
    """Why the harness cannot run here (None when it can)."""
    if shutil.which("nginx") is None:
        return "nginx is not installed (apt-get install nginx-light libnginx-mod-http-js)"
    if not (MODULES / "ngx_http_js_module.so").exists():
        return "the njs module is missing (apt-get install libnginx-mod-http-js)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    if shutil.which("ip") is None:
        return "ip (iproute2) is missing"
    return None


def namespace_script(
    mounts: dict[str, Path], hostnames: list[str], command: str, work: Path
) -> str:
    """A shell script that binds each source at its target (under /etc/nginx), then runs."""
    passwd = Path("/etc/passwd").read_text()
    group = Path("/etc/group").read_text()
    if "\nnginx:" not in "\n" + passwd:
        passwd += "nginx:x:101:101:nginx:/nonexistent:/usr/sbin/nologin\n"
    if "\nnginx:" not in "\n" + group:
        group += "nginx:x:101:\n"
    (work / "passwd").write_text(passwd)
    (work / "group").write_text(group)
    hosts = Path("/etc/hosts").read_text() + "".join(f"127.0.0.1 {h}\n" for h in hostnames)
    (work / "hosts").write_text(hosts)
    binds = "".join(
        f"mkdir -p {target}\nmount --bind {source} {target}\n" for target, source in mounts.items()
    )
    return f"""set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /etc/nginx
mkdir /etc/nginx/modules
mount --bind {MODULES} /etc/nginx/modules
{binds}
mount --bind {work}/passwd /etc/passwd
mount --bind {work}/group /etc/group
mount --bind {work}/hosts /etc/hosts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/cache
mkdir -p /var/cache/nginx
{command}
"""


def nginx_t(nginx_dir: Path, hostnames: list[str]) -> subprocess.CompletedProcess:
    """`nginx -t` of <nginx_dir>/nginx.conf as it would run in the front door's container.

    The verifier's name always resolves (every site has it); `hostnames` are the vLLM services.
    """
    return _run_t({NGINX_MOUNT: nginx_dir.resolve()}, [VERIFIER_SERVICE, *hostnames], NGINX_MOUNT)


def verifier_t(nginx_dir: Path) -> subprocess.CompletedProcess:
    """`nginx -t` of <nginx_dir>/verifier/nginx.conf as it would run in the verifier container."""
    mounts = {VERIFIER_MOUNT: (nginx_dir / "verifier").resolve(),
              VERIFIER_AUTH_MOUNT: (nginx_dir / "auth").resolve()}
    return _run_t(mounts, [], VERIFIER_MOUNT)


def _run_t(
    mounts: dict[str, Path], hostnames: list[str], conf_dir: str
) -> subprocess.CompletedProcess:
    """`nginx -t` binds its listeners: in a network namespace of its own that has every IPv4
    address the config listens on (the container has them on its interfaces: the front door's
    fixed metrics address), so the host's ports and addresses play no part."""
    config = (mounts[conf_dir] / "nginx.conf").read_text()
    addresses = sorted(set(LISTEN_ADDRESS.findall(config)))
    network = "ip link set lo up\n" + "".join(
        f"ip addr add {address}/32 dev lo\n" for address in addresses)
    command = f"{network}nginx -t -c {conf_dir}/nginx.conf"
    with tempfile.TemporaryDirectory() as work:
        script = namespace_script(mounts, hostnames, command, Path(work))
        return subprocess.run(
            ["unshare", "-m", "-n", "sh", "-c", script], capture_output=True, text=True,
            timeout=60,
        )


def serve_verifier(nginx_dir: Path, client: str) -> subprocess.CompletedProcess:
    """The rendered verifier served by the host's nginx, `client` (shell) run against it, then
    nginx stopped — in private mount and network namespaces, so no host port is taken."""
    mounts = {VERIFIER_MOUNT: (nginx_dir / "verifier").resolve(),
              VERIFIER_AUTH_MOUNT: (nginx_dir / "auth").resolve()}
    command = (f"ip link set lo up\nnginx -c {VERIFIER_MOUNT}/nginx.conf\n"
               f"set +e\n{client}\nstatus=$?\nkill $(cat /run/nginx.pid)\nexit $status")
    with tempfile.TemporaryDirectory() as work:
        script = namespace_script(mounts, [], command, Path(work))
        return subprocess.run(["unshare", "-m", "-n", "sh", "-c", script], capture_output=True,
                              text=True, timeout=120)
