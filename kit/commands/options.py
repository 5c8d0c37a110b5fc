"""Arguments several verbs share."""

from pathlib import Path

import click

from kit.spec import DEFAULT_SPEC

spec_argument = click.argument(
    "spec",
    required=False,
    default=str(DEFAULT_SPEC),
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="[SPEC]",
)


def spec_and_name(values: tuple[str, ...], what: str) -> tuple[Path, str]:
    """`[SPEC] NAME` as the verbs that change credentials take it."""
    if len(values) == 1:
        return DEFAULT_SPEC, values[0]
    if len(values) == 2:
        return Path(values[0]), values[1]
    raise click.UsageError(f"expected [SPEC] {what}")
