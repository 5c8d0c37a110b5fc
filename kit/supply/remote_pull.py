"""`kit pull` through a remote engine (`engine: ssh://…`): the download happens on the GPU
server, never through the operator's machine.

A throwaway container of the site's vLLM image (which carries `huggingface_hub`) runs kit's
own fetcher, kit/dataplane/fetcher/weights_fetch.py, with the image's python3: models_root bound at
/models (writable), the server's own network, HF_ENDPOINT in its environment. Everything it
needs goes in as one tar copied into the created container before it starts (`put_archive`):
the script, the job (the endpoint, the model, the locked commit and every locked file, the
folders as kit.weights.lock and kit.weights.pull name them) and, when there is one, the
token in a file of mode 0400, so `docker inspect` (which shows the environment) never shows
it. The fetcher's events stream back through the container's log into kit pull's own
progress line and summary; the container is removed afterwards whatever happens (Ctrl-C
too: the partial bytes stay on the server and the next run resumes them).

The server keeps its own hash cache (the rules of kit/dataplane/fetcher/weights_hashes.py, which the
fetcher shares with kit.weights.verify) in the site's `kit-weights-hashes` volume, mounted writable
in these throwaway containers only (never in a vLLM replica, whose model code may be hostile): a
pull leaves the hashes of what it fetched and verified there, and `kit up`'s check reads only
the files whose stat changed since.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TextIO

from kit.engine.desired import Mount, ServiceState, project_volume
from kit.engine.docker_api import show_pull
from kit.errors import BadInput, KitError
from kit.layout import SiteLayout
from kit.plan.build import MODELS_MOUNT
from kit.plan.host import model_below
from kit.site import Site
from kit.spec.model import Spec
from kit.weights import hub
from kit.weights.lock import LockedModel, locked_for, pinned_relative, read_lock
from kit.weights.pull import (
    FetchProgress,
    PullResult,
    fetch_job,
    models_to_pull,
    staging_folder,
)
from kit.weights.verify import link_problem

if TYPE_CHECKING:
    from collections.abc import Callable

    from kit.engine.docker_api import Engine

SCRIPT = "weights_fetch.py"
HASHING = "weights_hashes.py"  # the hash cache's rules, imported by the fetcher beside it
JOB_FOLDER = "kit-pull"  # in the container: /kit-pull/{weights_fetch.py,job.json,token}
HASHES_VOLUME = "kit-weights-hashes"  # per site (<site>_kit-weights-hashes): the server's cache
HASHES_MOUNT = "/kit-hashes"  # where the fetcher's containers mount it, writable
MARK = "KIT-PULL "  # the fetcher's event lines (kit/dataplane/fetcher/weights_fetch.py)
WAIT_S = 60  # for the container's exit once its log has ended
FETCHER_ARGV = ["python3", f"/{JOB_FOLDER}/{SCRIPT}", f"/{JOB_FOLDER}/job.json", MODELS_MOUNT,
                f"{HASHES_MOUNT}/weights-hashes.json"]
# what may reach the container: a token of the Hub's alphabet, an http(s) endpoint URL
TOKEN = re.compile(r"[A-Za-z0-9_.\-]{1,512}")
ENDPOINT = re.compile(r"https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~\-/]*)?")
PRINTABLE = re.compile(r"[^\x20-\x7e]+")  # what the container says, shown on one line


def helper_name(site: str) -> str:
    """One fixed name per site: a container an interrupted run left behind is replaced."""
    return f"{site}-kit-pull"


def token() -> str | None:
    """HF_TOKEN as the client finds it (the environment, or its own token file); BadInput when
    it is not a token (never printed)."""
    from huggingface_hub import get_token

    found = get_token()
    if found is not None and not TOKEN.fullmatch(found):
        raise BadInput("HF_TOKEN is not a Hugging Face token (letters, digits, '_', '-', '.')",
                       fix="set HF_TOKEN to the token the Hub shows under Settings → Access "
                       "Tokens, or unset it for a public model")
    return found


def endpoint() -> str:
    found = hub.endpoint()
    if not ENDPOINT.fullmatch(found):
        raise BadInput(f"HF_ENDPOINT {found!r} is not an http(s) URL kit hands to the server",
                       fix="set HF_ENDPOINT to the mirror's base URL, e.g. "
                       "https://hf-mirror.example.com, or unset it")
    return found


def job_archive(job_text: str, hub_token: str | None) -> bytes:
    """The tar copied into the container: the fetcher (and the hashing it imports), its job and
    the token (0400, root's)."""
    fetcher = resources.files("kit.dataplane.fetcher")
    members = [(name, fetcher.joinpath(name).read_bytes(), 0o444) for name in (SCRIPT, HASHING)]
    members.append(("job.json", job_text.encode(), 0o444))
    if hub_token is not None:
        members.append(("token", hub_token.encode(), 0o400))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(JOB_FOLDER)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(folder)
        for name, data, mode in members:
            info = tarfile.TarInfo(f"{JOB_FOLDER}/{name}")
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pull_site_remote(engine: Engine, spec: Spec, layout: SiteLayout, service: str | None,
                     out: TextIO) -> list[PullResult]:
    """`kit pull` through a remote engine: the models kit pull would fetch here
    (kit.weights.pull.models_to_pull), each fetched and verified on the engine's host."""
    return [pull_remote(engine, spec.images.vllm, spec.site, locked, spec.models_root,
                        str(pinned_relative(s)), out)
            for s, locked in models_to_pull(spec, layout, service).values()]


def pull_remote(engine: Engine, image: str, site: str, locked: LockedModel, models_root: Path,
                relative: str, out: TextIO) -> PullResult:
    """Pull one locked model into `models_root/relative` on the engine's host."""
    started = time.monotonic()
    hub_endpoint, hub_token = endpoint(), token()  # refused before anything runs
    folder = PurePosixPath(relative)
    staging = PurePosixPath(staging_folder(Path(relative)).as_posix())
    archive = job_archive(json.dumps(fetch_job(locked, folder, staging, hub_endpoint)),
                          hub_token)
    _ensure_image(engine, image, out)
    environment = {"HF_ENDPOINT": hub_endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONUNBUFFERED": "1"}
    events = _Events(locked.key, out)
    code = _run_fetcher(engine, site, image, models_root, archive, events, fetching=True,
                        environment=environment)
    result = events.result
    if events.error is not None or result is None or code != 0:
        raise _failure(events, code, locked, models_root, engine.address, image, hub_endpoint)
    removed = result.get("removed")
    return PullResult(locked.key, models_root / relative, fetched=_count(result, "fetched"),
                      kept=_count(result, "kept"),
                      removed=[str(p) for p in removed] if isinstance(removed, list) else [],
                      downloaded=_count(result, "downloaded"),
                      seconds=time.monotonic() - started)


def _run_fetcher(engine: Engine, site: str, image: str, models_root: Path, archive: bytes,
                 events: _Events, *, fetching: bool, environment: dict[str, str]) -> int | None:
    """The fetcher run once in a throwaway container (removed whatever happens), its events
    fed to `events`; its exit code, None when the container was removed under it. Fetching:
    the host's network and models_root writable; checking: no network, read-only. Both: the
    site's hash cache volume writable (made when missing)."""
    name, hashes = helper_name(site), project_volume(site, HASHES_VOLUME)
    try:
        try:
            engine.create_volume(hashes)
            engine.helper_start(name, image, FETCHER_ARGV, host_network=fetching, files=archive,
                                environment=environment, binds=(
                                    Mount("bind", str(models_root), MODELS_MOUNT, not fetching),
                                    Mount("volume", hashes.name, HASHES_MOUNT, False)))
        except KitError as error:
            if "bind source path does not exist" in error.message:
                raise BadInput(f"models_root {models_root} does not exist on the engine's host "
                               f"{engine.address}",
                               fix="create it there (a folder of its own, e.g. /srv/models), "
                               "or set models_root in the spec to that host's folder") from None
            raise
        with events:
            for chunk in engine.log_stream(name, follow=True, tail="all"):
                events.feed(chunk)
        try:
            return engine.helper_wait(name, WAIT_S)[0]
        except KitError:
            if events.result is not None or events.error is not None:
                raise
            return None  # removed under it (another kit, `docker rm -f`, the engine restarted)
    finally:
        engine.remove(name)


def check_pinned_remote(engine: Engine, site: Site, services: list[ServiceState],
                        report: Callable[[str], None]) -> None:
    """`kit up` through a remote engine, before anything starts: each pinned folder a starting
    service serves checked against site.lock on the engine's host (the fetcher, without network,
    models_root read-only: nothing is fetched or changed; only the files whose stat changed since
    they were hashed there are read), what it read told to `report`; BadInput naming every file
    that differs, with `kit pull SERVICE` as the fix."""
    pinned = {str(pinned_relative(s)): s for s in site.spec.services if s.revision is not None}
    serving = sorted({str(model_below(s, MODELS_MOUNT)) for s in services} & pinned.keys())
    if not serving:
        return
    lock = read_lock(site.layout.lock_file)
    problems = []
    for relative in serving:
        service = pinned[relative]
        locked = locked_for(lock, site.layout.lock_file, service)
        folder = PurePosixPath(relative)
        check = {**fetch_job(locked, folder, folder, ""), "check": True}
        events = _Events(locked.key, io.StringIO())
        started = time.monotonic()
        code = _run_fetcher(engine, site.spec.site, site.spec.images.vllm,
                            site.spec.models_root, job_archive(json.dumps(check), None), events,
                            fetching=False, environment={})
        result = events.result or {}
        found = result.get("problems")
        if code != 0 or not isinstance(found, list):
            raise _failure(events, code, locked, site.spec.models_root, engine.address,
                           site.spec.images.vllm, "")
        where = f"{site.spec.models_root}/{relative}"
        report(check_summary(service.name, where, engine.address, result,
                             time.monotonic() - started))
        problems += [f"service {service.name}: "
                     f"{_difference(where, item, locked, site.spec.models_root)}"
                     for item in found if isinstance(item, dict)]
    if problems:
        raise BadInput(f"pinned model folders on the engine's host {engine.address} do not "
                       "match site.lock:\n  " + "\n  ".join(problems),
                       fix="run `kit pull` (it fetches missing and changed files again on that "
                       "host and removes extra ones), then `kit up`")


def check_summary(service: str, folder: str, host: str, result: dict, seconds: float) -> str:
    """What a check on the server read: the files hashed (their bytes) and those its hash
    cache vouched for unchanged, the fetcher's own time there and the whole check's."""
    there = result.get("seconds")
    there = there if isinstance(there, int | float) and there >= 0 else 0.0
    return (f"service {service}: {folder} checked on {host}: {_count(result, 'hashed')} "
            f"file(s) hashed ({_count(result, 'hashed_bytes')} bytes), "
            f"{_count(result, 'reused')} unchanged in its hash cache; {there:.3f} s there, "
            f"{seconds:.1f} s in all")


def _difference(folder: str, item: dict, locked: LockedModel, models_root: Path) -> str:
    """One difference the fetcher reported, in the words of kit.weights.verify."""
    path = PRINTABLE.sub(" ", str(item.get("path", "")))[:300]
    expected = {f.path: f for f in locked.files}.get(path)
    says = (f" (the lock file says {expected.size} bytes, sha256 {expected.sha256[:12]}…)"
            if expected else "")
    kind = item.get("kind")
    if kind == "absent":
        return f"{folder} does not exist (the model is not pulled)"
    if kind == "extra":
        return (f"{folder}/{path} is not in the lock file (a stale or foreign file; vLLM may "
                "load it)")
    if kind == "size":
        return f"{folder}/{path} has {_count(item, 'size')} bytes{says}"
    if kind == "sha256":
        return f"{folder}/{path} has sha256 {str(item.get('sha256'))[:12]}…{says}"
    if kind == "not_a_file":
        return f"{folder}/{path} is not a regular file"
    if kind == "link_out":
        link = PRINTABLE.sub(" ", str(item.get("link", "")))[:300]
        target = PRINTABLE.sub(" ", str(item.get("target", "")))[:300]
        return link_problem(f"{folder}/{path}".removesuffix("/."), f"{models_root}/{link}",
                            target, models_root)
    return f"{folder}/{path} is missing{says}"


def _ensure_image(engine: Engine, image: str, out: TextIO) -> None:
    """The vLLM image on the server: pulled there, by its engine, when it is missing."""
    if engine.image_id(image) is not None:
        return
    out.write(f"image {image} is not on {engine.address}: pulling it there\n")
    show_pull(image, engine.pull(image), out)


def _count(event: dict, key: str) -> int:
    value = event.get(key)
    return value if type(value) is int and value >= 0 else 0


class _Events:
    """The fetcher's event lines, read as they arrive, driving kit pull's progress line."""

    def __init__(self, name: str, out: TextIO):
        self.progress = FetchProgress(name, out)  # the local pull's reading of the same events
        self.result: dict | None = None
        self.error: dict | None = None
        self.other: list[str] = []  # the last lines that were not events (a crash's traceback)
        self.pending = b""

    def __enter__(self) -> _Events:
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def feed(self, chunk: bytes) -> None:
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            self._line(line.decode(errors="replace"))

    def _line(self, line: str) -> None:
        if not line.startswith(MARK):
            self.other = [*self.other[-19:], PRINTABLE.sub(" ", line)[:300]]
            return
        try:
            event = json.loads(line[len(MARK):])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "start":
            self.progress.tell(kind, total=_count(event, "total"), start=_count(event, "start"))
        elif kind == "progress":
            self.progress.tell(kind, done=_count(event, "done"))
        elif kind == "result":
            self.result = event
        elif kind == "error":
            self.error = event


def _failure(events: _Events, code: int | None, locked: LockedModel, models_root: Path, host: str,
             image: str, hub_endpoint: str) -> KitError:
    """The fetcher's failure as kit pull names it locally: the cause, where, and the fix."""
    error = events.error or {}
    kind = str(error.get("kind", ""))
    detail = PRINTABLE.sub(" ", str(error.get("detail", "")))[:300]
    path = str(error.get("path") or "")
    what = f"{locked.key}: {path}" if path else locked.key
    where = f"on the engine's host {host}"
    if not error:
        tail = " | ".join(events.other[-5:])
        if "No module named 'huggingface_hub'" in tail:
            return KitError(f"{image} {where} has no huggingface_hub, which kit pull runs in",
                            fix="set images.vllm to a vLLM image (it carries huggingface_hub)")
        how = "its container was removed" if code is None else f"exit {code}"
        return KitError(f"{what}: the fetcher {where} stopped ({how}) before it finished"
                        + (f": {tail}" if tail else ""),
                        fix=f"run `kit pull` again: it resumes from the bytes already there "
                        f"(and make sure {image} has python3)")
    named: dict[str, tuple[type[KitError], str, str]] = {  # kind → (exit code's class, …)
        "unreachable": (KitError, f"cannot reach {hub_endpoint} {where} ({detail})",
                        "give that server a route to the Hub (or its proxy), or set "
                        "HF_ENDPOINT to a mirror it reaches; the partial bytes are kept"),
        "unauthorized": (BadInput, f"{hub_endpoint} refused access {where}: HF_TOKEN is wrong "
                         f"or unset, or may not read this model (private or gated) ({detail})",
                         hub.TOKEN_FIX),
        "not_found": (BadInput, f"no such model or revision on {hub_endpoint} (or it is "
                      f"private) ({detail})", "fix services[].model, or " + hub.TOKEN_FIX),
        "entry_not_found": (KitError, f"the file is not at that commit on {hub_endpoint}",
                            "run `kit lock` again: the lock file names a file the Hub does "
                            "not have"),
        "disk_full": (KitError, f"models_root {models_root} {where} is full ({detail})",
                      f"free space there (the model needs {locked.total_bytes / 1e9:.2f} GB), "
                      "then run `kit pull` again: it resumes"),
        "mismatch": (KitError, f"{detail} {where}",
                     "check HF_ENDPOINT (a mirror serving other bytes?); if the repository "
                     "changed, run `kit lock` and review the diff"),
        "conflict": (KitError, f"{detail} under {models_root} {where}",
                     "remove the one you do not want there, then run `kit pull` again"),
    }
    kind_of, message, fix = named.get(kind, (
        KitError, f"the fetch {where} failed: {detail}",
        "run `kit pull` again (it resumes); check HF_ENDPOINT and HF_TOKEN"))
    return kind_of(f"{what}: {message}", fix=fix)
