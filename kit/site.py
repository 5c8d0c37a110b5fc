"""A site as every verb sees it: the spec loaded once, the folder it renders into, and the
desired state read from the rendered compose file when a verb first needs it.

Verbs build one `Site` and hand it to one core call; no module below the CLI loads the spec again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from kit.engine import url as engine_url
from kit.engine.desired import PROXY_SERVICE, DesiredState, load_desired
from kit.engine.door_ports import EVERY_ADDRESS, PortAnswer
from kit.layout import SiteLayout
from kit.plan.host import load_spec
from kit.spec.model import Spec

if TYPE_CHECKING:  # docker-py loads only for the verbs that talk to the engine
    from kit.engine.docker_api import Engine
    from kit.engine.observe import ObservedState


@dataclass(frozen=True)
class Site:
    spec: Spec
    spec_path: Path
    layout: SiteLayout

    @classmethod
    def load(cls, spec_path: Path, *, out: Path | None = None, check_host: bool = True,
             check_capacity: bool = True) -> Site:
        """Validate the spec at `spec_path`; the site folder is `out` or the spec's folder.

        `check_host=False` skips the model-directory checks, for verbs that only talk to the
        engine or the front door (the model folders are vLLM's concern by then);
        `check_capacity=False` leaves services that do not fit their GPUs to `kit plan`.
        """
        spec = load_spec(spec_path, check_host=check_host, check_capacity=check_capacity)
        return cls(spec, spec_path, SiteLayout(out or spec_path.parent))

    @property
    def project(self) -> str:
        return self.spec.site

    @property
    def engine_url(self) -> str:
        """The engine this site runs on: its `engine:`, else DOCKER_HOST, else the socket."""
        return engine_url.resolve(self.spec.engine)

    @cached_property
    def desired(self) -> DesiredState:
        """What the rendered compose file asks for (read on first use, then kept)."""
        return desired_for(self.spec, self.layout)

    def observe(self, engine: Engine, *, with_images: bool = True,
                knock: bool = False) -> ObservedState:
        """The running stack; `with_images` also resolves the desired images' ids, `knock`
        also asks whether the running front door's published ports answer
        (kit/engine/door_ports.py)."""
        from kit.engine.observe import observe

        images = tuple(s.config.image for s in self.desired.services) if with_images else ()
        observed = observe(engine, self.project, images, self.layout.applied)
        proxies = [c for c in observed.of(PROXY_SERVICE) if c.running] if knock else []
        if not proxies:
            return observed
        ports = tuple(port for proxy in proxies for port in proxy.host_ports)
        return replace(observed, door=door_answers(self.spec, engine, ports))


def desired_for(spec: Spec, layout: SiteLayout) -> DesiredState:
    """The rendered compose file as the site's engine is given it: on a remote engine, site
    folders are volumes kit fills through the API (kit/engine/remote_files.py), not binds."""
    desired = load_desired(layout, spec.site)
    if engine_url.is_local(engine_url.resolve(spec.engine)):
        return desired
    from kit.engine.remote_files import through_engine

    return through_engine(desired, layout.root)


def door_answers(spec: Spec, engine: Engine, host_ports: tuple[tuple[str, int], ...]
                 ) -> tuple[PortAnswer, ...]:
    """Knock on each port the running front door publishes, where a client reaches it (a port
    bound to every address: this host's loopback for a local engine, else the domain), asking
    `engine` (kit/engine/docker_api.py's `knock`, a test's fake)."""
    answers: list[PortAnswer] = []
    for host_ip, port in dict.fromkeys(host_ports):
        address = front_door_host(spec) if host_ip in EVERY_ADDRESS else host_ip
        tls = port == spec.proxy.https_port
        if any((a.address, a.port) == (address, port) for a in answers):
            continue  # 0.0.0.0 and :: are one door seen from here
        problem = engine.knock(address, port, spec.domain if tls else None)
        answers.append(PortAnswer(address, port, tls, problem, engine.is_local))
    return tuple(answers)


def front_door_host(spec: Spec) -> str:
    """Where a front door listening on every address is reached: this host's loopback when the
    engine is local, else the spec's domain (it names the remote host; `--address` overrides)."""
    return "127.0.0.1" if engine_url.is_local(engine_url.resolve(spec.engine)) else spec.domain
