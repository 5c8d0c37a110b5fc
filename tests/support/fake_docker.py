"""A `docker` CLI stand-in on PATH for the scripts' tests: it records its arguments and answers
with a chosen exit code and message, as an engine would."""

from pathlib import Path


def fake_docker(folder: Path, exit_code: int, message: str = "") -> Path:
    """A `docker` that records its arguments and answers like an engine would."""
    folder.mkdir()
    (folder / "docker").write_text(
        f'#!/bin/sh\necho "$@" >>{folder}/calls\necho \'{message}\' >&2\nexit {exit_code}\n')
    (folder / "docker").chmod(0o755)
    return folder
