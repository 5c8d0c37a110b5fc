"""Run a real nginx >= 1.25.1 on a rendered nginx/ folder, laid out as in the container.

The nginx is Debian 13's (1.26.3 + njs 0.8.9, what the spec's nginx:1.27-alpine test image is
made of), run by chroot in the root filesystem tests/images/build.sh caches (unpacked once here):
kit renders `http2 on;`, which Debian 12's host nginx 1.22 does not know, and a chroot keeps the
check as fast as the host binary was, with no Docker engine. A private mount namespace
(unshare -m, as root) puts the folder at /etc/nginx/kit (or, for the verifier, nginx/verifier and
nginx/auth where its container has them), the njs module at /etc/nginx/modules, the upstream
service names in /etc/hosts and fresh tmpfs at /run, /var/cache/nginx and /var/log (with the usage
spool's folder, where the container has its volume) — so the rendered config is checked
unmodified and nothing on the host changes.
"""

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kit.engine.desired import VERIFIER_SERVICE
from kit.layout import NGINX_MOUNT, VERIFIER_AUTH_MOUNT, VERIFIER_MOUNT

MODULES = "/usr/lib/nginx/modules"
LISTEN_ADDRESS = re.compile(r"^\s*listen (\d+\.\d+\.\d+\.\d+):\d+", re.MULTILINE)
CACHE = Path(os.environ.get("KIT_TEST_CACHE", "/var/cache/kit-test"))
ROOTFS_TARBALLS = "nginx-trixie-rootfs-*.tar"  # tests/images/build.sh's nginx root filesystem
USAGE_SPOOL_DIR = "/var/log/kit-usage"  # the usage-spool volume in the front door's container
FAKETIME_LIBRARY = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's libfaketime, any arch


def nginx_root() -> Path | None:
    """The nginx root filesystem unpacked from build.sh's newest cached tarball (None when
    there is none); unpacked once per tarball, under a lock, by an atomic rename."""
    tarballs = sorted(CACHE.glob(ROOTFS_TARBALLS), key=lambda p: p.stat().st_mtime)
    if not tarballs:
        return None
    root = tarballs[-1].with_name(tarballs[-1].stem.replace("-rootfs-", "-root-"))
    if (root / "usr/sbin/nginx").exists():
        return root
    with open(CACHE / "nginx-root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "usr/sbin/nginx").exists():
            partial = root.with_name(root.name + ".part")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            subprocess.run(["tar", "-C", str(partial), "-xf", str(tarballs[-1])], check=True)
            (partial / "etc/hosts").touch()  # a mount point for the test's own hosts file
            partial.rename(root)
            for old in CACHE.glob("nginx-trixie-root-*"):  # of tarballs build.sh replaced
                if old != root:
                    shutil.rmtree(old, ignore_errors=True)
    return root


def available() -> str | None:
    """Why the harness cannot run here (None when it can)."""
    root = nginx_root()
    if root is None:
        return (f"no nginx root filesystem under {CACHE} (run tests/images/build.sh, "
                "which caches Debian 13's nginx + njs there)")
    if not (root / MODULES.lstrip("/") / "ngx_http_js_module.so").exists():
        return f"the njs module is missing in {root}"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    if shutil.which("ip") is None:
        return "ip (iproute2) is missing"
    return None


def shifted_clock(offset_s: int) -> tuple[str, str, str]:
    """nginx with its wall clock `offset_s` seconds ahead, by Debian's libfaketime (installed by
    scripts/test.sh; policy.js reads the time as Date.now(), the system's clock): (the setup that
    copies the host's library into the namespace's /run, the `env` prefix of the chrooted nginx,
    the `-g` directive that keeps FAKETIME for its workers, which drop the environment). Timers
    keep the real monotonic clock."""
    libraries = sorted(Path("/").glob(FAKETIME_LIBRARY.lstrip("/")))
    assert libraries, (f"no {FAKETIME_LIBRARY}: install Debian's libfaketime "
                       "(scripts/test.sh does)")
    root = nginx_root()
    return (f"cp {libraries[0]} {root}/run/libfaketime.so.1",
            f"env LD_PRELOAD=/run/libfaketime.so.1 FAKETIME={offset_s:+d} DONT_FAKE_MONOTONIC=1 ",
            "env FAKETIME;")


def namespace_script(
    mounts: dict[str, Path], hostnames: list[str], setup: str, nginx_args: str, work: Path,
    after: str = "", prefix: str = "", addresses: dict[str, str] | None = None,
) -> str:
    """A shell script that binds each source at its target (under /etc/nginx) in the nginx root
    filesystem (whose passwd has the image's `nginx` user), runs `setup` (host commands, e.g.
    `ip`, in the same namespaces), then `<prefix>nginx <nginx_args>` chrooted there, then `after`
    (host commands again, e.g. a client of the nginx that daemonized). Each of `hostnames`
    resolves to 127.0.0.1, or to its own loopback address in `addresses`."""
    root = nginx_root()
    assert root is not None, available()
    hosts = "127.0.0.1 localhost\n" + "".join(
        f"{(addresses or {}).get(h, '127.0.0.1')} {h}\n" for h in hostnames)
    (work / "hosts").write_text(hosts)
    binds = "".join(
        f"mkdir -p {root}{target}\nmount --bind {source} {root}{target}\n"
        for target, source in mounts.items()
    )
    return f"""set -e
mount --make-rprivate /
mount -t tmpfs tmpfs {root}/etc/nginx
mkdir {root}/etc/nginx/modules
mount --bind {root}{MODULES} {root}/etc/nginx/modules
mount -t tmpfs tmpfs {root}/var/log
mkdir -p {root}/var/log/nginx {root}{USAGE_SPOOL_DIR}
{binds}
mount --bind {work}/hosts {root}/etc/hosts
mount -t tmpfs tmpfs {root}/run
mount -t tmpfs tmpfs {root}/var/cache
mkdir -p {root}/var/cache/nginx
mount --bind /dev {root}/dev
mount --bind /proc {root}/proc
{setup}
chroot {root} {prefix}nginx {nginx_args}
{after}"""


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
    with tempfile.TemporaryDirectory() as work:
        script = namespace_script(mounts, hostnames, network, f"-t -c {conf_dir}/nginx.conf",
                                  Path(work))
        return subprocess.run(
            ["unshare", "-m", "-n", "sh", "-c", script], capture_output=True, text=True,
            timeout=60,
        )


def serve_verifier(nginx_dir: Path, client: str) -> subprocess.CompletedProcess:
    """The rendered verifier served by the chrooted nginx, `client` (shell) run against it, then
    nginx stopped — in private mount and network namespaces, so no host port is taken."""
    mounts = {VERIFIER_MOUNT: (nginx_dir / "verifier").resolve(),
              VERIFIER_AUTH_MOUNT: (nginx_dir / "auth").resolve()}
    root = nginx_root()
    assert root is not None, available()
    after = f"set +e\n{client}\nstatus=$?\nkill $(cat {root}/run/nginx.pid)\nexit $status"
    with tempfile.TemporaryDirectory() as work:
        script = namespace_script(mounts, [], "ip link set lo up",
                                  f"-c {VERIFIER_MOUNT}/nginx.conf", Path(work), after)
        return subprocess.run(["unshare", "-m", "-n", "sh", "-c", script], capture_output=True,
                              text=True, timeout=120)
