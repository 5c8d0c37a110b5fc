"""The usage ledger's rendered parts: what the compose file and nginx.conf lay out for it (`usage`
in the templates) and the collector's script, a site file (docs/usage.md)."""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING

from kit.files import Output
from kit.layout import USAGE_MODELS_MOUNT
from kit.names import DOOR_ROUTES, OPENAI_ROUTES
from kit.plan.usage import (
    BUDGET_SEED_FILE,
    COLLECTOR_SPOOL_MOUNT,
    DOOR_SPOOL_MOUNT,
    HEALTH_ARGV,
    LEDGER_MOUNT,
    LEDGER_VOLUME,
    MODELS_FILE,
    SCRIPT,
    SCRIPT_MOUNT,
    SPOOL_FILE,
    SPOOL_VOLUME,
    USAGE_PORT,
    USAGE_SERVICE,
)

if TYPE_CHECKING:
    from kit.layout import SiteLayout
    from kit.plan.build import Plan


def ledger_routes() -> list[str]:
    """The paths a record may name (any other is recorded as "other"): the door's routes; one
    with a `{name}` part (`/v1/models/{model}`) is recorded as written, whatever stood there."""
    return sorted({*OPENAI_ROUTES, *DOOR_ROUTES})


def ledger_models(plan: Plan) -> bytes:
    """The model names a record may name (any other is null): every name the door routes, a
    LoRA adapter's too (docs/adapters.md); the collector's --models-file."""
    names = sorted(name for svc in plan.services for name in svc.routed_names)
    return (json.dumps(names, indent=1) + "\n").encode()


def usage_facts(plan: Plan) -> dict | None:
    """What the templates lay out for the ledger; None when it is off."""
    usage = plan.usage
    if usage is None:
        return None
    argv = [
        f"{SCRIPT_MOUNT}/{SCRIPT}",
        "--spool", f"{COLLECTOR_SPOOL_MOUNT}/{SPOOL_FILE}",
        "--ledger", LEDGER_MOUNT,
        "--retention-days", str(usage.retention_days),
        "--max-bytes", str(usage.max_bytes),
        "--port", str(USAGE_PORT),
        "--models-file", f"{USAGE_MODELS_MOUNT}/{MODELS_FILE}",
        "--routes", json.dumps(ledger_routes()),
        "--budget-seed", f"{COLLECTOR_SPOOL_MOUNT}/{BUDGET_SEED_FILE}",
        # each only when the spec sets it: the collector's default otherwise, the rendered
        # files as they were
        *(["--aggregate-seconds", str(usage.aggregate_seconds)]
          if usage.aggregate_seconds is not None else []),
        *(["--grace", str(usage.lost_after_seconds)]
          if usage.lost_after_seconds is not None else []),
    ]
    return {
        "service": USAGE_SERVICE,
        "spool_volume": SPOOL_VOLUME,
        "ledger_volume": LEDGER_VOLUME,
        "door_spool_mount": DOOR_SPOOL_MOUNT,
        "spool_file": f"{DOOR_SPOOL_MOUNT}/{SPOOL_FILE}",
        "budget_seed_file": f"{DOOR_SPOOL_MOUNT}/{BUDGET_SEED_FILE}",
        # policy.js reserves a request's worst case against its credential's budget: without a
        # max_tokens, its service's max_model_len (docs/policy.md)
        "model_lengths": " ".join(f"{svc.name}={svc.max_model_len}" for svc in plan.services),
        # usage.js asks every stream of these services usage on every chunk (the planner's
        # choice: ServicePlan.usage_every_chunk); '' renders no variable
        "every_chunk": " ".join(svc.name for svc in plan.services if svc.usage_every_chunk),
        "collector_spool_mount": COLLECTOR_SPOOL_MOUNT,
        "ledger_mount": LEDGER_MOUNT,
        "script_mount": SCRIPT_MOUNT,
        "models_mount": USAGE_MODELS_MOUNT,
        "port": USAGE_PORT,
        "image": plan.services[0].image,
        # Who may ask it (as the waker): on compose, its metrics address answers the front
        # door's only (Prometheus scrapes it through the door), loopback kit's; in a pod, the
        # door is on the pod's loopback, the only address it listens on.
        "command": [*argv, "--host", plan.metrics.usage, "--door", plan.metrics.door],
        "pod_command": [*argv, "--host", "127.0.0.1"],
        "health": ["CMD", *HEALTH_ARGV],
    }


def collector_script() -> bytes:
    """kit/dataplane/collector/usage_ledger.py as the collector runs it (a site file; a ConfigMap
    in k8s)."""
    return resources.files("kit.dataplane.collector").joinpath(SCRIPT).read_bytes()


def usage_files(plan: Plan, layout: SiteLayout) -> list[Output]:
    """The collector's script and the model names it records, beside the spec (none when the
    ledger is off)."""
    if plan.usage is None:
        return []
    return [Output(layout.usage_dir / SCRIPT, collector_script()),
            Output(layout.usage_models_dir / MODELS_FILE, ledger_models(plan))]
