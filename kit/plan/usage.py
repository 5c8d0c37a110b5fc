"""The usage ledger as planned (docs/usage.md): its switch, bounds and chargeback rate from the
spec, and the names, mounts and ports the front door, the collector and kit share.

Where each part lives, by need: nginx appends one line per request to a spool file in the
`usage-spool` volume (no per-request write: a buffer flushed each second); the collector
(`usage-ledger`, kit's kit/dataplane/collector/usage_ledger.py with the vLLM image's python3) is the
only one that mounts `usage-ledger`, where the hash-chained records are, so the door cannot rewrite
them. The collector sits on the internal metrics network only (the door, Prometheus and Grafana): no
vLLM replica, whose model code may be hostile, can reach it or read who used what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit import names

if TYPE_CHECKING:
    from kit.spec.model import Spec

USAGE_SERVICE = "usage-ledger"  # the compose service of the collector
SPOOL_VOLUME = "usage-spool"
LEDGER_VOLUME = "usage-ledger"
DOOR_SPOOL_MOUNT = "/var/log/kit-usage"  # the spool volume in the front door (nginx writes)
SPOOL_FILE = "door.jsonl"
# Beside the spool: each credential's tokens of the current UTC day and month, written by the
# collector, read by nginx to seed its budget windows after a restart (docs/policy.md).
BUDGET_SEED_FILE = "budget-seed.json"
COLLECTOR_SPOOL_MOUNT = "/var/lib/kit-usage/spool"  # the same volume in the collector
LEDGER_MOUNT = "/var/lib/kit-usage/ledger"  # segments/, pruned.jsonl, state.json
SEGMENTS_DIR = "segments"
PRUNED_FILE = "pruned.jsonl"
STATE_FILE = "state.json"
SCRIPT_MOUNT = "/opt/kit-usage"  # the site folder usage/ inside the collector
SCRIPT = "usage_ledger.py"
# Every model name the door routes, adapters' too, in the site's compose/usage-models/ (bound at
# kit.layout.USAGE_MODELS_MOUNT): a file the collector re-reads when it changes, not an
# argument, so `kit adapters add` recreates no container.
MODELS_FILE = "models.json"
USAGE_PORT = 9312  # the collector's /health and /metrics, on the metrics network only
USAGE_JOB = "usage"  # Prometheus's job name of the collector's figures
# The collector's /health asked inside its container and printed: its compose healthcheck (a
# failed request fails it) and `kit status` (which reads the answer) run the same command.
HEALTH_URL = f"http://127.0.0.1:{USAGE_PORT}/health"  # inside the collector's container or pod
HEALTH_ARGV = [
    "python3", "-c",
    "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
    f"{HEALTH_URL!r}, timeout=4).read().decode())",
]


@dataclass(frozen=True)
class UsagePlan:
    retention_days: int
    max_bytes: int
    gpu_hour_cost: float | None  # per GPU-hour, in the operator's currency; None: no chargeback
    # the collector's windows (--aggregate-seconds, --grace); None: the collector's defaults
    aggregate_seconds: int | None = None  # refusals and nobody's requests, counted per address
    lost_after_seconds: int | None = None  # a missing door record's wait before it is lost


def usage_plan(spec: Spec) -> UsagePlan | None:
    """What `usage:` asks for; None when the ledger is off (nothing of it is rendered then)."""
    usage = spec.usage
    if not usage.enabled:
        return None
    return UsagePlan(
        retention_days=usage.retention_days,
        max_bytes=names.size_bytes(usage.max_disk),
        gpu_hour_cost=usage.gpu_hour_cost,
        aggregate_seconds=usage.aggregate_seconds,
        lost_after_seconds=usage.lost_after_seconds,
    )
