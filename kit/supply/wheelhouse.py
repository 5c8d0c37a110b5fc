"""kit's own wheel and its dependencies, hash-pinned, for `kit bundle`: installed on an
air-gapped server with `pip install --no-index --find-links DIR --require-hashes -r
DIR/requirements.txt` (docs/offline.md).

The dependencies are the versions installed with this kit (pip resolves kit's requirements with
every installed distribution as a constraint), downloaded as wheels for this Python and
platform from the package index pip is configured with; each line of requirements.txt pins a
name, a version and the sha256 of the wheel in the folder.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from kit.errors import BadInput, KitError

WHEEL_NAME = re.compile(r"(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)-[^/]+\.whl")
PIP_TIMEOUT_S = 900
SOURCE_FILES = ("pyproject.toml", "README.md", "kit", "templates")  # what the wheel is built of


def kit_source() -> Path:
    """The source folder of the kit that runs (an editable install or a checkout);
    BadInput when kit runs from an installed wheel (no source to build one from)."""
    source = Path(__file__).resolve().parents[2]
    project = source / "pyproject.toml"
    if not project.is_file() or not re.search(r'(?m)^name = "kit"$', project.read_text()):
        raise BadInput("kit runs from an installed wheel, not a source folder, so kit bundle "
                       "cannot build its wheel", fix="install kit from its source folder "
                       "(`pip install -e ./kit`), or bundle with --without-kit and install kit "
                       "on the server yourself")
    return source


def requirements_text(wheels: list[Path]) -> str:
    """One `name==version --hash=sha256:…` line per wheel, sorted by name."""
    lines = []
    for wheel in sorted(wheels, key=lambda w: w.name.lower()):
        found = WHEEL_NAME.fullmatch(wheel.name)
        if found is None:
            raise KitError(f"{wheel.name} is not a wheel's file name",
                           fix="report this: pip made a file kit cannot pin")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines.append(f"{found['name']}=={found['version']} --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def installed_constraints() -> str:
    """`name==version` of every installed distribution but kit (pip uses the ones kit needs)."""
    pins = {dist.metadata["Name"].lower(): f"{dist.metadata['Name']}=={dist.version}"
            for dist in metadata.distributions() if dist.metadata["Name"]}
    pins.pop("kit", None)
    return "\n".join(sorted(pins.values())) + "\n"


def build_wheelhouse(folder: Path) -> list[Path]:
    """kit's wheel built from its source, its dependencies downloaded as wheels at the
    installed versions, and requirements.txt pinning each by sha256: every file written."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder.parent / "kit-source"  # a copy: the build's own files stay out of kit's
    source.mkdir()
    root = kit_source()
    for name in SOURCE_FILES:
        if (root / name).is_dir():
            shutil.copytree(root / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(root / name, source / name)
    _pip("building kit's wheel", "wheel", "--no-deps", "-q",
         "-w", str(folder), str(source))
    shutil.rmtree(source)
    built = [w for w in folder.glob("kit-*.whl")]
    if len(built) != 1:
        raise KitError(f"pip wheel left {len(built)} kit wheel(s) in {folder}",
                       fix="report this with pip's version")
    constraints = folder.parent / "constraints.txt"
    constraints.write_text(installed_constraints())
    _pip("downloading kit's dependencies", "download", "-q", "--only-binary=:all:",
         "-d", str(folder), "-c", str(constraints), str(built[0]))
    constraints.unlink()
    wheels = sorted(folder.glob("*.whl"))
    requirements = folder / "requirements.txt"
    requirements.write_text(requirements_text(wheels))
    return [*wheels, requirements]


def _pip(doing: str, *args: str) -> None:
    try:
        done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True,
                              text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise KitError(f"{doing}: pip did not finish ({error})",
                       fix="check that pip is installed and the package index answers") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise KitError(f"{doing}: pip failed (exit {done.returncode}):\n{tail}",
                       fix="check the package index (pip config, PIP_INDEX_URL) and that the "
                       "installed versions are on it; or bundle with --without-kit")
