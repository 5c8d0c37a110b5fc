"""Per-credential policy (docs/policy.md): which models a Basic user or Bearer key may use, when
it expires, its class, and its budgets.

One owner for the policy file (.kit/policy.json, 0600: it sits with the key digests) and for
what the front door reads of it (nginx/auth/door-policy.json, 0600, a JSON object the nginx
master preloads at every load or reload, so a change reaches every worker through the same
reload as a credential change). A credential is named as the door's access log names it:
`key:NAME` or `user:NAME`. Every value is checked whole before anything is written.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.errors import BadInput
from kit.layout import PROBE_USER, SiteLayout
from kit.names import SERVED_NAME, is_name
from kit.state import read_state

if TYPE_CHECKING:
    from kit.spec.model import Spec

CLASSES = ("interactive", "batch")
DEFAULT_CLASS = "interactive"
# The policy fields with a limit as a whole number, enforced at the door (docs/policy.md).
LIMITS = ("tokens_per_day", "tokens_per_month", "requests_per_minute")
BUDGETS = LIMITS[:2]  # counted in the usage ledger's tokens: they need it on
FIELDS = ("models", "expires", "class", *LIMITS)  # what `--clear` takes
MAX_LIMIT = 10**15
KINDS = ("key", "user")


def principal(kind: str, name: str) -> str:
    """A credential's name as the door logs it (auth.js `principal`, kit/dataplane/door/)."""
    return f"{kind}:{name}"


# --------------------------------------------------------------------------- checked input


def parse_models(text: str, served: Iterable[str]) -> list[str]:
    """`a,b` → the model names (served names, LoRA adapters), each one the site serves (exact,
    case-sensitive, as routed)."""
    names = [name.strip() for name in text.split(",")]
    known = sorted(set(served))
    if not text.strip() or any(not name for name in names):
        raise BadInput(f"--models {text!r} lists an empty name",
                       fix=f"list served names separated by commas, e.g. {','.join(known)}")
    for name in names:
        if not is_name(SERVED_NAME, name) or name not in known:
            raise BadInput(f"--models: the site serves no model named {name!r}",
                           fix=f"use the served names (exact case): {', '.join(known)}")
    return sorted(set(names))


# the forms --expires takes, in ASCII digits: a date, or a date and time (seconds and a
# fraction optional) with an optional offset; Python's fromisoformat takes more (2027-W01,
# 20270131, full-width digits), which a reader of the command would not read as one instant
EXPIRY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}"
                    r"(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?")
LIMIT = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only: no １０, 1_000, +10 or spaces


def parse_expiry(text: str, now: dt.datetime | None = None) -> str:
    """A date (the credential is refused from 00:00 UTC that day) or an ISO time (UTC when it
    names no offset) → the instant as `YYYY-MM-DDTHH:MM:SSZ`; refused when already past."""
    try:
        if not EXPIRY.fullmatch(text):
            raise ValueError(text)
        if len(text) == len("2027-01-31"):
            when = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.UTC)
        else:
            when = dt.datetime.fromisoformat(text)
            when = when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)
    except ValueError:
        raise BadInput(f"--expires {text!r} is not a date or time",
                       fix="give a date (2027-01-31: refused from 00:00 UTC that day) or an ISO "
                       "time (2027-01-31T18:00:00+01:00), in ASCII digits") from None
    if when <= (now or dt.datetime.now(dt.UTC)):
        raise BadInput(f"--expires {text!r} is in the past",
                       fix="give a later time; to stop a credential now, revoke or remove it")
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_limit(option: str, text: str) -> int:
    """A limit option's text as a whole number in ASCII digits, from 1 to MAX_LIMIT."""
    flag = f"--{option.replace('_', '-')}"
    if not LIMIT.fullmatch(text):
        raise BadInput(f"{flag} {text!r} is not a whole number in ASCII digits",
                       fix=f"give a whole number from 1 to {MAX_LIMIT} written 0-9 only (no "
                       "separators, signs or other scripts' digits)")
    value = int(text)
    if not 1 <= value <= MAX_LIMIT:
        raise BadInput(f"{flag} {value} is out of range",
                       fix=f"give a whole number from 1 to {MAX_LIMIT}, or --clear "
                       f"{option.replace('_', '-')} for no limit")
    return value


@dataclass(frozen=True)
class PolicyChange:
    """What one command sets (`set`) and removes (`clear`), checked against each other."""

    set: dict[str, object]
    clear: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        both = sorted(set(self.set) & set(self.clear))
        if both:
            raise BadInput(f"{', '.join(both)} is both set and cleared",
                           fix="give either the option or --clear for it, not both")

    def applied(self, entry: dict) -> dict:
        """`entry` with this change: cleared fields gone, defaults not stored."""
        new = {field: value for field, value in entry.items() if field not in self.clear}
        new.update(self.set)
        if new.get("class") == DEFAULT_CLASS:
            del new["class"]
        return new


def policy_change(spec: Spec, values: dict,
                  clear: tuple[str, ...] | None = None) -> PolicyChange:
    """A command's policy options (`values`: models, expires, klass and each of LIMITS, None
    when not given) as a checked change (exit 2 naming the option before anything is written);
    with `clear` (the `set` verbs), one that changes nothing is refused too."""
    chosen: dict[str, object] = {}
    if values["models"] is not None:
        chosen["models"] = parse_models(values["models"], spec.model_names())
    if values["expires"] is not None:
        chosen["expires"] = parse_expiry(values["expires"])
    if values["klass"] is not None:
        chosen["class"] = values["klass"]
    for limit in LIMITS:
        if values[limit] is not None:
            chosen[limit] = parse_limit(limit, values[limit])
    check_budgets_counted({"the options": chosen}, spec.usage.enabled)
    if clear is not None and not chosen and not clear:
        raise BadInput("nothing to change", fix="give a policy option (--models, --expires, "
                       "--class, --tokens-per-day, …) or --clear FIELD")
    return PolicyChange(chosen, tuple(field.replace("-", "_") for field in clear or ()))


# --------------------------------------------------------------------------- the policy file


def read_policies(layout: SiteLayout) -> dict[str, dict]:
    """`key:NAME` / `user:NAME` → its policy fields (none stored: no policy)."""
    return read_state(layout.policy_db, _parse_policies,
                      fix=f"restore it from {layout.state_dir / 'backup' / 'policy.json'}, or "
                      "delete it, which lifts every credential's policy") or {}


def _parse_policies(text: str) -> dict[str, dict]:
    policies = json.loads(text)
    if not isinstance(policies, dict):
        raise ValueError("expected a JSON object of credentials")
    for who, entry in policies.items():
        kind, _, name = who.partition(":")
        if kind not in KINDS or not name or not isinstance(entry, dict):
            raise ValueError(f"{who!r} is not key:NAME or user:NAME with an object")
        if set(entry) - set(FIELDS):
            raise ValueError(f"{who}: unknown fields {sorted(set(entry) - set(FIELDS))}")
        models = entry.get("models", [])
        if not (isinstance(models, list) and all(isinstance(m, str) and is_name(SERVED_NAME, m)
                                                 for m in models)):
            raise ValueError(f"{who}: models must be a list of served names")
        if entry.get("class", DEFAULT_CLASS) not in CLASSES:
            raise ValueError(f"{who}: class must be one of {', '.join(CLASSES)}")
        if "expires" in entry:
            _instant(entry["expires"])
        for limit in LIMITS:
            if limit in entry and not (type(entry[limit]) is int and entry[limit] > 0):
                raise ValueError(f"{who}: {limit} must be a positive whole number")
    return policies


def _instant(text: object) -> dt.datetime:
    if not isinstance(text, str):
        raise ValueError("expires must be a time string")
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def policies_db(policies: dict[str, dict]) -> bytes:
    return (json.dumps({who: entry for who, entry in policies.items() if entry},
                       indent=1, sort_keys=True) + "\n").encode()


def door_policy(policies: dict[str, dict], present: set[str]) -> bytes:
    """nginx/auth/door-policy.json: what the door enforces, for credentials that exist (a policy
    left by a user `kit render` removed never comes back with a new user of that name).

    nginx preloads it (`js_preload_object`): one immutable copy shared by every request. Imported
    as a JavaScript module instead, njs rebuilt the whole table for each request (600 µs of CPU
    per request with 1,000 credentials, docs/benchmarks.md). Models become an object for one
    lookup per request; the expiry milliseconds since the epoch; the limits as stored (policy.js
    reads them by these names); `batch` says whether any credential is batch.
    """
    door = {}
    for who, entry in sorted(policies.items()):
        if who not in present:
            continue
        rules: dict[str, object] = {}
        if "models" in entry:
            rules["models"] = dict.fromkeys(entry["models"], True)
        if "expires" in entry:
            rules["expires"] = int(_instant(entry["expires"]).timestamp() * 1000)
        if entry.get("class") == "batch":
            rules["batch"] = True
        rules.update({limit: entry[limit] for limit in LIMITS if limit in entry})
        if rules:
            door[who] = rules
    batch = any(rules.get("batch") is True for rules in door.values())
    return (json.dumps({"batch": batch, "credentials": door}, indent=1, sort_keys=True)
            + "\n").encode()


def check_budgets_counted(policies: dict[str, dict], usage_on: bool) -> None:
    """Budgets count the tokens the usage ledger records (at the door, as it records them):
    with the ledger off there is nothing to count them by, so no budget is accepted."""
    budgeted = sorted(who for who, entry in policies.items()
                      if any(budget in entry for budget in BUDGETS))
    if budgeted and not usage_on:
        raise BadInput(f"token budgets need the usage ledger, which this site has off "
                       f"({', '.join(budgeted)})",
                       fix="turn it on in the spec (usage: {enabled: true}), or --clear "
                       "tokens-per-day / tokens-per-month")


def present_principals(users: Iterable[str], keys: Iterable[str]) -> set[str]:
    return ({principal("user", user) for user in users}
            | {principal("key", name) for name in keys})


def check_policy_target(kind: str, name: str) -> None:
    if kind == "user" and name == PROBE_USER:
        raise BadInput(f"{PROBE_USER} is kit's probe identity: a policy could stop the gate",
                       fix="set a policy on another user or key")


def shown_policy(policies: dict[str, dict], who: str, now: dt.datetime | None = None) -> str:
    """One credential's policy for `kit keys list` / `kit users list` (EXPIRED when it is)."""
    entry = policies.get(who, {})
    expires = entry.get("expires", "never")
    if "expires" in entry and _instant(expires) <= (now or dt.datetime.now(dt.UTC)):
        expires += " (EXPIRED: refused)"
    parts = [f"class {entry.get('class', DEFAULT_CLASS)}",
             "models " + (",".join(entry["models"]) if "models" in entry else "all"),
             f"expires {expires}"]
    parts += [f"{limit.replace('_', '-')} {entry[limit]}" for limit in LIMITS if limit in entry]
    return "  ".join(parts)
