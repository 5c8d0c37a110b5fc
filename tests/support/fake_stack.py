"""Stacks on the fake engine (tests/support/fake_engine.py): a small compose document of the
shape kit renders (no site), its desired state and folder, converging it with kit's executor,
and `kit up` of a site on a remote (fake) engine."""

from pathlib import Path

from kit.converge.apply import Executor
from kit.converge.reconcile import up_actions
from kit.engine.desired import DesiredState, parse_compose
from kit.engine.observe import observe
from kit.render.site_files import render_site
from kit.site import Site
from kit.stack.up import up_site
from tests.support.fake_engine import FakeEngine
from tests.support.sites import write_site

HEALTH = {"test": ["CMD", "true"], "interval": "1s", "start_period": "60s"}
IMAGES = {"vllm:1": "sha256:vllm1", "nginx:1": "sha256:nginx1"}
REMOTE_ENGINE = "ssh://ops@gpu01.test.internal:2222"


def compose(
    *,
    seqs: int = 8,
    internal: bool = True,
    backends: tuple[str, ...] = ("a", "b"),
    certbot: bool = False,
    https_port: int = 8443,
    own_networks: bool = False,
) -> dict:
    """The shape kit renders: GPU backends on an internal network, nginx in front of them
    (publishing 127.0.0.1:`https_port`); `own_networks`: each backend on its own network
    (`backend-<name>`, as kit renders now), nginx on all of them."""
    own = {name: f"backend-{name}" for name in backends} if own_networks else {}
    services: dict = {
        name: {
            "image": "vllm:1",
            "entrypoint": ["vllm", "serve"],
            "command": ["/models/m", "--max-num-seqs", str(seqs if name == "a" else 8)],
            "volumes": [{"type": "volume", "source": "cache", "target": "/cache"}],
            "deploy": {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": [str(i)], "capabilities": ["gpu"]}
            ]}}},
            "healthcheck": HEALTH,
            "networks": [own.get(name, "backend")],
        }
        for i, name in enumerate(backends)
    }
    services["nginx"] = {
        "image": "nginx:1",
        "command": ["nginx", "-c", "/etc/nginx/kit/nginx.conf"],
        "ports": [f"127.0.0.1:{https_port}:443"],
        "volumes": [{"type": "bind", "source": "../nginx", "target": "/etc/nginx/kit",
                     "read_only": True}],
        "depends_on": {name: {"condition": "service_healthy"} for name in backends},
        "healthcheck": HEALTH,
        "networks": ["backend", *own.values(), "frontend"],
    }
    if certbot:  # acme mode: a renewal loop that starts once nginx answers
        services["certbot"] = {
            "image": "certbot:1",
            "entrypoint": ["/bin/sh", "-c"],
            "command": ["renew loop"],
            "depends_on": {"nginx": {"condition": "service_healthy"}},
            "networks": ["frontend"],
        }
    return {
        "services": services,
        "networks": {"backend": {"internal": internal},
                     **{network: {"internal": internal} for network in own.values()},
                     "frontend": {}},
        "volumes": {"cache": {}},
    }


def stack_folder(root: Path) -> Path:
    """A folder with the proxy's mounted config, for compose()'s document."""
    (root / "nginx").mkdir()
    (root / "nginx" / "nginx.conf").write_text("events {}\n")
    return root


def desired_state(site: Path, **options) -> DesiredState:
    """compose(**options) as the desired state of project `p` in the folder `site`."""
    return parse_compose(compose(**options), "p", site / "compose" / "docker-compose.yml", site)


def converge(engine: FakeEngine, desired: DesiredState, applied: Path) -> list[str]:
    """Run kit up's plan on the fake; the actions as reported. Waits make the services healthy."""
    reported: list[str] = []

    def wait(services) -> None:
        for service in services:
            engine.set_health(service.container_name, "healthy")

    observed = observe(engine, desired.project, tuple(IMAGES), applied)
    Executor(engine, applied, wait=wait, report=reported.append).run(up_actions(desired, observed))
    return reported


def rendered(spec: Path) -> DesiredState:
    """The site of `spec` rendered: its desired state."""
    site = Site.load(spec)
    render_site(site)
    return site.desired


def remote_site(tmp_path: Path) -> Site:
    """tests/support/sites.py's two-service site on a remote engine (REMOTE_ENGINE)."""
    spec = write_site(tmp_path)
    spec.write_text(spec.read_text() + f"engine: {REMOTE_ENGINE}\n")
    return Site.load(spec)


def up(site: Site, engine: FakeEngine) -> list[str]:
    """`kit up` of `site` on `engine`, without the gate; what it reported and warned."""
    reported: list[str] = []
    up_site(site, timeout=5, probe=False, report=reported.append, warn=reported.append,
            connect=lambda: engine)
    return reported
