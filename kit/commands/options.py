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


def credential_site(values: tuple[str, ...], what: str):
    """(spec, layout, name) for the verbs that change credentials of a rendered site."""
    from kit.access import require_rendered
    from kit.layout import SiteLayout
    from kit.spec import load_spec

    spec_path, name = spec_and_name(values, what)
    spec = load_spec(spec_path)
    layout = SiteLayout(spec_path.parent)
    require_rendered(layout)
    return spec, layout, name
