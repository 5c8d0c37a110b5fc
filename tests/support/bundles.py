"""Bundles for the `kit bundle` / `kit load` tests: a connected machine's site with the small
model pulled and locked, a server's site to load it into, and archives taken apart and put
back together changed (tampered with)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from kit.spec.model import Images
from tests.support.cli import run_kit
from tests.support.pinned_site import MODEL, PINNED_SPEC, pinned_on_disk, pinned_spec

# the connected machine's engine: the images the pinned site runs (vLLM and nginx)
IMAGES = {Images().vllm: "sha256:" + "1" * 64, Images().nginx: "sha256:" + "2" * 64}
KIT_WHEEL = "kit-0.1.0-py3-none-any.whl"


def fake_wheelhouse(folder: Path) -> list[Path]:
    """What kit.supply.wheelhouse.build_wheelhouse leaves, without pip or a package index."""
    folder.mkdir(parents=True)
    wheel = folder / KIT_WHEEL
    wheel.write_bytes(b"PK\x03\x04 not really a zip")
    requirements = folder / "requirements.txt"
    requirements.write_text("kit==0.1.0 --hash=sha256:" + "0" * 64 + "\n")
    return [wheel, requirements]


def bundle_for(root: Path) -> Path:
    """root/site/site.yaml pinning the small model (pulled under root/models, locked), bundled
    with `kit bundle` into root/bundle.tar (the engine and wheelhouse the caller patched)."""
    spec = pinned_spec(root)
    pinned_on_disk(root / "models", spec.parent)
    out = root / "bundle.tar"
    done = run_kit("bundle", spec, "--out", out)
    assert done.exit_code == 0, done.output
    return out


def server_site(root: Path) -> Path:
    """root/server/site/site.yaml: the same spec on the air-gapped server, models_root empty."""
    models = root / "server" / "models"
    models.mkdir(parents=True, exist_ok=True)
    spec = root / "server" / "site" / "site.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(PINNED_SPEC.format(models=models, model=MODEL, revision="main"))
    return spec


def members(bundle: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(bundle) as tar:
        return [(info.name, tar.extractfile(info).read()) for info in tar]  # type: ignore


def write_tar(out: Path, files: dict[str, bytes]) -> Path:
    """A tar of regular files, in the order given (a hand-made, possibly hostile, bundle)."""
    with tarfile.open(out, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def rewrite(bundle: Path, out: Path,
            change: Callable[[dict[str, bytes]], dict[str, bytes]]) -> Path:
    """`bundle`'s members (in order) changed by `change`, written to `out` as a tar."""
    return write_tar(out, change(dict(members(bundle))))


def tree_of(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root`: what a refused load leaves."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}
