"""kit init: write a commented example spec to start from."""

from importlib import resources
from pathlib import Path

import click

from kit.errors import BadInput
from kit.files import atomic_write, write_failure
from kit.spec.model import DEFAULT_SPEC


@click.command()
@click.argument(
    "path", required=False, default=str(DEFAULT_SPEC), type=click.Path(path_type=Path)
)
def init(path: Path) -> None:
    """Write a commented example site.yaml to PATH (default ./site.yaml); never overwrites.

    It shows every TLS mode (self-signed, files, acme) as comments to switch to."""
    if path.is_dir():
        path = path / DEFAULT_SPEC
    if path.exists():
        raise BadInput(f"{path} already exists", fix="choose another path or edit that file")
    try:
        atomic_write(path, resources.files("kit.data").joinpath("site.example.yaml").read_bytes())
    except OSError as error:
        raise write_failure(error, path) from None
    click.echo(f"wrote {path}: edit it, then run `kit validate {path}` and `kit render {path}`")
