"""One module per verb (kit/commands/<verb>.py exporting a click command of the same name).

Verbs are imported only when run, so `kit render` does not pay for docker-py and friends.
"""

import importlib

import click

VERBS = [
    "init", "validate", "schema", "render", "plan", "up", "probe", "status", "down", "logs",
    "users", "keys", "rotate-password", "tls", "export", "fleet", "bench",
    "usage", "audit", "lock", "pull", "bundle", "load", "sleep", "wake", "adapters", "alerts",
]


def verb_command(verb: str) -> click.Command:
    name = verb.replace("-", "_")
    return getattr(importlib.import_module(f"kit.commands.{name}"), name)
