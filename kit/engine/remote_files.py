"""Site files for an engine on another host: delivered through the Docker API into volumes.

The rendered compose file bind-mounts site folders (`../nginx`, `../nginx/verifier`,
`../nginx/auth`): right where the engine shares the site's disk, and unchanged for local sites
(plain `docker compose` runs the bundled example as before). A remote engine cannot see the
laptop's folder, and kit copies nothing by scp or a shared disk. So for a remote engine each
such bind becomes a named volume on the remote, `<project>_kit-files-<folder>`, mounted where
the folder was, and kit fills it through the engine itself:

1. the files go as one tar into a throwaway helper container (the proxy image, no network)
   that mounts the volumes: the engine unpacks it into a staging folder INSIDE each volume;
2. the helper renames every staged file over its live name (`mv` on one filesystem is
   rename(2): a reader sees the old file or the new one, never half of one) and deletes the
   live files that are no longer in the site.

Containers mount the volume, a folder, never a single file, so a replaced file is what a
running nginx reads on its next reload (the single-file bind-mount trap cannot happen). Model
folders and caches (absolute sources) stay binds of the remote host's own paths.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kit.engine.desired import (
    COMPOSE_VERSION,
    CONFIG_HASH_LABEL,
    DEPENDS_ON_LABEL,
    PROJECT_LABEL,
    PROXY_SERVICE,
    VERSION_LABEL,
    VOLUME_LABEL,
    DesiredState,
    VolumeState,
    config_hash,
)
from kit.errors import BadInput, KitError

if TYPE_CHECKING:
    from kit.engine.docker_api import Engine

SITE_FILES_LABEL = "io.kit.site-files"  # on each volume: the site folder it mirrors
MOUNT_ROOT = "/kit-files"  # where the helper mounts each volume (MOUNT_ROOT/<key>)
STAGING = ".kit-incoming"  # the staging folder inside each volume (same filesystem: rename)
DELIVER_TIMEOUT = 60  # seconds the helper may take
# $1…: the volume keys. Stale files go first, then every staged file is renamed into place.
INSTALL = f"""set -eu
for key in "$@"; do
  cd "{MOUNT_ROOT}/$key"
  find . -path ./{STAGING} -prune -o -type f -print | while read -r f; do
    [ -e "{STAGING}/$f" ] || rm -f "$f"
  done
  (cd {STAGING} && find . -type d) | while read -r d; do mkdir -p "$d"; done
  (cd {STAGING} && find . -type f) | while read -r f; do mv -f "{STAGING}/$f" "$f"; done
  rm -rf {STAGING}
done
echo delivered "$@"
"""


def volume_key(folder: Path) -> str:
    """`nginx/verifier` → `kit-files-nginx-verifier` (the compose-style volume key)."""
    return "kit-files-" + re.sub(r"[^a-z0-9]+", "-", folder.as_posix().lower()).strip("-")


def through_engine(desired: DesiredState, site_root: Path) -> DesiredState:
    """`desired` with every bind of a site folder replaced by that folder's volume.

    The config hashes are recomputed (the engine is given volumes, not binds), so a stack
    created by one form is recreated by the other. A writable bind of a site folder (certbot
    writing the certificate of tls.mode acme) cannot be mirrored one way: refused.
    """
    site_root = site_root.resolve()
    owner = {PROJECT_LABEL: desired.project, VERSION_LABEL: COMPOSE_VERSION}
    folders: dict[str, VolumeState] = {}
    services = []
    for service in desired.services:
        mounts = []
        for mount in service.config.mounts:
            source = Path(mount.source)
            if mount.type == "bind" and source.is_relative_to(site_root):
                if not mount.read_only:
                    raise BadInput(
                        f"service {service.name} writes into the site folder {source}, which a "
                        "remote engine cannot share with this host",
                        fix="with engine: ssh://…, use tls.mode self-signed or files (acme "
                        "needs kit to run on the server itself)",
                    )
                relative = source.relative_to(site_root)
                key = volume_key(relative)
                volume = folders.setdefault(key, VolumeState(
                    key, f"{desired.project}_{key}",
                    {**owner, VOLUME_LABEL: key, SITE_FILES_LABEL: relative.as_posix()},
                ))
                mount = replace(mount, type="volume", source=volume.name)
            mounts.append(mount)
        config = replace(service.config, mounts=tuple(mounts))
        identity = {k: v for k, v in service.labels.items()
                    if k not in (CONFIG_HASH_LABEL, DEPENDS_ON_LABEL)}
        digest = config_hash(
            config, identity, None if service.reloadable else service.site_files_digest,
            live_networks=service.reloadable,
        )
        services.append(replace(service, config=config, config_hash=digest,
                                labels={**service.labels, CONFIG_HASH_LABEL: digest}))
    return replace(desired, services=tuple(services),
                   volumes=desired.volumes + tuple(folders.values()))


def site_volumes(desired: DesiredState) -> list[VolumeState]:
    return [v for v in desired.volumes if SITE_FILES_LABEL in v.labels]


def deliver(engine: Engine, desired: DesiredState, site_root: Path) -> list[str]:
    """Fill the site-file volumes on the engine's host from the local site folder; the keys
    delivered. KitError naming the volume when the helper fails (nothing half-installed: a
    file is either renamed into place or still staged)."""
    volumes = site_volumes(desired)
    if not volumes:
        return []
    existing = {v.get("Name") for v in engine.volumes([f"{PROJECT_LABEL}={desired.project}"])}
    for volume in volumes:
        if volume.name not in existing:
            engine.create_volume(volume)
    archive = pack({v.key: site_root / v.labels[SITE_FILES_LABEL] for v in volumes})
    helper = f"{desired.project}-kit-files"
    code, log = engine.run_with_files(
        helper, desired.service(PROXY_SERVICE).config.image,
        ["sh", "-c", INSTALL, "sh", *(v.key for v in volumes)],
        {v.name: f"{MOUNT_ROOT}/{v.key}" for v in volumes}, archive,
        {PROJECT_LABEL: desired.project}, DELIVER_TIMEOUT,
    )
    if code != 0:
        raise KitError(
            f"installing the site files on the engine's host failed (helper {helper} exited "
            f"{code}): {log.strip()[-500:]}",
            fix="run the command again; `kit down` then `kit up` rebuilds the volumes",
        )
    return [v.key for v in volumes]


def pack(folders: dict[str, Path]) -> bytes:
    """One tar: every file below each folder under kit-files/<key>/.kit-incoming/, with its
    mode and owner (what a bind mount would have shown the container)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, folder in folders.items():
            staged = f"{MOUNT_ROOT.strip('/')}/{key}/{STAGING}"
            for path in sorted([folder, *folder.rglob("*")]):
                if path.is_symlink() or not (path.is_dir() or path.is_file()):
                    continue
                name = staged if path == folder else f"{staged}/{path.relative_to(folder)}"
                info = tar.gettarinfo(str(path), arcname=name)
                if info.isfile():
                    with path.open("rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
    return buffer.getvalue()
