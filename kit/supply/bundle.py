"""`kit bundle` and `kit load`: everything an air-gapped server needs in one verified archive
(docs/offline.md).

The bundle is a plain tar (readable with `tar` before kit is installed there): `manifest.json`
first (the size and sha256 of every other member), then kit's wheels with their hash-pinned
requirements (kit/supply/wheelhouse.py), `site.lock`, the images (`docker save` through the
engine's API, one member each) and the pinned models' files, each verified against the lock
file as it is read. It is written whole or not at all.

`kit load` trusts nothing before it is checked: the manifest is read strictly (member names
allow-listed, no links, no paths out of their folders), every member is hashed in one pass
while the weights are unpacked into staging folders beside their final place, and only when
every member matches are the images loaded, the model folders renamed into place and the lock
file written. A bad bundle is exit 2 naming the member, with nothing changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, NamedTuple

from kit import __version__
from kit.engine.docker_api import Engine
from kit.errors import BadInput, KitError
from kit.files import atomic_write
from kit.layout import SiteLayout
from kit.names import IMAGE_REF, MODEL_REF, REVISION
from kit.spec.model import Service, Spec
from kit.weights.lock import (
    LockedModel,
    is_repo_path,
    lock_text,
    locked_for,
    model_dir,
    parse_lock,
    pinned,
    read_lock,
    write_lock,
)
from kit.weights.verify import CHUNK, HashCache, check_folder

BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
LOCK_MEMBER = "site.lock"
WHEELS = "wheels"  # kit's wheel, its dependencies' wheels and requirements.txt
REQUIREMENTS = f"{WHEELS}/requirements.txt"
IMAGES = "images"
WEIGHTS = "weights"  # weights/<org>/<name>@<revision>/<path>
IMAGE_MEMBER = re.compile(rf"{IMAGES}/[0-9]{{2}}\.tar")
WHEEL_MEMBER = re.compile(rf"{WHEELS}/[A-Za-z0-9_.+-]+\.whl")
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 16 << 20
BLOCK = tarfile.BLOCKSIZE
BAD_BUNDLE_FIX = ("make the bundle again on the connected machine (`kit bundle SPEC --out FILE`) "
                  "and copy it whole; compare `sha256sum FILE` on both machines")

Wheelhouse = Callable[[Path], list[Path]]  # fills a folder with wheels + requirements.txt


class Member(NamedTuple):
    """One file of the bundle as the manifest describes it."""

    name: str
    size: int
    sha256: str


class BundledImage(NamedTuple):
    """An image's `docker save` member, its reference and the id it must load as."""

    member: str
    ref: str
    image_id: str


@dataclass(frozen=True)
class Manifest:
    site: str
    kit_version: str
    members: tuple[Member, ...]
    images: tuple[BundledImage, ...]
    models: tuple[str, ...]  # lock keys, org/name@revision

    def text(self) -> bytes:
        return (json.dumps({
            "version": BUNDLE_VERSION, "site": self.site, "kit": self.kit_version,
            "members": [{"name": m.name, "size": m.size, "sha256": m.sha256}
                        for m in self.members],
            "images": [{"member": i.member, "ref": i.ref, "id": i.image_id}
                       for i in self.images],
            "models": list(self.models),
        }, indent=1) + "\n").encode()


def needed_images(spec: Spec) -> list[str]:
    """The images this site's stack runs (the plan copies them from `images:`): vLLM (also the
    usage collector's), nginx (the door and its verifier), certbot with ACME, Prometheus and
    Grafana with observability."""
    images = [spec.images.vllm, spec.images.nginx]
    if spec.tls.mode == "acme":
        images.append(spec.images.certbot)
    if spec.observability.enabled:
        images += [spec.images.prometheus, spec.images.grafana]
    return list(dict.fromkeys(images))


def _weights_member(key: str, path: str) -> str:
    return f"{WEIGHTS}/{key}/{path}"


# ----------------------------------------------------------------------------- kit bundle


@dataclass
class BundleResult:
    path: Path
    size: int
    manifest_sha256: str
    images: list[str]
    models: list[str]
    wheels: int
    seconds: float

    def summary(self) -> str:
        return (f"wrote {self.path}: {len(self.images)} image(s), {len(self.models)} pinned "
                f"model(s), {self.wheels} wheel(s), {self.size / 1e9:.2f} GB in "
                f"{self.seconds:.1f} s\nmanifest sha256 {self.manifest_sha256} (check it on the "
                f"server: `kit load {self.path.name} SPEC --manifest-sha256 "
                f"{self.manifest_sha256}`)")


def bundle_site(spec: Spec, layout: SiteLayout, engine: Engine, out: Path,
                wheelhouse: Wheelhouse | None, report: Callable[[str], None]) -> BundleResult:
    """`kit bundle`: the site's images (from `engine`), its pinned models (from models_root,
    verified against site.lock first), site.lock and, unless `wheelhouse` is None, kit's
    wheels, written to `out` whole or not at all."""
    started = time.monotonic()
    if out.exists() and not out.is_file():
        raise BadInput(f"{out} exists and is not a file", fix="name a new file with --out")
    models = _verified_models(spec, layout)
    images = needed_images(spec)
    ids = {ref: engine.image_id(ref) for ref in images}
    missing = [ref for ref, image_id in ids.items() if image_id is None]
    if missing:
        raise BadInput(f"the engine ({engine.address}) lacks image(s) the site needs: "
                       f"{', '.join(missing)}",
                       fix="pull or build them on this connected machine first (`docker pull "
                       "IMAGE`, or `kit up` here), then bundle again")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as scratch:
        staged: list[tuple[Member, Path]] = []
        wheels = 0
        if wheelhouse is not None:
            report("kit's wheel and its dependencies (pip, hash-pinned)")
            for path in sorted(wheelhouse(Path(scratch, WHEELS))):
                name = f"{WHEELS}/{path.name}"
                if not (WHEEL_MEMBER.fullmatch(name) or name == REQUIREMENTS):
                    raise KitError(f"the wheelhouse made {path.name}, not a wheel",
                                   fix="report this: kit bundles wheels only")
                staged.append((_member_of(name, path), path))
                wheels += name != REQUIREMENTS
        if models:
            lock = Path(scratch, LOCK_MEMBER)
            lock.write_text(lock_text(list(models)))
            staged.append((_member_of(LOCK_MEMBER, lock), lock))
        bundled = []
        for index, ref in enumerate(images):
            name = f"{IMAGES}/{index:02d}.tar"
            report(f"saving image {ref}")
            saved = Path(scratch, name)
            saved.parent.mkdir(exist_ok=True)
            with saved.open("wb") as stream:
                for chunk in engine.save_image(ref):
                    stream.write(chunk)
            staged.append((_member_of(name, saved), saved))
            bundled.append(BundledImage(name, ref, str(ids[ref])))
        weights = [(Member(_weights_member(m.key, f.path), f.size, f.sha256),
                    model_dir(spec.models_root, service) / f.path)
                   for m, service in models.items() for f in m.files]
        manifest = Manifest(spec.site, __version__, tuple(m for m, _ in staged + weights),
                            tuple(bundled), tuple(m.key for m in models))
        text = manifest.text()
        report(f"writing {out}")
        atomic_write(out, _tar_chunks(text, staged + weights))
    return BundleResult(out, out.stat().st_size, hashlib.sha256(text).hexdigest(),
                        images, [m.key for m in models], wheels, time.monotonic() - started)


def _verified_models(spec: Spec, layout: SiteLayout) -> dict[LockedModel, Service]:
    """Each pinned model's lock entry → a service that pins it, every folder checked against
    the lock file first (BadInput naming each file that differs)."""
    pinned = [s for s in spec.services if s.revision is not None]
    if not pinned:
        return {}
    lock = read_lock(layout.lock_file)
    cache = HashCache(layout.weights_hashes)
    models: dict[LockedModel, Service] = {}
    problems = []
    for service in pinned:
        locked = locked_for(lock, layout.lock_file, service)
        if locked in models:
            continue
        models[locked] = service
        problems += [p.message for p in check_folder(model_dir(spec.models_root, service),
                                                     locked, cache, spec.models_root)]
    if problems:
        raise BadInput("the pinned models here do not match site.lock:\n  " +
                       "\n  ".join(problems),
                       fix="run `kit pull` on this machine first; the bundle carries only "
                       "verified files")
    return models


def _member_of(name: str, path: Path) -> Member:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return Member(name, path.stat().st_size, digest.hexdigest())


def _tar_chunks(manifest: bytes, members: list[tuple[Member, Path]]) -> Iterator[bytes]:
    """The bundle as tar blocks: the manifest first, then each member read and hashed as it
    is written (a file that changed since it was checked stops the bundle, naming it)."""
    yield _header(MANIFEST, len(manifest)) + manifest + _padding(len(manifest))
    for member, path in members:
        yield _header(member.name, member.size)
        digest = hashlib.sha256()
        done = 0
        with path.open("rb") as stream:
            while done < member.size and (chunk := stream.read(min(CHUNK, member.size - done))):
                digest.update(chunk)
                done += len(chunk)
                yield chunk
        if done != member.size or digest.hexdigest() != member.sha256:
            raise KitError(f"{path} changed while it was bundled (it no longer matches "
                           "site.lock)", fix="let whatever writes it finish, run `kit pull`, "
                           "then bundle again")
        yield _padding(member.size)
    yield bytes(2 * BLOCK)


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


# ----------------------------------------------------------------------------- kit load


@dataclass
class LoadResult:
    images: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)  # model folders renamed into place
    kept: list[str] = field(default_factory=list)  # already there and verified
    skipped: list[str] = field(default_factory=list)  # bundled, but the spec does not pin them
    lock_written: bool = False
    wheels: Path | None = None

    def summary(self, layout: SiteLayout) -> str:
        lines = [f"loaded image {ref}" for ref in self.images]
        lines += [f"placed {key} (verified against site.lock)" for key in self.placed]
        lines += [f"kept {key} (already there and verified)" for key in self.kept]
        lines += [f"skipped {key} (the spec does not pin it: no folder, no lock entry)"
                  for key in self.skipped]
        if self.lock_written:
            lines.append(f"wrote {layout.lock_file}")
        if self.wheels is not None:
            lines.append(f"kit's wheels in {self.wheels}; install them offline with\n  pip "
                         f"install --no-index --find-links {self.wheels} --require-hashes -r "
                         f"{self.wheels / 'requirements.txt'}")
        return "\n".join(lines) or "nothing to load"


def read_manifest(stream: IO[bytes] | None, size: int, bundle: Path,
                  expected_sha256: str | None) -> Manifest:
    """The bundle's manifest, read strictly: every name allow-listed, every image and model
    described once (BadInput naming what is wrong)."""
    if stream is None or size > MAX_MANIFEST_BYTES:
        raise _bad(bundle, MANIFEST, "is not a regular file of at most 16 MB")
    raw = stream.read(size)
    if expected_sha256 is not None and hashlib.sha256(raw).hexdigest() != expected_sha256:
        raise _bad(bundle, MANIFEST, f"has sha256 {hashlib.sha256(raw).hexdigest()}, not the "
                   f"{expected_sha256} given with --manifest-sha256")
    try:
        document = json.loads(raw)
        return _manifest(document)
    except RecursionError:
        raise _bad(bundle, MANIFEST, "is not a kit bundle manifest (nested deeper than Python "
                   "reads)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise _bad(bundle, MANIFEST, f"is not a kit bundle manifest ({error})") from None


def _manifest(document: dict) -> Manifest:
    if document["version"] != BUNDLE_VERSION:
        raise ValueError(f"version {document['version']!r}, this kit reads {BUNDLE_VERSION}")
    members = tuple(Member(str(m["name"]), m["size"], str(m["sha256"]))
                    for m in document["members"])
    models = tuple(str(key) for key in document["models"])
    for key in models:  # each a pinned folder's path under models_root (kit.weights.lock)
        model, _, revision = key.rpartition("@")
        if not (re.fullmatch(MODEL_REF.strip("^$"), model) and "/" in model
                and re.fullmatch(REVISION.strip("^$"), revision)):
            raise ValueError(f"model {key!r} is not org/name@revision")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError("a member is listed twice")
    for member in members:
        if type(member.size) is not int or member.size < 0 or not SHA256.fullmatch(
                member.sha256):
            raise ValueError(f"member {member.name!r} needs a size and a 64-hex sha256")
        if not _allowed(member.name, models):
            raise ValueError(f"member {member.name!r} is not a name a kit bundle holds")
    images = tuple(BundledImage(str(i["member"]), str(i["ref"]), str(i["id"]))
                   for i in document["images"])
    for image in images:
        if (image.member not in names or not IMAGE_MEMBER.fullmatch(image.member)
                or not re.fullmatch(IMAGE_REF.strip("^$"), image.ref)
                or not IMAGE_ID.fullmatch(image.image_id)):
            raise ValueError(f"image entry {image.ref!r} is malformed")
    if {i.member for i in images} != {n for n in names if n.startswith(f"{IMAGES}/")}:
        raise ValueError("the images and their members differ")
    if models and LOCK_MEMBER not in names:
        raise ValueError("it holds models without site.lock")
    return Manifest(str(document["site"]), str(document["kit"]), members, images, models)


def _allowed(name: str, models: tuple[str, ...]) -> bool:
    if name in (LOCK_MEMBER, REQUIREMENTS) or IMAGE_MEMBER.fullmatch(name) or \
            WHEEL_MEMBER.fullmatch(name):
        return True
    return any(name.startswith(f"{WEIGHTS}/{key}/") and
               is_repo_path(name[len(f"{WEIGHTS}/{key}/"):]) for key in models)


def _bad(bundle: Path, member: str, what: str) -> BadInput:
    return BadInput(f"{bundle}: {member} {what}; nothing was loaded", fix=BAD_BUNDLE_FIX)


class _Hashing:
    """A member's stream hashed as it is read (`docker load` reads it through this)."""

    def __init__(self, stream: IO[bytes], size: int):
        self.stream, self.size, self.digest = stream, size, hashlib.sha256()

    def __len__(self) -> int:  # requests sends a Content-Length, not chunks
        return self.size

    def read(self, count: int = -1) -> bytes:
        chunk = self.stream.read(count)
        self.digest.update(chunk)
        return chunk


def load_bundle(bundle: Path, spec: Spec, layout: SiteLayout, engine: Engine,
                expected_sha256: str | None, report: Callable[[str], None]) -> LoadResult:
    """`kit load`: verify every member of `bundle`, then load its images into `engine`, place
    its models under the spec's models_root and merge its lock entries into site.lock."""
    if not bundle.is_file():
        raise BadInput(f"{bundle} is not a file", fix="name the file `kit bundle` wrote")
    with ExitStack() as cleanup:
        try:
            tar = cleanup.enter_context(tarfile.open(bundle, "r:"))
            first = tar.next()
        except (tarfile.TarError, OSError) as error:
            raise _bad(bundle, "the archive", f"cannot be read ({error})") from None
        if first is None or first.name != MANIFEST or not first.isreg():
            raise _bad(bundle, MANIFEST, "is not the archive's first member")
        manifest = read_manifest(tar.extractfile(first), first.size, bundle, expected_sha256)
        wanted = set(manifest.models) & set(pinned(spec.services))
        _check_room(bundle, manifest, wanted, Path(spec.models_root))
        if wanted and not engine.is_local:
            raise BadInput(f"the bundle holds model weights and {engine.address} is a remote "
                           "engine: kit places weights in models_root on this machine only",
                           fix="copy the bundle to the server and run `kit load` there")
        cache = HashCache(layout.weights_hashes)
        staging = _Staging(spec, manifest, wanted, cache, cleanup)
        lock, wheels, image_members = _verify_members(tar, bundle, manifest, staging, report)
        bundled_lock = {key: entry for key, entry in _bundled_lock(lock, bundle, manifest).items()
                        if key in wanted}
        merged = _merged_lock(layout, bundled_lock)
        staging.check(bundled_lock, bundle)
        result = LoadResult(skipped=sorted(set(manifest.models) - wanted))
        member_sha = {m.name: m.sha256 for m in manifest.members}
        for image in manifest.images:
            report(f"loading image {image.ref}")
            member = image_members[image.member]
            reader = _Hashing(tar.extractfile(member), member.size)  # type: ignore[arg-type]
            engine.load_images(reader)  # type: ignore[arg-type]
            if reader.digest.hexdigest() != member_sha[image.member]:
                raise KitError(f"{bundle}: {image.member} changed while it was loaded (its "
                               "sha256 differs from the verified one)", fix=BAD_BUNDLE_FIX +
                               f"; remove {image.ref} from the engine (`docker rmi`)")
            if engine.image_id(image.ref) != image.image_id:
                raise KitError(f"{bundle}: after loading {image.member}, {image.ref} is "
                               f"{engine.image_id(image.ref)}, not {image.image_id}",
                               fix=BAD_BUNDLE_FIX)
            result.images.append(image.ref)
        result.placed, result.kept = staging.place(bundled_lock)
        if bundled_lock:
            write_lock(layout.lock_file, list(merged.values()))
            result.lock_written = True
        if wheels is not None:
            result.wheels = _place_wheels(wheels, layout)
        return result
    raise AssertionError("unreachable")  # ExitStack does not swallow errors


def _verify_members(tar: tarfile.TarFile, bundle: Path, manifest: Manifest,
                    staging: _Staging, report: Callable[[str], None],
                    ) -> tuple[bytes, Path | None, dict[str, tarfile.TarInfo]]:
    """One pass over the archive: each member a regular file the manifest lists once, with
    its size and sha256; weights unpacked into staging, wheels into a scratch folder."""
    expected = {m.name: m for m in manifest.members}
    seen: set[str] = set()
    lock = b""
    wheels: Path | None = None
    images: dict[str, tarfile.TarInfo] = {}
    refs = {image.member: image.ref for image in manifest.images}
    report(f"verifying {bundle} ({len(expected)} member(s))")
    try:
        while (info := tar.next()) is not None:  # after the manifest
            member = expected.get(info.name)
            if member is None or info.name in seen:
                raise _bad(bundle, info.name, "is not in the manifest" if member is None
                           else "appears twice")
            if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or info.issparse() \
                    or info.size != member.size:
                raise _bad(bundle, info.name, f"is not a regular file of {member.size} bytes")
            seen.add(info.name)
            stream = tar.extractfile(info)
            assert stream is not None
            target: IO[bytes] | None = None
            with ExitStack() as files:
                if staging.unpacks(info.name):
                    target = files.enter_context(staging.open(info.name))
                elif info.name.startswith(f"{WHEELS}/"):
                    wheels = wheels or staging.scratch(WHEELS)
                    target = files.enter_context(Path(wheels, Path(info.name).name).open("wb"))
                elif info.name == LOCK_MEMBER:
                    target = io.BytesIO()
                sha = _copy(stream, target)
                if info.name == LOCK_MEMBER:
                    lock = target.getvalue()  # type: ignore[union-attr]
            if sha != member.sha256:
                raise _bad(bundle, info.name, f"has sha256 {sha[:12]}…, the manifest says "
                           f"{member.sha256[:12]}… (changed or damaged)")
            if staging.unpacks(info.name):
                staging.hashed(info.name, sha)  # check_folder then only stats it
            if info.name.startswith(f"{IMAGES}/"):
                _check_tags(bundle, info.name, tar.extractfile(info), refs[info.name])
                images[info.name] = info
    except (tarfile.TarError, EOFError) as error:
        raise _bad(bundle, "the archive", f"is damaged ({error})") from None
    except OSError as error:
        raise KitError(f"reading {bundle} or unpacking it under {staging.root} failed: {error}",
                       fix="check the disk (free space, permissions) and run `kit load` again; "
                       "nothing was loaded") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise _bad(bundle, missing[0], "is in the manifest but not in the archive (truncated?)")
    return lock, wheels, images


def _copy(stream: IO[bytes], target: IO[bytes] | None) -> str:
    """sha256 of `stream`, copied to `target` as it is read."""
    digest = hashlib.sha256()
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        if target is not None:
            target.write(chunk)
    return digest.hexdigest()


def _check_room(bundle: Path, manifest: Manifest, wanted: set[str], models_root: Path) -> None:
    """Before anything is written: the members the manifest declares must fit in the archive
    (a tar holds each one's bytes, so a manifest claiming more than the file's size lies), and
    the weights kit will unpack must fit in models_root's free space, the wheels in /tmp's."""
    declared = sum(BLOCK + m.size + len(_padding(m.size)) for m in manifest.members)
    size = bundle.stat().st_size
    if declared > size:
        raise _bad(bundle, MANIFEST, f"declares {declared:,} bytes of members; the archive is "
                   f"{size:,} bytes (damaged, truncated or forged)")
    needs = {models_root: sum(m.size for m in manifest.members
                              if any(m.name.startswith(f"{WEIGHTS}/{k}/") for k in wanted)),
             Path(tempfile.gettempdir()): sum(m.size for m in manifest.members
                                               if m.name.startswith(f"{WHEELS}/"))}
    for folder, needed in needs.items():
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        if needed > free:
            raise BadInput(f"{bundle}: unpacking needs {needed:,} bytes under {folder}, which "
                           f"has {free:,} free; nothing was loaded",
                           fix=f"free space under {existing} (or point models_root at a larger "
                           "disk) and run `kit load` again")


# an image archive's files that name tags: `docker load` applies them (manifest.json's RepoTags;
# `repositories`, the legacy format's; index.json's annotations, the OCI layout's)
NAMING_FILES = ("manifest.json", "repositories", "index.json")
IMAGE_NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


def _image_names(stream: IO[bytes]) -> set[str]:
    """Every tag a `docker save` archive's files would give `docker load` (ValueError when a
    reader could see another archive than this one: a naming file that is a link or written
    through one, a PAX global header, anything but zeros after the end Python reads)."""
    names: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r:") as image:  # seeks: reads headers, not layers
        links: set[str] = set()
        for info in image:
            path = posixpath.normpath(info.name.lstrip("/"))
            if any(parent in links for parent in _parents(path)):
                raise ValueError(f"{info.name} is written through a link")
            if info.issym() or info.islnk():
                links.add(path)
            if path in NAMING_FILES:
                if not info.isreg() or info.size > MAX_MANIFEST_BYTES:
                    raise ValueError(f"{info.name} is not a regular file of at most 16 MB")
                names |= _tags_in(path, image.extractfile(info).read())  # type: ignore
        if image.pax_headers:  # Python applies a global header to what follows, Go does not
            raise ValueError("it holds a PAX global header")
        stream.seek(image.offset)
        while chunk := stream.read(CHUNK):  # Python stopped here; Go reads on past non-zeros
            if chunk.count(0) != len(chunk):
                raise ValueError(f"it holds data after its end (at byte {image.offset})")
    if not names:
        raise ValueError("it names no image (no manifest.json): not a `docker save` archive")
    return names


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _tags_in(name: str, text: bytes) -> set[str]:
    document = json.loads(text)
    if name == "manifest.json":
        return {str(tag) for image in document for tag in image.get("RepoTags") or ()}
    if name == "repositories":
        return {f"{repo}:{tag}" for repo, tags in document.items() for tag in tags}
    found = set()
    for descriptor in document["manifests"]:  # containerd's import: the first name there is
        annotations = descriptor.get("annotations") or {}
        names = [annotations[key] for key in IMAGE_NAME_ANNOTATIONS if annotations.get(key)]
        found |= {str(names[0])} if names else set()
    return found


def _check_tags(bundle: Path, member: str, stream: IO[bytes] | None, ref: str) -> None:
    """Refuses an image member that would tag anything but its own reference."""
    try:
        tags = _image_names(stream)  # type: ignore[arg-type]
    except (tarfile.TarError, ValueError, KeyError, TypeError, AttributeError,
            RecursionError) as error:
        raise _bad(bundle, member, f"is not an image archive kit can check ({error})") from None
    own = _canonical(ref)
    foreign = sorted(t for t in tags if _canonical(t) != own)
    if foreign:
        raise _bad(bundle, member, f"would tag {', '.join(foreign)} on the engine; the "
                   f"manifest names it {ref} only (a bundle re-points no other image)")


def _canonical(ref: str) -> str:
    """An image reference in the engine's full form: `nginx:1.27` is
    `docker.io/library/nginx:1.27`, a reference without a tag is `:latest`."""
    name = ref.partition("@")[0]
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}"
    if name.count("/") == 1 and name.startswith("docker.io/"):
        name = name.replace("docker.io/", "docker.io/library/", 1)
    if ":" not in name.rpartition("/")[2]:
        name += ":latest"
    return name


def _bundled_lock(text: bytes, bundle: Path, manifest: Manifest) -> dict[str, LockedModel]:
    if not manifest.models:
        return {}
    try:
        lock = parse_lock(text.decode(), f"{bundle}: {LOCK_MEMBER}")
    except UnicodeDecodeError as error:
        raise _bad(bundle, LOCK_MEMBER, f"is not a kit lock file ({error})") from None
    except BadInput as error:
        raise BadInput(f"{error.message}\nnothing was loaded", fix=BAD_BUNDLE_FIX) from None
    for key in manifest.models:
        entry = lock.get(key)
        files = {_weights_member(key, f.path): f for f in entry.files} if entry else {}
        listed = {m.name: m for m in manifest.members if m.name.startswith(f"{WEIGHTS}/{key}/")}
        if entry is None or set(files) != set(listed) or any(
                (f.size, f.sha256) != (listed[name].size, listed[name].sha256)
                for name, f in files.items()):
            raise _bad(bundle, f"{WEIGHTS}/{key}", "does not hold exactly the files its site.lock "
                       "entry lists")
    return {key: lock[key] for key in manifest.models}


def _merged_lock(layout: SiteLayout, bundled: dict[str, LockedModel]) -> dict[str, LockedModel]:
    """The site's lock entries with the bundle's added; an entry the site already pins
    differently is refused (the reviewed lock file here wins over a bundle)."""
    current = read_lock(layout.lock_file) or {}
    for key, entry in bundled.items():
        if key in current and current[key] != entry:
            raise BadInput(f"{layout.lock_file} pins {key} at commit {current[key].commit} with "
                           f"other files than the bundle (commit {entry.commit}); nothing was "
                           "loaded", fix="bundle from the spec and site.lock reviewed for this "
                           "server, or remove that entry here if the bundle's is the one you "
                           "want")
    return {**current, **bundled}


class _Staging:
    """The bundle's weights unpacked beside their final folders (same file system, so each
    becomes its folder by one rename), removed again unless placed."""

    def __init__(self, spec: Spec, manifest: Manifest, wanted: set[str], cache: HashCache,
                 cleanup: ExitStack):
        self.root = Path(spec.models_root)
        self.manifest = manifest
        self.wanted = wanted
        self.cache = cache
        self.folders: dict[str, Path] = {}
        self.scratches: list[Path] = []
        cleanup.callback(self._remove)

    def _final(self, key: str) -> Path:
        return self.root / key  # a lock key is the pinned folder's path (kit.weights.lock)

    def _key(self, member: str) -> str | None:
        return next((k for k in self.manifest.models if member.startswith(f"{WEIGHTS}/{k}/")),
                    None)

    def unpacks(self, member: str) -> bool:
        """A weights member of a model the spec pins (the others are only hashed)."""
        return self._key(member) in self.wanted

    def _path(self, member: str) -> Path:
        key = self._key(member)
        assert key is not None
        return self.folder(key) / member[len(f"{WEIGHTS}/{key}/"):]

    def folder(self, key: str) -> Path:
        if key not in self.folders:
            final = self._final(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            self.folders[key] = Path(tempfile.mkdtemp(dir=final.parent,
                                                      prefix=f".{final.name}.load-"))
        return self.folders[key]

    def scratch(self, name: str) -> Path:
        folder = Path(tempfile.mkdtemp(prefix=f"kit-load-{name}-"))
        self.scratches.append(folder)
        return folder

    def open(self, member: str) -> BinaryIO:
        path = self._path(member)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("xb")

    def hashed(self, member: str, sha256: str) -> None:
        path = self._path(member)
        self.cache.put(path, path.stat(), sha256)

    def check(self, lock: dict[str, LockedModel], bundle: Path) -> None:
        for key, entry in lock.items():
            problems = check_folder(self.folder(key), entry, self.cache, self.root)
            if problems:
                raise _bad(bundle, f"{WEIGHTS}/{key}", "does not match its site.lock entry: " +
                           "; ".join(p.message for p in problems))

    def place(self, lock: dict[str, LockedModel]) -> tuple[list[str], list[str]]:
        cache = self.cache
        placed, kept = [], []
        for key, entry in lock.items():
            final, staged = self._final(key), self.folders[key]
            if final.is_dir() and not check_folder(final, entry, cache, self.root):
                kept.append(key)
                continue
            old = None
            if final.exists():  # a folder that no longer matches: replaced, then removed
                old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
                os.rename(final, old / "folder")
            os.rename(staged, final)
            cache.moved(staged, final)
            del self.folders[key]
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            placed.append(key)
        cache.save()
        return placed, kept

    def _remove(self) -> None:
        """What was not placed goes, and an <org> folder made for it when left empty."""
        for folder in [*self.folders.values(), *self.scratches]:
            shutil.rmtree(folder, ignore_errors=True)
        for folder in self.folders.values():
            with suppress(OSError):
                folder.parent.rmdir()


def _place_wheels(scratch: Path, layout: SiteLayout) -> Path:
    """kit's wheels in `<site>/kit-wheels/` (replaced whole), for an offline pip install."""
    target = layout.root / "kit-wheels"
    staged = Path(tempfile.mkdtemp(dir=layout.root, prefix=".kit-wheels."))
    for path in scratch.iterdir():
        shutil.copyfile(path, staged / path.name)
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=layout.root, prefix=".kit-wheels.old-"))
        os.rename(target, old / "wheels")
    os.rename(staged, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
