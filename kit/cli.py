"""The `kit` command: a thin click layer; each verb lives in kit/commands/<verb>.py."""

import click

from kit import __version__
from kit.commands import COMMANDS
from kit.errors import KitError


class KitGroup(click.Group):
    """kit's own errors become a message and their exit code; bugs keep their traceback."""

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


for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli()
