"""The gate over a running site, as `kit probe` and `kit up` run it: the front door's checks,
each replica of a multi-replica service on its own, the services asleep (idle_sleep) sent no
completion, and a failed wake counted as a failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kit.converge.sleep import asleep_services, failed_wakes
from kit.engine.docker_api import connect as connect_to
from kit.front_door.gate import run_probe
from kit.front_door.replica_check import replica_checks

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.front_door.gate import ProbeResult
    from kit.site import Site


def probe_site(site: Site, connect: Callable[[], Engine] | None = None, *,
               address: str | None = None, timeout: float = 30) -> ProbeResult:
    """Every check of the gate against `site` (its engine through `connect`, by default the
    site's own); the result is kept in .kit/last-probe.json."""
    engine = connect or (lambda: connect_to(site.engine_url))
    asleep = asleep_services(site, engine)  # never woken by a probe
    return run_probe(site.spec, site.layout, address=address, timeout=timeout, asleep=asleep,
                     replicas=lambda: replica_checks(site, engine, asleep)
                     + failed_wakes(site, engine))
