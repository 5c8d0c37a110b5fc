"""A site on a remote engine (fake): site folders become volumes filled through the engine,
files replaced by rename (an open reader keeps the whole old file), stale files removed, the
model folder checked on the engine's host, credential changes delivered before the reload."""

import os
from dataclasses import replace
from pathlib import Path

import pytest

from kit.engine.desired import PROXY_SERVICE
from kit.engine.remote_files import SITE_FILES_LABEL, deliver, site_volumes, through_engine
from kit.errors import BadInput, KitError
from kit.front_door.credential_change import rotate_password
from kit.front_door.reload import Connection
from kit.site import Site
from kit.spec.model import Spec
from tests.support.fake_engine import FakeEngine, engine_with_images
from tests.support.fake_stack import remote_site, up
from tests.support.sites import write_site


def volume_of(engine: FakeEngine, site: Site, folder: str) -> Path:
    (volume,) = [v for v in site_volumes(site.desired) if v.labels[SITE_FILES_LABEL] == folder]
    return engine.volume_path(volume.name)


def files_below(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_site_folders_become_volumes_and_nothing_binds_the_site_folder(tmp_path: Path) -> None:
    site = remote_site(tmp_path)
    up(site, engine := engine_with_images())
    root = str(site.layout.root.resolve())
    for service in site.desired.services:
        binds = [m.source for m in service.config.mounts if m.type == "bind"]
        assert not [b for b in binds if b.startswith(root)], service.name
    nginx = site.desired.service(PROXY_SERVICE).config.mounts
    assert [(m.type, m.source, m.target) for m in nginx] == [
        ("volume", "unit01_kit-files-nginx", "/etc/nginx/kit"),
        ("volume", "unit01_door-figures", "/var/kit-figures"),
        ("volume", "unit01_usage-spool", "/var/log/kit-usage")]
    assert {v.name for v in site_volumes(site.desired)} == {
        "unit01_kit-files-nginx", "unit01_kit-files-nginx-verifier", "unit01_kit-files-nginx-auth",
        "unit01_kit-files-compose-usage", "unit01_kit-files-compose-usage-models"}
    assert files_below(volume_of(engine, site, "nginx")) == files_below(site.layout.nginx_dir)
    assert files_below(volume_of(engine, site, "compose/usage")) == files_below(
        site.layout.usage_dir)
    assert files_below(volume_of(engine, site, "nginx/auth")) == files_below(site.layout.auth_dir)


def test_the_local_desired_state_keeps_its_binds(tmp_path: Path) -> None:
    site = Site.load(write_site(tmp_path))
    up(site, engine_with_images())
    assert site_volumes(site.desired) == []
    # the site's files stay binds; the others are door-figures' socket and the usage spool
    assert [m.type for m in site.desired.service(PROXY_SERVICE).config.mounts] == [
        "bind", "volume", "volume"]


def test_a_file_is_replaced_by_rename_and_a_stale_one_removed(tmp_path: Path) -> None:
    site = remote_site(tmp_path)
    up(site, engine := engine_with_images())
    installed = volume_of(engine, site, "nginx/auth") / "htpasswd"
    old = installed.read_bytes()
    reader = installed.open("rb")  # what a running nginx holds open
    (site.layout.auth_dir / "stale").write_text("left over\n")
    deliver(engine, site.desired, site.layout.root)
    assert (volume_of(engine, site, "nginx/auth") / "stale").exists()
    site.layout.htpasswd.write_text("ops:$2b$12$new\n")
    (site.layout.auth_dir / "stale").unlink()
    deliver(engine, site.desired, site.layout.root)
    assert installed.read_text() == "ops:$2b$12$new\n"
    assert reader.read() == old, "a reader of the old file sees all of it"
    assert os.fstat(reader.fileno()).st_ino != installed.stat().st_ino  # renamed over, not edited
    assert not (volume_of(engine, site, "nginx/auth") / "stale").exists()
    assert not (volume_of(engine, site, "nginx/auth") / ".kit-incoming").exists()
    reader.close()


def test_a_failed_install_names_the_helper(tmp_path: Path) -> None:
    site = remote_site(tmp_path)
    up(site, engine := engine_with_images())
    del engine.images["nginx:1.27-alpine"]
    with pytest.raises(KitError, match="No such image: nginx:1.27-alpine"):
        deliver(engine, site.desired, site.layout.root)


def test_a_writable_bind_of_the_site_folder_is_refused(tmp_path: Path) -> None:
    site = Site.load(write_site(tmp_path))
    up(site, engine_with_images())
    desired = site.desired
    proxy = desired.service(PROXY_SERVICE)
    writable = replace(proxy.config.mounts[0], read_only=False)  # as certbot's ../nginx/tls
    broken = replace(desired, services=(
        replace(proxy, config=replace(proxy.config, mounts=(writable,))),))
    with pytest.raises(BadInput, match="tls.mode self-signed or files"):
        through_engine(broken, site.layout.root)


def test_a_model_folder_missing_on_the_engines_host_is_refused(tmp_path: Path) -> None:
    site = remote_site(tmp_path)
    engine = engine_with_images()
    engine.host_paths = {str(site.spec.models_root)}  # the folder is there, the model is not
    with pytest.raises(BadInput) as refused:
        up(site, engine)
    assert f"{site.spec.models_root}/qwen does not exist on the engine's host" in (
        refused.value.message)
    assert engine.names() == []


def test_a_rotation_on_a_remote_engine_delivers_before_the_reload(tmp_path: Path) -> None:
    site = remote_site(tmp_path)
    up(site, engine := engine_with_images())
    engine.calls.clear()

    def login_on_the_remote(spec: Spec, layout, authorization: str) -> int:
        """200 only once the remote copy of htpasswd holds the new hash."""
        installed = (volume_of(engine, site, "nginx/auth") / "htpasswd").read_text()
        return 200 if installed == layout.htpasswd.read_text() else 401

    outcome = rotate_password(site.spec, site.layout, "ops", "a-good-long-password", None,
                              Connection(lambda: engine, login_on_the_remote, 0.3))
    assert outcome.proxy == "unit01-nginx-1"
    methods = [method for method, _ in engine.calls]
    assert methods.index("run_with_files") < methods.index("signal")
