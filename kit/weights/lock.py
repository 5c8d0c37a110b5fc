"""The lock file (`site.lock` beside the spec): per pinned model, the exact commit and every
file's path, size and sha256, as YAML in a stable order (reviewable in git), written atomically.

Also the one rule for where a pinned model lives: `<models_root>/<org>/<name>@<revision>`, the
revision as the spec writes it, so the plan needs the spec alone (docs/weights.md).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kit.errors import BadInput
from kit.files import atomic_write
from kit.names import COMMIT, MODEL_REF, REVISION, SHA256
from kit.spec.load import read_yaml
from kit.spec.model import Service
from kit.spec.problems import SpecError, SpecProblem
from kit.state import read_state

LOCK_VERSION = 1
# a file of a model repository: relative, printable, never `..` nor kit's staging folder
REPO_PATH = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9._+=-]*(/[A-Za-z0-9_.][A-Za-z0-9._+=-]*)*")
STAGING_NAME = ".kit-partial"  # kit pull's partial files, under a model's staging folder
LOCK_FIX = "run `kit lock SPEC` to write it again from the Hub (and review the diff in git)"


@dataclass(frozen=True)
class LockedFile:
    path: str  # relative to the model's folder, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class LockedModel:
    model: str  # org/name
    revision: str  # as the spec writes it
    commit: str  # the 40-hex commit it resolved to
    files: tuple[LockedFile, ...]

    @property
    def key(self) -> str:
        return lock_key(self.model, self.revision)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def lock_key(model: str, revision: str) -> str:
    return f"{model}@{revision}"


def pinned_relative(service: Service) -> str | None:
    """A pinned service's folder under models_root (`org/name@revision`), None when unpinned."""
    return None if service.revision is None else lock_key(service.model, service.revision)


def model_dir(models_root: Path, service: Service) -> Path:
    """Where vLLM reads the service's model on this host (pinned or a plain folder)."""
    return models_root / (pinned_relative(service) or service.model)


def pinned(services: list[Service]) -> dict[str, tuple[str, str]]:
    """key → (model, revision) of the pinned services, each once, in a stable order."""
    found = {lock_key(s.model, s.revision): (s.model, s.revision)
             for s in services if s.revision is not None}
    return dict(sorted(found.items()))


def lock_text(models: list[LockedModel]) -> str:
    """The lock file's text: models by key, files by path, so a change is a small diff."""
    document = {
        "version": LOCK_VERSION,
        "models": {
            m.key: {
                "model": m.model, "revision": m.revision, "commit": m.commit,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                          for f in sorted(m.files, key=lambda f: f.path)],
            } for m in sorted(models, key=lambda m: m.key)
        },
    }
    header = ("# kit lock file: each pinned model's exact commit and every file's size and\n"
              "# sha256 (`kit lock` writes it; `kit pull` and `kit up` check the files).\n"
              "# Commit it beside the spec and review its diffs.\n")
    return header + yaml.safe_dump(document, sort_keys=False, width=1000)


def write_lock(path: Path, models: list[LockedModel]) -> None:
    atomic_write(path, lock_text(models).encode())


def read_lock(path: Path) -> dict[str, LockedModel] | None:
    """key → the locked model; None when there is no lock file; BadInput at `site.lock:line:col`
    naming the entry when it is broken (a hand edit, a merge gone wrong, a hostile file)."""
    return read_state(path, lambda text: parse_lock(text, path), fix=LOCK_FIX)


def parse_lock(text: str, source: Path | str) -> dict[str, LockedModel]:
    """A lock file's text read strictly, as a spec is (kit.spec.load.read_yaml: no duplicate
    key, tag, anchor, deep nesting or number in another base); also a bundle's copy. BadInput
    listing every problem at `source:line:col`."""
    located = read_yaml(text, source, remake=LOCK_FIX)
    problems = list(located.problems)
    document = located.data
    models: dict = {}
    if not isinstance(document, dict) or document.get("version") != LOCK_VERSION:
        problems.append(SpecProblem((), f"not a kit lock file of version {LOCK_VERSION}"))
    elif not isinstance(models := document.get("models") or {}, dict):
        problems.append(SpecProblem(("models",), "models must be a mapping"))
        models = {}
    locked = {}
    for key, entry in models.items():
        try:
            locked[key] = _model(key, entry)
        except ValueError as error:
            problems.append(SpecProblem(("models", key), str(error)))
    if problems:
        raise SpecError(source, located, problems, fix=LOCK_FIX)
    return locked


def _model(key: object, entry: object) -> LockedModel:
    if not isinstance(entry, dict):
        raise ValueError(f"entry {key!r} is not a mapping")
    model, revision, commit = entry.get("model"), entry.get("revision"), entry.get("commit")
    if not (_whole(MODEL_REF, model) and _whole(REVISION, revision) and _whole(COMMIT, commit)):
        raise ValueError(f"entry {key!r} needs model (org/name), revision and a 40-hex commit")
    if key != lock_key(str(model), str(revision)):
        raise ValueError(f"entry {key!r} is filed under the wrong key")
    if _whole(COMMIT, revision) and commit != revision:
        raise ValueError(f"entry {key!r} pins commit {revision} but records {commit}")
    raw_files = entry.get("files")
    if not isinstance(raw_files, list) or not raw_files:
        raise ValueError(f"entry {key!r} lists no files")
    files = tuple(_file(key, raw) for raw in raw_files)
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        raise ValueError(f"entry {key!r} lists a file twice")
    return LockedModel(str(model), str(revision), str(commit), files)


def _file(key: object, raw: object) -> LockedFile:
    if not isinstance(raw, dict):
        raise ValueError(f"entry {key!r}: a file is not a mapping")
    path, size, sha = raw.get("path"), raw.get("size"), raw.get("sha256")
    if not is_repo_path(path):
        raise ValueError(f"entry {key!r}: file path {path!r} is not a plain relative path")
    if type(size) is not int or size < 0 or not _whole(SHA256, sha):
        raise ValueError(f"entry {key!r}: file {path} needs a size and a 64-hex sha256")
    return LockedFile(str(path), size, str(sha))


def is_repo_path(path: object) -> bool:
    """A repository file kit may write under a model's folder: relative, normal, no `..`."""
    return (isinstance(path, str) and len(path) <= 512 and REPO_PATH.fullmatch(path) is not None
            and posixpath.normpath(path) == path
            and not {".", ".."} & set(path.split("/"))
            and path.split("/")[0] != STAGING_NAME)


def _whole(pattern: str, value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(pattern.strip("^$"), value) is not None


def locked_for(lock: dict[str, LockedModel] | None, lock_path: Path,
               service: Service) -> LockedModel:
    """The lock entry of a pinned service, or BadInput saying to run `kit lock`."""
    key = pinned_relative(service)
    assert key is not None
    entry = (lock or {}).get(key)
    if entry is None:
        raise BadInput(f"{lock_path} has no entry for {key} (service {service.name})",
                       fix="run `kit lock SPEC` to resolve it on the Hub and record its files")
    return entry
