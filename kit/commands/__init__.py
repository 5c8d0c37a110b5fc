"""One module per verb; COMMANDS is what kit/cli.py registers."""

import importlib

VERBS = ["init", "validate", "schema", "render", "plan", "up", "probe", "status", "down", "logs"]


def _load() -> list:
    commands = []
    for verb in VERBS:
        try:
            module = importlib.import_module(f"kit.commands.{verb}")
        except ModuleNotFoundError as error:
            if error.name != f"kit.commands.{verb}":
                raise
            continue
        commands.append(getattr(module, verb))
    return commands


COMMANDS = _load()
