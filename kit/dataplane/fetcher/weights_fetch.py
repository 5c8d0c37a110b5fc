"""kit's fetcher of a pinned model on the GPU server itself (`kit pull` through a remote engine,
docs/weights.md): run by the python3 of the vLLM image, which carries `huggingface_hub`, in a
throwaway container with models_root bound and the server's own network, so the bytes never
cross the operator's machine.

    python3 weights_fetch.py JOB.json MODELS_ROOT [HASHES]

With `"check": true` in the job it fetches nothing and changes nothing in MODELS_ROOT: it
reports what differs between the model's folder and the lock file (`kit up` through a remote
engine).

HASHES: the server's hash cache (a file in the site's `kit-weights-hashes` volume, which only
kit's own throwaway containers mount), read and written by the rules of weights_hashes.py
(copied in beside this script; kit's own check uses the same module): a file whose stat is
unchanged since it was hashed is not read again, by a check or by a pull, and a pull leaves the
hashes of the files it fetched there for the next check. The result event says how many files
were hashed (and their bytes) and how many came from the cache.

JOB.json (written by kit, kit/supply/remote_pull.py, which makes every decision): the Hub
endpoint, the model, the locked commit, every locked file (path, size, sha256), and the final,
staging and partial folders relative to MODELS_ROOT. A file `token` beside JOB.json (mode 0400,
copied into the container before it started) holds HF_TOKEN when there is one.

The mechanics are kit pull's, here and on kit's own host (kit/weights/pull.py runs `pull` in
process, with its own client for each file and its events as the progress line): files go to
the staging folder, each into
the partial folder first and resumed from the bytes already there with an HTTP Range request;
a file joins the staging folder only when its sha256 is the lock file's; the staging folder
becomes the model's folder (one rename) only when it holds exactly the locked files. Output:
one line per event on stdout, `KIT-PULL <json>`: `start`, `progress` (every half second),
`result`, or `error` with a kind (unreachable, unauthorized, not_found, entry_not_found,
disk_full, mismatch, conflict, http) that kit turns into the message and the exit code.
"""

import errno
import json
import os
import shutil
import sys
import threading
import time
from urllib.parse import urlsplit

try:  # in the container: copied in beside this script
    from weights_hashes import (  # type: ignore[import-not-found]
        HashCache,
        file_sha256,
        hash_files,
        link_out_of,
    )
except ImportError:  # imported by kit itself, as kit.dataplane.fetcher.weights_fetch
    from kit.dataplane.fetcher.weights_hashes import HashCache, file_sha256, hash_files, link_out_of

MARK = "KIT-PULL "
PROGRESS_SECONDS = 0.5
FAILED = 3  # exit code after an `error` line


class Refused(Exception):
    """`served`: the sha256 the Hub served for `path` when it was not the lock file's."""

    def __init__(self, kind, detail, path="", served=""):
        super().__init__(detail)
        self.kind, self.detail, self.path, self.served = kind, detail, path, served


SAYING = threading.Lock()  # the reporter thread and the main one write whole lines


def say(event, **fields):
    with SAYING:
        sys.stdout.write(MARK + json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def files_under(folder, skip=None):
    """Relative '/'-paths of every file under `folder` (`skip`: a top-level folder left out)."""
    found = {}
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        if root == folder and skip in dirs:
            dirs.remove(skip)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder).replace(os.sep, "/")] = path
    return found


def outside(root, relative):
    """`link_out` when `root/relative` is reached through a link out of `root` (the rule of
    weights_hashes.link_out_of: what vLLM's container would not read), with the link (relative
    to `root`) and its target; None when it is not."""
    link = link_out_of(root, relative)
    if link is None:
        return None
    return {"kind": "link_out", "link": os.path.relpath(link, root), "target": os.readlink(link)}


def differences(root, relative, files, cache):
    """What differs between `root/relative` and the locked files, one entry per file: absent
    (no folder), link_out (reached through a link out of `root`), missing, extra, not_a_file,
    size (with the size), sha256 (with the sha256); a file whose stat `cache` knows is not read
    again."""
    folder = os.path.join(root, relative)
    if (linked := outside(root, relative)) is not None:
        return [{"path": ".", **linked}]
    if not os.path.isdir(folder):
        return [{"path": ".", "kind": "absent"}]
    present = files_under(folder)
    found = [{"path": p, "kind": "missing"} for p in sorted(files) if p not in present]
    found += [{"path": p, "kind": "extra"} for p in sorted(present) if p not in files]
    same_size = []
    for path in sorted(p for p in files if p in present):
        if (linked := outside(root, relative + "/" + path)) is not None:
            found.append({"path": path, **linked})
        elif not os.path.isfile(present[path]):
            found.append({"path": path, "kind": "not_a_file"})
        elif os.path.getsize(present[path]) != files[path]["size"]:
            found.append({"path": path, "kind": "size", "size": os.path.getsize(present[path])})
        else:
            same_size.append(path)
    hashes = hash_files([present[p] for p in same_size], cache)
    found += [{"path": p, "kind": "sha256", "sha256": hashes[present[p]]} for p in same_size
              if hashes[present[p]] != files[p]["sha256"]]
    return found


def matches(root, relative, files, cache):
    return not differences(root, relative, files, cache)


def size_of(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Reporter(threading.Thread):
    """The bytes on disk of the files being fetched, every half second, told to `tell`."""

    def __init__(self, paths, tell):
        super().__init__(daemon=True)
        self.paths, self.tell, self.stop = paths, tell, threading.Event()

    def current(self):
        return sum(size_of(partial) + size_of(final) for partial, final in self.paths)

    def run(self):
        while not self.stop.wait(PROGRESS_SECONDS):
            self.tell("progress", done=self.current())


def fetch(job, item, partial, token):
    """One file at the locked commit into `partial`, resumed; its sha256 when complete."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    endpoint = job["endpoint"]
    url = hf_hub_url(job["model"], item["path"], revision=job["commit"], endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token or False, endpoint=endpoint)
    if meta.commit_hash != job["commit"]:
        raise Refused("mismatch", f"the Hub served commit {meta.commit_hash}", item["path"])
    if meta.size is not None and meta.size != item["size"]:
        raise Refused("mismatch", f"the Hub serves {meta.size} bytes, the lock file says "
                      f"{item['size']}", item["path"])
    headers = build_hf_headers(token=token or False)
    headers["Accept-Encoding"] = "identity"  # the bytes as stored: sizes and ranges hold
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a storage host (CDN) gets no Hub token
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    done = size_of(partial)
    if done > item["size"]:
        os.unlink(partial)
        done = 0
    with open(partial, "ab") as out:
        http_get(meta.location, out, resume_size=done, headers=headers,
                 expected_size=item["size"], displayed_filename=item["path"])
    return file_sha256(partial)


def pull(job, root, token, cache, fetch_file=fetch, tell=say):
    """The job's model made to hold exactly its locked files; its figures. `fetch_file` fetches
    one file into its partial path (kit pull on kit's own host passes its client's, with its
    error messages), `tell` takes the events (the container's stdout here, kit pull's progress
    line in process)."""
    folder = os.path.join(root, job["folder"])
    staging = os.path.join(root, job["staging"])
    partial_root = os.path.join(staging, job["partial"])
    files = {f["path"]: f for f in job["files"]}
    for relative in (job["folder"], job["staging"]):
        if (linked := outside(root, relative)) is not None:
            raise Refused("conflict", f"{relative} is the link {linked['link']} (to "
                          f"{linked['target']}), which leads out of models_root")
    if os.path.isdir(folder):
        if matches(root, job["folder"], files, cache):
            tell("start", total=0, start=0, kept=len(files), removed=[])
            return {"fetched": 0, "kept": len(files), "removed": [], "downloaded": 0}
        if os.path.exists(staging):
            raise Refused("conflict", f"both {job['folder']} and {job['staging']} exist")
        os.rename(folder, staging)  # repaired in staging, renamed back when verified
        cache.moved(folder, staging)
    os.makedirs(staging, exist_ok=True)
    removed = []
    for path, local in files_under(staging, skip=job["partial"]).items():
        if path not in files:
            os.unlink(local)
            removed.append(path)
    present = {p: os.path.join(staging, p) for p in files
               if outside(root, job["staging"] + "/" + p) is None
               and os.path.isfile(os.path.join(staging, p))
               and os.path.getsize(os.path.join(staging, p)) == files[p]["size"]}
    hashes = hash_files(list(present.values()), cache)
    good = {p for p, local in present.items() if hashes[local] == files[p]["sha256"]}
    todo = sorted((f for p, f in files.items() if p not in good), key=lambda f: -f["size"])
    for item in todo:
        if os.path.lexists(os.path.join(staging, item["path"])):
            os.unlink(os.path.join(staging, item["path"]))
    paths = [(os.path.join(partial_root, f["path"]), os.path.join(staging, f["path"]))
             for f in todo]
    reporter = Reporter(paths, tell)
    start = reporter.current()
    tell("start", total=sum(f["size"] for f in todo), start=start, kept=len(good),
        removed=removed)
    reporter.start()
    try:
        for item, (partial, final) in zip(todo, paths, strict=True):
            sha = fetch_file(job, item, partial, token)
            if sha != item["sha256"]:
                os.unlink(partial)
                raise Refused("mismatch", f"the Hub served sha256 {sha[:12]}..., the lock file "
                              f"says {item['sha256'][:12]}...", item["path"], served=sha)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(partial, final)
            cache.put(final, os.stat(final), sha)  # the next check reads it no more
    finally:
        reporter.stop.set()
    downloaded = max(0, reporter.current() - start)
    tell("progress", done=reporter.current())
    shutil.rmtree(partial_root, ignore_errors=True)
    if not matches(root, job["staging"], files, cache):
        raise Refused("mismatch", "the pulled folder does not match the lock file")
    os.rename(staging, folder)
    cache.moved(staging, folder)
    return {"fetched": len(todo), "kept": len(good), "removed": removed,
            "downloaded": downloaded}


def kind_of(error):
    """What went wrong, in kit's words, from the client's exception and its causes."""
    seen, todo = set(), [error]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        name = type(current).__name__
        status = getattr(getattr(current, "response", None), "status_code", None)
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full"
        if status in (401, 403) or name == "GatedRepoError":
            return "unauthorized"  # the Hub answers 401 for a private model too
        if name in ("RepositoryNotFoundError", "RevisionNotFoundError"):
            return "not_found"
        if name in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
            return "entry_not_found"
        if "Connect" in name or "Timeout" in name or name in ("ProxyError", "NameResolutionError"):
            return "unreachable"
        todo += [current.__cause__, current.__context__]
    if isinstance(error, OSError):
        return "unreachable" if error.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                errno.ENETUNREACH) else "io"
    return "http" if "HTTP" in type(error).__name__ else "other"


def main():
    job_path, root = sys.argv[1], sys.argv[2]
    cache = HashCache(sys.argv[3] if len(sys.argv) > 3 else None)
    started = time.monotonic()
    with open(job_path) as stream:
        job = json.load(stream)
    token_path = os.path.join(os.path.dirname(job_path), "token")
    token = None
    if os.path.exists(token_path):
        with open(token_path) as stream:
            token = stream.read().strip() or None
    try:
        try:
            if job.get("check"):  # kit up: only what differs, nothing fetched or changed
                files = {f["path"]: f for f in job["files"]}
                outcome = {"problems": differences(root, job["folder"], files, cache)}
            else:
                outcome = pull(job, root, token, cache)
        finally:
            cache.save()  # what was hashed is kept, a failed pull's good files too
        say("result", **outcome, hashed=cache.hashed, hashed_bytes=cache.hashed_bytes,
            reused=cache.reused, seconds=round(time.monotonic() - started, 3))
    except Refused as refused:
        say("error", kind=refused.kind, detail=refused.detail, path=refused.path)
        sys.exit(FAILED)
    except Exception as error:  # the client's own, named for kit by kind_of
        say("error", kind=kind_of(error), detail=f"{type(error).__name__}: {error}",
            path="")
        sys.exit(FAILED)


if __name__ == "__main__":
    main()
