"""The `kit` command: a thin click layer; each verb lives in kit/commands/<verb>.py."""

import click

from kit import __version__
from kit.commands import VERBS, verb_command
from kit.errors import KitError


class KitGroup(click.Group):
    """Loads a verb's module only when it runs; kit's own errors become a message and their
    exit code, while bugs keep their traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return verb_command(name) if name in VERBS else None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KitError as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)


@click.group(
    cls=KitGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="kit")
def cli() -> None:
    """Turn a GPU server into a secured, verified vLLM endpoint from one site.yaml."""


def main() -> None:
    cli()
