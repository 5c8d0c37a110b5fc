"""Folders kit never binds into a container (models_root, hf_cache): the system trees, a folder
above one, the shared folders and anything holding the engine's socket; by path (kit/names.py),
through symlinks on this host (the spec, exit 2 at file:line:col, nothing written), and on a
remote engine's host by what the folder holds (the preflight, on the fake engine)."""

import socket
from pathlib import Path

import pytest

from kit import names
from kit.errors import BadInput, ExitCode
from kit.site import Site
from tests.support.cli import run_kit
from tests.support.fake_engine import engine_with_images
from tests.support.fake_stack import remote_site, up
from tests.support.sites import tree


@pytest.mark.parametrize("path", [
    "/", "//", "/.", "/etc", "/etc/", "//etc", "/etc/ssl", "/data/../etc", "/proc", "/proc/1",
    "/sys", "/dev", "/dev/shm", "/boot", "/bin", "/sbin", "/lib", "/lib64", "/usr",
    "/usr/local/models", "/root", "/root/models", "/run", "/run/user/1000", "/var/run",
    "/var/run/docker", "/var/lib/docker", "/var/lib/docker/volumes/x/_data",
    "/var/lib/containerd", "/var", "/var/", "/var/lib", "/home", "/home/", "/tmp", "/var/tmp",
])
def test_refused_paths(path: str):
    assert names.bind_refusal(path) is not None, path


@pytest.mark.parametrize("path", [
    "/srv/models", "/data", "/models", "/opt/models", "/mnt/nvme/models", "/home/ops/models",
    "/tmp/models", "/var/lib/models", "/var/lib/dockerish", "/usrdata", "/etcetera/x",
    "/srv/run", "/data/etc", "/var/cache/hf",
])
def test_accepted_paths(path: str):
    assert names.bind_refusal(path) is None, path


def test_a_folder_holding_the_engines_socket_is_refused():
    sockets = ("/srv/docker/engine.sock",)
    assert "socket /srv/docker/engine.sock" in names.bind_refusal("/srv/docker", sockets)
    assert names.bind_refusal("/srv/", sockets) is not None
    assert names.bind_refusal("/srv/models", sockets) is None


def spec_with(site: Path, **keys: str) -> Path:
    spec = site / "site.yaml"
    text = spec.read_text()
    for key, value in keys.items():
        if f"\n{key}:" in text:
            text = "\n".join(f"{key}: {value}" if line.startswith(f"{key}:") else line
                             for line in text.splitlines()) + "\n"
        else:
            text += f"{key}: {value}\n"
    spec.write_text(text)
    return spec


@pytest.mark.parametrize(("keys", "where", "says"), [
    ({"models_root": "/"}, "site.yaml:3:1: models_root", "'/' is the host's whole file system"),
    ({"models_root": "/run/"}, "site.yaml:3:1: models_root", "'/run' is /run, a system folder"),
    ({"hf_cache": "/var"}, "site.yaml:15:1: hf_cache", "holds the system folder /var/lib/"),
    ({"hf_cache": "/var/lib/docker/volumes"}, "site.yaml:15:1: hf_cache", "or below it"),
])
def test_the_spec_refuses_them_at_their_position(site: Path, keys, where, says):
    spec = spec_with(site, **keys)
    before = tree(site)
    for verb in ("validate", "render", "up"):
        result = run_kit(verb, spec)
        assert result.exit_code == ExitCode.BAD_INPUT, result.output
        assert where in result.output and says in result.output, result.output
        assert "fix" in result.output or "kit never mounts it" in result.output
    assert tree(site) == before


def test_a_symlink_into_a_system_folder_is_refused(site: Path, tmp_path: Path):
    (tmp_path / "models-link").symlink_to("/etc")
    (tmp_path / "cache-link").symlink_to("/run/")
    spec = spec_with(site, hf_cache=str(tmp_path / "cache-link"))
    spec.write_text(spec.read_text().replace(f"models_root: {tmp_path / 'models'}",
                                             f"models_root: {tmp_path / 'models-link'}"))
    result = run_kit("validate", spec, env={"DOCKER_HOST": "unix:///var/run/docker.sock"})
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert (f"models_root: {tmp_path / 'models-link'} (a symlink to /etc) is /etc, a system "
            "folder") in result.output
    assert f"hf_cache: {tmp_path / 'cache-link'} (a symlink to /run) is /run" in result.output


def test_a_folder_holding_a_unix_engines_socket_is_refused(site: Path, tmp_path: Path):
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(engine_dir / "docker.sock"))
        spec = spec_with(site, hf_cache=str(tmp_path / "engine"))
        spec.write_text(spec.read_text() + f"engine: unix://{engine_dir}/docker.sock\n")
        result = run_kit("validate", spec)
        assert result.exit_code == ExitCode.BAD_INPUT, result.output
        assert f"holds the Docker engine's socket {engine_dir}/docker.sock" in result.output
        spec_with(site, hf_cache=str(tmp_path / "cache"))
        assert run_kit("validate", spec).exit_code == 0


@pytest.mark.parametrize(("layout", "says"), [
    ({"engine/docker.sock": "socket"}, "holds a socket, engine/docker.sock"),
    ({"etc/passwd": "file"}, "is the root of a system"),
    ({"passwd": "file", "shadow": "file"}, "is a system's /etc"),
    ({"containers": "dir", "image": "dir", "volumes": "dir"}, "holds the Docker engine's data"),
    ({".ssh": "dir"}, "is a home folder"),
])
def test_the_remote_engines_host_is_asked_what_the_folder_holds(tmp_path: Path, layout, says):
    """A remote engine's disk is not visible to the spec: a throwaway container of the service's
    image looks into the folder on that host (here the fake engine runs it on this one)."""
    site = remote_site(tmp_path)
    models = Path(site.spec.models_root)
    sockets = []
    for name, kind in layout.items():
        path = models / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "socket":
            sockets.append(socket.socket(socket.AF_UNIX))
            sockets[-1].bind(str(path))
        elif kind == "dir":
            path.mkdir()
        else:
            path.write_text("x")
    engine = engine_with_images()
    engine.run_helpers = True
    try:
        with pytest.raises(BadInput) as refused:
            up(site, engine)
    finally:
        for listener in sockets:
            listener.close()
    assert (f"models_root {models} on the engine's host ssh://ops@fake-host {says}"
            in refused.value.message), refused.value.message
    assert "kit never mounts a system folder" in refused.value.fix
    assert engine.names() == []  # nothing created


def test_a_plain_models_folder_passes_the_remote_check(tmp_path: Path):
    site = remote_site(tmp_path)
    engine = engine_with_images()
    engine.run_helpers = True
    up(site, engine)
    checks = [about for method, about in engine.calls if method == "helper_start"]
    assert len(checks) == 1 and checks[0].endswith("-kit-bind-check")  # once per folder
    assert isinstance(Site.load(site.spec_path), Site)
