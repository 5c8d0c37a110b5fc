"""**Owner of the usage ledger's health as kit reports it.** It is one document: the collector's own
account of itself (`Collector.health()` in kit/dataplane/collector/usage_ledger.py: records, rate,
lag, lost and unreadable records, disk, and the chain's head `last_seq`/`last_hash`). The collector
keeps it in two places, and kit asks each for what only it can answer:

- `running_health`: the running collector's /health, asked inside its container
  (`HEALTH_ARGV`, the command its compose healthcheck runs). The figures as they are now, so
  `kit status` shows it: is the ledger recording?
- `LedgerReader.saved_health` (kit/usage/ledger.py): state.json in the ledger's volume, the same
  document as the collector last saved it, read through `docker cp` so a stopped collector
  answers too. It is saved only after the segment lines it covers are fsynced, so its head is
  in the chain: `kit audit verify` checks that head, and `open_ledger` takes a missing state.json
  as "nothing written yet" (what `kit usage` and `kit audit` refuse with the fix).

Both are read by `parse_health` into one `CollectorHealth`, so the two can only differ by when
they were taken, never by how kit reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.errors import KitError
from kit.plan.usage import HEALTH_ARGV, STATE_FILE, USAGE_SERVICE

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.engine.observe import ContainerState

ASKED = "/health"  # CollectorHealth.source: asked of the running collector
SAVED = STATE_FILE  # ... read from its last save


@dataclass(frozen=True)
class CollectorHealth:
    """The collector's account (None when it could not be had, and `problem` says why), and
    where it came from (`ASKED` or `SAVED`)."""

    document: dict | None
    source: str
    problem: str | None = None

    @property
    def head(self) -> tuple[int, str] | None:
        """(last_seq, last_hash): the last record the collector wrote; None before the first
        record or when the document does not say it plainly."""
        if self.document is None:
            return None
        seq, hash_ = self.document.get("last_seq"), self.document.get("last_hash")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1 or not isinstance(
                hash_, str):
            return None
        return seq, hash_


def parse_health(text: str | bytes, source: str) -> CollectorHealth:
    """The one reading of the collector's document, wherever it was kept: a JSON object, or the
    problem that it is not."""
    try:
        document = json.loads(text)
    except ValueError as error:
        return CollectorHealth(None, source, f"the collector's {source} is unreadable: not JSON "
                                             f"({error})")
    if not isinstance(document, dict):
        return CollectorHealth(None, source, f"the collector's {source} is unreadable: not a "
                                             "JSON object")
    return CollectorHealth(document, source)


def running_health(engine: Engine, containers: tuple[ContainerState, ...]) -> CollectorHealth:
    """Ask the running collector among `containers`; a stopped or missing one, or an answer
    that is not its document, is the problem instead."""
    running = [c for c in containers if c.service == USAGE_SERVICE and c.running]
    if not running:
        return CollectorHealth(None, ASKED, f"no {USAGE_SERVICE} container runs")
    try:
        code, output = engine.exec(running[0].id, HEALTH_ARGV)
    except KitError as error:
        return CollectorHealth(None, ASKED, f"the engine could not ask it: {error.message}")
    if code != 0:
        return CollectorHealth(None, ASKED, f"it did not answer {ASKED} (exit {code}): "
                                            f"{output.strip()[-200:]}")
    return parse_health(output, ASKED)
