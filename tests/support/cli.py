"""Running `kit` in-process in tests, the one way: as a user runs it, with bugs left visible.

kit's own errors become their message and exit code (the CLI's job); any other exception is a
bug and propagates with its traceback (catch_exceptions=False) instead of hiding in an exit
code of 1.
"""

from click.testing import CliRunner, Result

from kit.cli import cli

PLAIN = {"NO_COLOR": "1", "COLUMNS": "100"}


def run_kit(*args: object, stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
    """`kit ARGS...` (paths and numbers are turned into strings)."""
    runner = CliRunner(env={**PLAIN, **(env or {})})
    return runner.invoke(cli, [str(arg) for arg in args], input=stdin, catch_exceptions=False)
