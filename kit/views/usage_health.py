"""The usage ledger's health as `kit status` shows it: the running collector's own account
(records, rate, lag, lost and unreadable records, disk), asked inside its container through the
engine, so a remote site answers the same way and nothing listens outside the metrics network.
How it is asked and read is kit/usage/health.py's (`running_health`), the one owner that
`kit usage` and `kit audit` read the collector's saved account through too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.usage.health import running_health

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.engine.observe import ContainerState

@dataclass(frozen=True)
class LedgerHealth:
    """The collector's /health (None when it could not be asked, and `problem` says why)."""

    health: dict | None
    problem: str | None = None

    def to_json(self) -> dict:
        if self.health is None:
            return {"ok": False, "problem": self.problem}
        h = self.health
        return {
            "ok": bool(h.get("ok")),
            "problems": list(h.get("problems") or []),
            "records": h.get("records"),
            "records_per_second": h.get("records_per_second"),
            "lag_seconds": h.get("lag_seconds"),
            "spool_pending_bytes": h.get("spool_pending_bytes"),
            "lost": (h.get("lost") or {}).get("total"),
            "unreadable_lines": (h.get("lost") or {}).get("unreadable_lines"),
            "disk": h.get("disk"),
            "disk_full_since": h.get("disk_full_since"),
        }

    def lines(self) -> list[str]:
        if self.health is None:
            return [f"usage ledger: NOT RECORDING ({self.problem}); records wait in the spool "
                    "until it runs again (kit up starts it)"]
        j = self.to_json()
        disk = j["disk"] or {}
        verdict = "ok" if j["ok"] else "PROBLEM"
        lines = [
            f"usage ledger: {verdict}, {_figure(j['records'])} records, "
            f"{_figure(j['records_per_second'])} records/s, lag {_figure(j['lag_seconds'])} s, "
            f"{_figure(j['lost'])} lost, {_figure(j['unreadable_lines'])} unreadable, "
            f"disk {_size(disk.get('ledger_bytes'))} of {_size(disk.get('max_bytes'))} "
            f"({_size(disk.get('free_bytes'))} free)",
        ]
        if j["disk_full_since"]:
            lines.append(f"  DISK FULL since {j['disk_full_since']}: the door keeps serving and "
                         f"its records wait in the spool ({_size(j['spool_pending_bytes'])}), "
                         "none lost; free space on the disk of the engine's volumes (or lower "
                         "usage.max_disk) and the collector catches up by itself")
        if isinstance(j["lost"], int) and j["lost"] > 0:
            lines.append(f"  {j['lost']:,} record{'s' if j['lost'] > 1 else ''} LOST: the door "
                         "numbered them but never wrote them to its spool (the spool's disk "
                         "full, or an nginx worker killed before its buffer was written); `kit "
                         "logs SPEC nginx` shows its write errors")
        lines += [f"  {problem}" for problem in j["problems"]]
        return lines


def _figure(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "?"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _size(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value} B"


def ledger_health(engine: Engine, containers: tuple[ContainerState, ...]) -> LedgerHealth:
    """The running collector's account; a stopped or missing one, or an unreadable answer, is
    the problem shown instead."""
    asked = running_health(engine, containers)
    return LedgerHealth(asked.document, asked.problem)
