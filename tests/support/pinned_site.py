"""A site with a pinned model served by the Hub stand-in (tests/support/hub_standin.py): the
spec, its lock file, the pulled folder, and the files a corruption test breaks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.sites import REPO

MODEL = "acme/tiny"

PINNED_SPEC = """\
site: pin01
domain: llm.test.internal
models_root: {models}
auth: {{users: [ops]}}
proxy: {{bind: 127.0.0.1, https_port: 18443, http_port: 18080}}
services:
  - name: tiny
    model: {model}
    revision: {revision}
    gpus: [0]
    max_model_len: 4096
"""


def pinned_spec(root: Path, revision: str = "main", model: str = MODEL) -> Path:
    """site/site.yaml under `root` pinning `model` at `revision`, models_root root/models."""
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    spec = root / "site" / "site.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(PINNED_SPEC.format(models=models, model=model, revision=revision))
    return spec


def pulled_folder(root: Path, revision: str = "main", model: str = MODEL) -> Path:
    return root / "models" / f"{model}@{revision}"


def kit_process(*args: object, env: dict[str, str]) -> subprocess.Popen:
    """`python -m kit ARGS` as a separate process (to interrupt it like Ctrl-C or a crash)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kit", *map(str, args)], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def locked_and_pulled(root: Path, revision: str = "main") -> Path:
    """pinned_spec with its lock written and the model pulled from the stand-in at HF_ENDPOINT;
    the spec's path."""
    import io

    from kit.layout import SiteLayout
    from kit.plan.host import load_spec
    from kit.weights.hub import lock_site
    from kit.weights.pull import pull_site

    spec_path = pinned_spec(root, revision)
    spec = load_spec(spec_path, check_host=False)
    layout = SiteLayout(spec_path.parent)
    lock_site(spec, layout.lock_file)
    pull_site(spec, layout, None, io.StringIO())
    return spec_path


def pinned_on_disk(models: Path, site: Path, revision: str = "main") -> None:
    """The small model already pulled under `models` and locked in `site`/site.lock, without a
    Hub: for tests of the spec that need a pinned service to load."""
    import hashlib

    from kit.weights.lock import LockedFile, LockedModel, write_lock
    from tests.support.hub_standin import small_model, write_files

    files = small_model(4096)
    write_files(models / f"{MODEL}@{revision}", files)
    site.mkdir(parents=True, exist_ok=True)
    write_lock(site / "site.lock", [LockedModel(MODEL, revision, "c" * 40, tuple(
        LockedFile(path, len(content), hashlib.sha256(content).hexdigest())
        for path, content in files.items()))])


def hashed_on_server(reported: str) -> tuple[int, int, int]:
    """(files hashed, their bytes, files the server's hash cache vouched for) from the line
    `kit up` reports for a pinned folder it checked through a remote engine
    (kit.supply.remote_pull.check_summary); AssertionError when there is none."""
    found = re.search(r"checked on \S+: (\d+) file\(s\) hashed \((\d+) bytes\), (\d+) "
                      r"unchanged in its hash cache", reported)
    assert found, f"no check of a pinned folder reported in: {reported}"
    hashed, hashed_bytes, reused = map(int, found.groups())
    return hashed, hashed_bytes, reused
