"""The waker's rendered parts (docs/sleep.md): what the compose file and nginx.conf lay out for it
(`waker` in the templates) and its script, a site file. Nothing when no service has idle_sleep."""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from kit.engine.desired import WAKER_SERVICE
from kit.files import Output
from kit.layout import PROBE_USER
from kit.plan.build import VLLM_PORT
from kit.plan.waker import HEALTH_ARGV, SCRIPT, SCRIPT_MOUNT, WAKE_TIMEOUT_S, WAKER_PORT

if TYPE_CHECKING:
    from kit.layout import SiteLayout
    from kit.plan.build import Plan


def waker_facts(plan: Plan) -> dict | None:
    """What the templates lay out for the waker; None without idle_sleep."""
    waker = plan.waker
    if waker is None:
        return None
    return {
        "service": WAKER_SERVICE,
        "image": plan.services[0].image,
        "address": waker.address,
        "port": WAKER_PORT,
        "script_mount": SCRIPT_MOUNT,
        "command": [f"{SCRIPT_MOUNT}/{SCRIPT}", "--config", waker.config(VLLM_PORT)],
        "health": ["CMD", *HEALTH_ARGV],
        "services": waker.names(),
        # it reaches the replicas of its services on their own networks, and no other's
        "networks": [svc.network for svc in plan.services if svc.name in waker.names()],
        "probe_user": PROBE_USER,
        "read_timeout": WAKE_TIMEOUT_S + 10,  # the waker answers every held request before
    }


def waker_files(plan: Plan, layout: SiteLayout) -> list[Output]:
    """The waker's script, beside the compose file (none without idle_sleep)."""
    if plan.waker is None:
        return []
    script = resources.files("kit.dataplane.waker").joinpath(SCRIPT).read_bytes()
    return [Output(layout.waker_dir / SCRIPT, script)]
