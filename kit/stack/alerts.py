"""`kit alerts` (docs/observability.md, "Delivered alerts"): the site's Alertmanager through its
own API and its own amtool, run inside its container with kit's account from the container's
environment (it publishes no port; kit's exec request carries no secret): what fires (active
or silenced), the silences, a silence added for matching alerts, one expired. Alertmanager
keeps them in its volume, so they outlive a restart."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.engine.desired import ALERTMANAGER_SERVICE
from kit.errors import BadInput, KitError
from kit.plan.alerts import ALERTMANAGER_PORT

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine
    from kit.site import Site

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
LABEL_VALUE = re.compile(r"[A-Za-z0-9_.:@/-]{1,200}")  # alert names, services, credentials, hosts
DURATION = re.compile(r"[1-9][0-9]{0,4}[mhdw]")  # amtool's --duration (Prometheus durations)
COMMENT = re.compile(r"[^\x00-\x1f\x7f]{1,500}")
SILENCE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
AUTHOR = "kit"


@dataclass(frozen=True)
class Alert:
    name: str
    labels: dict[str, str]
    summary: str
    state: str  # active, suppressed (silenced), unprocessed
    since: str


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: str  # name=value,…
    ends: str
    state: str  # active, pending, expired
    comment: str


def amtool_argv(*args: str) -> list[str]:
    """amtool inside Alertmanager's container, as kit's account (the password from its
    environment, expanded by its shell: never in kit's request)."""
    url = f'"http://kit:${{KIT_PROMETHEUS_PASSWORD}}@127.0.0.1:{ALERTMANAGER_PORT}"'
    return ["sh", "-c", f"amtool --alertmanager.url={url} {shlex.join(args)}"]


def _amtool(engine: Engine, container_id: str, *args: str) -> str:
    code, output = engine.exec(container_id, amtool_argv(*args))
    if code != 0:
        verb = " ".join(arg for arg in args[:5] if arg.isalpha() and arg != "json")
        raise KitError(f"Alertmanager's amtool {verb} failed (exit {code}): "
                       f"{output.strip()[-500:]}",
                       fix="kit logs SPEC alertmanager; kit up if it is not running")
    return output


def running_alertmanager(site: Site, engine: Engine) -> str:
    """The running Alertmanager's container id; a site without one: exit 2 naming the fix."""
    if site.spec.observability.alerts is None:
        raise BadInput("this site renders no Alertmanager (observability.alerts is unset)",
                       fix="add observability.alerts with a receiver to the spec "
                       "(docs/observability.md) and run kit up")
    running = site.observe(engine, with_images=False).running(ALERTMANAGER_SERVICE)
    if running is None:
        raise KitError("the alertmanager container is not running", fix="run kit up")
    return running.id


def list_alerts(engine: Engine, manager: str) -> tuple[list[Alert], list[Silence]]:
    """What Alertmanager holds now (silenced ones too) and its silences in force (active or
    pending; amtool shows expired ones only when asked)."""
    try:
        alerts = [Alert(a["labels"].get("alertname", "?"),
                        {k: v for k, v in a["labels"].items() if k != "alertname"},
                        a.get("annotations", {}).get("summary", ""), a["status"]["state"],
                        a["startsAt"])
                  for a in json.loads(_amtool(engine, manager, "-o", "json", "alert", "query",
                                              "--silenced", "--inhibited", "--active"))]
        silences = [Silence(s["id"], ",".join(f"{m['name']}={m['value']}" for m in s["matchers"]),
                            s["endsAt"], s["status"]["state"], s.get("comment", ""))
                    for s in json.loads(_amtool(engine, manager, "-o", "json", "silence",
                                                "query"))]
    except (ValueError, KeyError, TypeError) as error:
        raise KitError(f"Alertmanager answered in an unexpected shape ({error!r})") from None
    return alerts, silences


def matchers(alert: str, labels: tuple[str, ...]) -> list[str]:
    """alertname=ALERT and each NAME=VALUE, allow-listed whole (exit 2 naming the bad one)."""
    found = [("alertname", alert)]
    for label in labels:
        name, sep, value = label.partition("=")
        if not sep:
            raise BadInput(f"--label {label!r} is not NAME=VALUE",
                           fix="e.g. --label service=llama8b or --label credential=key:ci")
        found.append((name, value))
    for name, value in found:
        if not LABEL_NAME.fullmatch(name) or not LABEL_VALUE.fullmatch(value):
            raise BadInput(f"{name}={value!r} is not a label kit's alerts carry",
                           fix="label names are letters, digits and _; values letters, "
                           "digits and . _ : @ / - (kit alerts lists them)")
    return [f"{name}={value}" for name, value in found]


def silence(engine: Engine, manager: str, alert: str, labels: tuple[str, ...], duration: str,
            comment: str) -> str:
    """A silence of the alerts matching, for `duration`; its id."""
    chosen = matchers(alert, labels)
    if not DURATION.fullmatch(duration):
        raise BadInput(f"--for {duration!r} is not a duration",
                       fix="a number and a unit: 30m, 2h, 1d, 1w")
    if not COMMENT.fullmatch(comment):
        raise BadInput("--comment is 1 to 500 characters on one line",
                       fix="say why, e.g. --comment 'replacing the GPU'")
    output = _amtool(engine, manager, "silence", "add",
                     f"--duration={duration}", f"--author={AUTHOR}", f"--comment={comment}",
                     *chosen)
    silence_id = output.strip().splitlines()[-1] if output.strip() else ""
    if not SILENCE_ID.fullmatch(silence_id):
        raise KitError(f"Alertmanager added no silence: {output.strip()[-300:]}")
    return silence_id


def expire(engine: Engine, manager: str, silence_id: str) -> None:
    if not SILENCE_ID.fullmatch(silence_id):
        raise BadInput(f"{silence_id!r} is not a silence id", fix="kit alerts list shows them")
    _amtool(engine, manager, "silence", "expire", silence_id)
