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
