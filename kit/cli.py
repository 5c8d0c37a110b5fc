"""The `kit` command: a thin click layer; each verb lives in kit/commands/<verb>.py."""

import sys

import click

from kit import __version__
from kit.commands import COMMANDS
from kit.errors import ExitCode, KitError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kit")
def cli() -> None:
    """Turn a GPU server into a secured, verified vLLM endpoint from one site.yaml."""


for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    """Run the CLI; kit's own errors become a message and an exit code, bugs keep a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(ExitCode.FAILED)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except KitError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
