"""`kit usage`: the ledger's records of a period summed by credential, model and day, and the
chargeback of GPU time.

Records are summed once into cells (who, model, day): memory grows with the credentials, models
and days seen, never with the records. Every view (any --by, the plot, the cost, a fleet) is
made from the cells.

Chargeback (`usage.gpu_hour_cost`): a service holds its GPUs for the whole period whether it
serves or idles, so its cost is GPUs × the period's hours (up to now) × the price of a GPU-hour.
That cost is shared by the tokens (prompt + completion) served by it in the period: each
credential pays its share of the tokens of each model it used. A service that served no token
has nobody to charge: its cost is shown as idle.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from kit.credentials.material import GATE_CLAIM
from kit.errors import BadInput
from kit.plan.usage import usage_plan
from kit.spec.model import Spec
from kit.table import text_table
from kit.usage.ledger import LedgerReader, open_ledger, records
from kit.usage.period import Period
from kit.usage.tables import csv_lines

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

BY_KEYS = ("who", "model", "day")
NOT_ROUTED = "-"  # a record no model served (refused at the door, unknown route)
REFUSED = "refused_"
REJECTED = "rejected"  # the service's own 4xx: a bad request, refused by the engine
FIGURES = ("requests", "completed", "aborted", "failed", "refused", "prompt_tokens",
           "completion_tokens", "tokens")
COST = ("gpu_hours", "cost", "cost_per_million_tokens")

Cell = tuple[str, str, str]  # (who, model, day)


@dataclass
class Totals:
    """What a group of records adds up to."""

    requests: int = 0
    completed: int = 0
    aborted: int = 0  # the client went away
    failed: int = 0  # the engine failed it
    refused: int = 0  # the door (auth, limits, body size, request) or the service refused it
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def count(self, record: dict) -> None:
        """One record: one request, or an aggregate's `requests` (docs/usage.md)."""
        ended = str(record.get("ended", ""))
        requests = _positive(record.get("requests", 1))
        self.requests += requests
        self.completed += requests * (ended == "completed")
        self.aborted += requests * (ended == "client_abort")
        self.failed += requests * (ended == "upstream_error")
        self.refused += requests * (ended.startswith(REFUSED) or ended == REJECTED)
        self.prompt_tokens += _positive(record.get("prompt_tokens"))
        self.completion_tokens += _positive(record.get("completion_tokens"))

    def add(self, other: Totals) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in FIGURES}


def _positive(value: object) -> int:
    """A count as a record holds it (0 when it is none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Chargeback:
    """The price of a GPU-hour and the GPUs each served model name holds."""

    gpu_hour_cost: float
    gpus: dict[str, int]  # served model name → GPUs its service holds (all nodes)


def chargeback_for(spec: Spec) -> Chargeback | None:
    """The spec's services as GPU holders, when a GPU-hour has a price (usage.gpu_hour_cost)."""
    planned = usage_plan(spec)
    price = None if planned is None else planned.gpu_hour_cost
    if price is None:
        return None
    return Chargeback(price, {
        service.api_name: len(service.gpus) * (len(service.nodes) if service.nodes else 1)
        for service in spec.services})


@dataclass(frozen=True)
class PeriodUsage:
    """A period's cells, and how to charge them."""

    period: Period
    cells: dict[Cell, Totals]
    chargeback: Chargeback | None = None
    now: datetime | None = None  # when it was read (the period's hours stop there)
    gate_checks: int = 0  # requests kit's gate made to be refused: not usage, not in the cells

    def model_costs(self) -> dict[str, float]:
        """Each service's cost over the period: GPUs × hours × the GPU-hour's price."""
        if self.chargeback is None or self.now is None:
            return {}
        hours = self.period.hours(self.now)
        return {model: gpus * hours * self.chargeback.gpu_hour_cost
                for model, gpus in self.chargeback.gpus.items()}

    def token_prices(self) -> dict[str, float]:
        """model → the cost of one token served by it in the period."""
        tokens: dict[str, int] = {}
        for (_, model, _), figures in self.cells.items():
            tokens[model] = tokens.get(model, 0) + figures.tokens
        return {model: cost / tokens[model] for model, cost in self.model_costs().items()
                if tokens.get(model)}

    def idle(self) -> dict[str, float]:
        """The cost of services that served no token in the period (nobody to charge)."""
        prices = self.token_prices()
        return {model: cost for model, cost in self.model_costs().items()
                if model not in prices and cost > 0}


def gather(ledger: LedgerReader, period: Period, chargeback: Chargeback | None,
           now: datetime) -> PeriodUsage:
    """The period's records summed into cells, read from the ledger once."""
    cells: dict[Cell, Totals] = {}
    gate_checks = Totals()
    for _, record, moment in records(ledger, period.first_day):
        if not period.holds(moment):
            continue
        if record.get("claimed") == GATE_CLAIM:
            gate_checks.count(record)
            continue
        model = record.get("model")
        cell = (str(record.get("who") or NOT_ROUTED), str(model) if model else NOT_ROUTED,
                moment.date().isoformat())
        cells.setdefault(cell, Totals()).count(record)
    return PeriodUsage(period, cells, chargeback, now, gate_checks.requests)


def site_usage(site: Site, engine: Engine, period: Period, now: datetime) -> PeriodUsage:
    """`kit usage`'s core call: the site's ledger on its engine, summed over `period`."""
    return gather(open_ledger(site, engine), period, chargeback_for(site.spec), now)


def parse_by(text: str) -> tuple[str, ...]:
    """--by: any of who, model, day, comma-separated, grouped in the order given."""
    keys = tuple(key.strip() for key in text.split(",") if key.strip())
    unknown = [key for key in keys if key not in BY_KEYS]
    if unknown or not keys or len(set(keys)) != len(keys):
        problem = (f"{', '.join(map(repr, unknown))} is not one of them" if unknown
                   else "each key once")
        raise BadInput(f"--by {text!r}: {problem}",
                       fix=f"give --by any of {', '.join(BY_KEYS)}, comma-separated "
                       "(e.g. --by who,model)")
    return keys


@dataclass
class Row:
    key: tuple[str, ...]
    figures: Totals = field(default_factory=Totals)
    cost: float | None = None

    def to_json(self, by: Sequence[str]) -> dict:
        return {**dict(zip(by, self.key, strict=True)), **self.figures.to_json(),
                **({} if self.cost is None else {"cost": round(self.cost, 6),
                                                 "cost_per_million_tokens": _per_million(self)})}


def _per_million(row: Row) -> float | None:
    if row.cost is None or not row.figures.tokens:
        return None
    return round(row.cost / row.figures.tokens * 1_000_000, 6)


def rows(usage: PeriodUsage, by: Sequence[str]) -> list[Row]:
    """The cells grouped by `by` (sorted), each with its share of the GPU cost."""
    prices = usage.token_prices() if usage.chargeback else None
    grouped: dict[tuple[str, ...], Row] = {}
    for cell, figures in usage.cells.items():
        values = dict(zip(BY_KEYS, cell, strict=True))
        key = tuple(values[name] for name in by)
        row = grouped.setdefault(key, Row(key, cost=0.0 if prices is not None else None))
        row.figures.add(figures)
        if prices is not None and row.cost is not None:
            row.cost += figures.tokens * prices.get(cell[1], 0.0)
    return [grouped[key] for key in sorted(grouped)]


def total(rows_: Iterable[Row]) -> Row:
    whole = Row(())
    for row in rows_:
        whole.figures.add(row.figures)
        if row.cost is not None:
            whole.cost = (whole.cost or 0.0) + row.cost
    return whole


# ----------------------------------------------------------------- output
# A report is one or more sections: (None, usage) for a site, (server, usage) per server of a
# fleet, which adds a SERVER column and sums the servers in one total.

Section = tuple[str | None, PeriodUsage]
HEADS = ("REQUESTS", "COMPLETED", "ABORTED", "FAILED", "REFUSED", "PROMPT", "COMPLETION",
         "TOKENS")
COST_HEADS = ("COST", "COST/M TOKENS")


def _charged(sections: Sequence[Section]) -> bool:
    return any(usage.chargeback is not None for _, usage in sections)


def _keyed(sections: Sequence[Section], by: Sequence[str]) -> list[Row]:
    """Every section's rows, the server first in each key when there is one."""
    return [Row(((server,) if server is not None else ()) + row.key, row.figures, row.cost)
            for server, usage in sections for row in rows(usage, by)]


def _columns(sections: Sequence[Section], by: Sequence[str]) -> list[str]:
    return (["server"] if sections and sections[0][0] is not None else []) + list(by)


def _cells(row: Row, charged: bool) -> list[str]:
    f = row.figures
    cells = [f"{f.requests:,}", f"{f.completed:,}", f"{f.aborted:,}", f"{f.failed:,}",
             f"{f.refused:,}", f"{f.prompt_tokens:,}", f"{f.completion_tokens:,}",
             f"{f.tokens:,}"]
    if charged:
        per_million = _per_million(row)
        cells += ["-" if row.cost is None else f"{row.cost:,.2f}",
                  "-" if per_million is None else f"{per_million:,.4f}"]
    return cells


def text(sections: Sequence[Section], by: Sequence[str]) -> str:
    """The readable report: the period, one line per group, the total, the cost notes."""
    charged = _charged(sections)
    found = _keyed(sections, by)
    columns = _columns(sections, by)
    lines = [f"usage {sections[0][1].period.describe()}"]
    if not found:
        return "\n".join([*lines, "no records in this period"])
    table = [[*(name.upper() for name in columns), *HEADS, *(COST_HEADS if charged else ())]]
    table += [[*row.key, *_cells(row, charged)] for row in found]
    table.append(["TOTAL", *[""] * (len(columns) - 1), *_cells(total(found), charged)])
    lines.append(text_table(table, len(columns)))
    checks = sum(usage.gate_checks for _, usage in sections)
    if checks:
        lines.append(f"not counted above: {checks:,} requests kit's gate made to be refused "
                     "(its checks of the door at kit up)")
    for server, usage in sections:
        lines += [f"{server}: {note}" if server is not None else note
                  for note in _charge_notes(usage)]
    return "\n".join(lines)


def _charge_notes(usage: PeriodUsage) -> list[str]:
    if usage.chargeback is None or usage.now is None:
        return []
    hours = usage.period.hours(usage.now)
    notes = [f"cost: {usage.chargeback.gpu_hour_cost:g} per GPU-hour x {hours:,.1f} h held, "
             "shared by each model's tokens"]
    notes += [f"idle (no tokens to charge): {model} {cost:,.2f}"
              for model, cost in sorted(usage.idle().items())]
    return notes


def csv_text(sections: Sequence[Section], by: Sequence[str]) -> str:
    charged = _charged(sections)
    columns = _columns(sections, by)
    header = [*columns, *FIGURES, *(("cost", "cost_per_million_tokens") if charged else ())]
    return "".join(csv_lines(header, (_csv_row(row, columns, charged)
                                      for row in _keyed(sections, by))))


def _csv_row(row: Row, columns: Sequence[str], charged: bool) -> list[object]:
    data = row.to_json(columns)
    return [data.get(key) for key in (*columns, *FIGURES)] + (
        [data.get("cost"), data.get("cost_per_million_tokens")] if charged else [])


def to_json(sections: Sequence[Section], by: Sequence[str]) -> dict:
    found = _keyed(sections, by)
    columns = _columns(sections, by)
    document: dict = {"period": sections[0][1].period.to_json(), "by": list(by),
                      "rows": [row.to_json(columns) for row in found],
                      "total": total(found).to_json(()),
                      "gate_checks": sum(usage.gate_checks for _, usage in sections)}
    charges = {server or "": _charge_json(usage) for server, usage in sections
               if usage.chargeback is not None}
    if charges:
        document["chargeback"] = charges if columns[:1] == ["server"] else charges[""]
    return document


def _charge_json(usage: PeriodUsage) -> dict:
    assert usage.chargeback is not None and usage.now is not None
    return {"gpu_hour_cost": usage.chargeback.gpu_hour_cost,
            "hours": round(usage.period.hours(usage.now), 6),
            "gpus": usage.chargeback.gpus,
            "idle_cost": {model: round(cost, 6) for model, cost in usage.idle().items()}}


def json_text(sections: Sequence[Section], by: Sequence[str]) -> str:
    return json.dumps(to_json(sections, by), indent=2)
