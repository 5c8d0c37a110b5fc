"""One module per verb; COMMANDS is what kit/cli.py registers."""

import importlib

VERBS = [
    "init", "validate", "schema", "render", "plan", "up", "probe", "status", "down", "logs",
    "users", "keys", "rotate-password", "tls",
]


def _load() -> list:
    commands = []
    for verb in VERBS:
        name = verb.replace("-", "_")
        try:
            module = importlib.import_module(f"kit.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"kit.commands.{name}":
                raise
            continue
        commands.append(getattr(module, name))
    return commands


COMMANDS = _load()
