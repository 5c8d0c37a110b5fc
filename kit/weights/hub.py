"""The Hugging Face Hub through its official client (`huggingface_hub`): a pinned revision
resolved to its commit and file hashes (`kit lock`), and one file fetched at a commit with
resume (`kit pull`).

The client reads HF_TOKEN (or its own token file) itself at each call; kit never holds the
token in a file. HF_ENDPOINT is read at each call too (the client reads it once, at import).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from kit.errors import BadInput, KitError
from kit.names import COMMIT
from kit.spec.model import Spec
from kit.weights.lock import LockedFile, LockedModel, is_repo_path, pinned, write_lock
from kit.weights.verify import file_sha256

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_FIX = ("set HF_TOKEN in kit's environment to a token that may read it (a gated model: "
             "accept its terms on the Hub first)")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@contextmanager
def hub_errors(what: str) -> Iterator[None]:
    """The client's failures as kit errors that name the thing and the fix."""
    import httpx2
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise BadInput(f"{what}: the model is gated and this token may not read it",
                       fix=TOKEN_FIX) from None
    except errors.RepositoryNotFoundError:
        raise BadInput(f"{what}: no such model on {endpoint()} (or it is private)",
                       fix="fix services[].model, or " + TOKEN_FIX) from None
    except errors.RevisionNotFoundError:
        raise BadInput(f"{what}: the Hub has no such revision",
                       fix="fix services[].revision (a commit, branch or tag of the model)"
                       ) from None
    except errors.RemoteEntryNotFoundError:
        raise KitError(f"{what}: the file is not at that commit on {endpoint()}",
                       fix="run `kit lock` again: the lock file names a file the Hub does not "
                       "have") from None
    except errors.HfHubHTTPError as error:
        raise KitError(f"{what}: the Hub answered {error}",
                       fix="try again later; check HF_ENDPOINT and HF_TOKEN") from None
    except (httpx2.HTTPError, OSError) as error:
        raise KitError(f"{what}: cannot reach {endpoint()} ({error})",
                       fix="check the network, or set HF_ENDPOINT to a reachable mirror") from None


def resolve(model: str, revision: str) -> LockedModel:
    """The commit `revision` names now and every file's size and sha256 there: LFS files as the
    Hub publishes them, small files hashed after downloading them at that commit."""
    from huggingface_hub import HfApi, hf_hub_download

    what = f"{model}@{revision}"
    with hub_errors(what):
        info = HfApi(endpoint=endpoint()).model_info(model, revision=revision,
                                                     files_metadata=True)
    commit = info.sha or ""
    if not _is_commit(commit):
        raise KitError(f"{what}: the Hub named no commit for it ({commit!r})",
                       fix="check that HF_ENDPOINT is a Hugging Face Hub (or a mirror of one)")
    if _is_commit(revision) and commit != revision:
        raise KitError(f"{what}: the Hub answered commit {commit}",
                       fix="check that HF_ENDPOINT serves this model as the Hub does")
    files = []
    with tempfile.TemporaryDirectory(prefix="kit-lock-") as scratch:
        for sibling in info.siblings or []:
            if not is_repo_path(sibling.rfilename):
                raise KitError(f"{what}: the repository holds {sibling.rfilename!r}, a path kit "
                               "will not write", fix="pin a revision without that file")
            if sibling.lfs is not None:
                files.append(LockedFile(sibling.rfilename, sibling.lfs.size,
                                        sibling.lfs.sha256))
                continue
            with hub_errors(f"{what}: {sibling.rfilename}"):
                local = Path(hf_hub_download(model, sibling.rfilename, revision=commit,
                                             local_dir=scratch, endpoint=endpoint()))
            files.append(LockedFile(sibling.rfilename, local.stat().st_size,
                                    file_sha256(local)))
    if not files:
        raise KitError(f"{what}: the Hub lists no files for it",
                       fix="check the model id and revision on the Hub")
    return LockedModel(model, revision, commit, tuple(files))


def fetch(locked: LockedModel, file: LockedFile, partial: Path) -> str:
    """Fetch `file` at the locked commit into `partial`, resuming from the bytes already there
    (an HTTP Range request); the sha256 of the whole file when it is complete."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    what = f"{locked.model}@{locked.commit[:12]}: {file.path}"
    url = hf_hub_url(locked.model, file.path, revision=locked.commit, endpoint=endpoint())
    with hub_errors(what):
        meta = get_hf_file_metadata(url, endpoint=endpoint())
    if meta.commit_hash != locked.commit:
        raise KitError(f"{what}: the Hub served commit {meta.commit_hash}",
                       fix="check that HF_ENDPOINT serves the Hub's commits")
    if meta.size is not None and meta.size != file.size:
        raise KitError(f"{what}: the Hub serves {meta.size} bytes, the lock file says "
                       f"{file.size}", fix="run `kit lock` again and review the diff")
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # the bytes as stored: sizes and ranges hold
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a storage host (CDN) gets no Hub token
    partial.parent.mkdir(parents=True, exist_ok=True)
    done = partial.stat().st_size if partial.exists() else 0
    if done > file.size:
        partial.unlink()
        done = 0
    with hub_errors(what), partial.open("ab") as out:
        http_get(meta.location, out, resume_size=done, headers=headers,
                 expected_size=file.size, displayed_filename=file.path)
    return file_sha256(partial)


def _is_commit(value: str) -> bool:
    return re.fullmatch(COMMIT.strip("^$"), value) is not None


def lock_site(spec: Spec, lock_path: Path) -> list[LockedModel]:
    """`kit lock`: every pinned model of the spec resolved now and written to the lock file
    (an entry no service pins any more is dropped; the file is replaced whole)."""
    wanted = pinned(spec.services)
    if not wanted:
        raise BadInput("no service has a revision: nothing to lock",
                       fix="add `revision: <commit, branch or tag>` to a service whose model is "
                       "an org/name Hub id (docs/weights.md)")
    models = [resolve(model, revision) for model, revision in wanted.values()]
    write_lock(lock_path, models)
    return models
