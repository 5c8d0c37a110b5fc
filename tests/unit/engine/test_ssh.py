"""The ssh:// engine without a network: the spec's `engine:` (accepted and refused forms), each
paramiko failure as its cause and fix with the right exit code, the reachability check, the
no-docker diagnosis, and at most 8 API calls in flight per host."""

import socket
import threading
import time
from pathlib import Path

import docker
import paramiko
import pytest
import requests
from paramiko.ssh_exception import NoValidConnectionsError

from kit.engine import docker_api
from kit.engine import ssh as ssh_engine
from kit.engine.url import resolve, spec_engine, ssh_target
from kit.errors import BadInput, ExitCode, KitError
from tests.support.cli import run_kit
from tests.support.sites import write_site

TARGET = ssh_target("ssh://ops@gpu01.test:2222")


def spec_with_engine(tmp_path: Path, engine: str) -> Path:
    spec = write_site(tmp_path)
    spec.write_text(spec.read_text() + f"engine: {engine!r}\n")
    return spec


@pytest.mark.parametrize(("given", "normal"), [
    ("ssh://ops@gpu01.example.com", "ssh://ops@gpu01.example.com"),
    ("ssh://ops@GPU01.example.com:22", "ssh://ops@gpu01.example.com"),
    ("ssh://deploy_1@10.0.0.7:2222", "ssh://deploy_1@10.0.0.7:2222"),
    ("ssh://ops@[::1]:2222", "ssh://ops@[::1]:2222"),
    ("unix:///run/docker.sock", "unix:///run/docker.sock"),
])
def test_accepted_engines(given: str, normal: str) -> None:
    assert spec_engine(given) == normal


@pytest.mark.parametrize(("given", "says"), [
    ("tcp://10.0.0.7:2375", "unauthenticated and unencrypted"),
    ("http://10.0.0.7:2375", "unauthenticated and unencrypted"),
    ("npipe:////./pipe/docker_engine", "'npipe' is not supported"),
    ("ssh://gpu01.example.com", "name the login user"),
    ("ssh://ops@gpu01.example.com:0", "port from 1 to 65535"),
    ("ssh://ops@gpu01.example.com:99999", "port must be a number"),
    ("ssh://ops:secret@gpu01.example.com", "no path, ?query or password"),
    ("ssh://ops@gpu01.example.com/x", "no path"),
    ("ssh://ops@gpu01.example.com;rm", "is not a DNS name"),
    ("unix://docker.sock", "absolute path"),
])
def test_refused_engines_name_what_is_accepted(tmp_path: Path, given: str, says: str) -> None:
    result = run_kit("validate", spec_with_engine(tmp_path, given))
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "engine" in result.output and says in result.output


def test_the_spec_wins_over_docker_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///elsewhere.sock")
    assert resolve("ssh://ops@gpu01") == "ssh://ops@gpu01"
    assert resolve(None) == "unix:///elsewhere.sock"
    monkeypatch.delenv("DOCKER_HOST")
    assert resolve(None) == "unix:///var/run/docker.sock"


def key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


@pytest.mark.parametrize(("error", "kind", "says"), [
    (paramiko.SSHException("Server '[gpu01.test]:2222' not found in known_hosts"), BadInput,
     "`ssh-keyscan -p 2222 gpu01.test`"),
    (paramiko.BadHostKeyException("gpu01.test", key(), key()), BadInput,
     "ssh-keygen -R '[gpu01.test]:2222'"),
    (paramiko.AuthenticationException("Authentication failed."), BadInput,
     "refused the SSH login of ops"),
    (paramiko.SSHException("No authentication methods available"), BadInput,
     "authorized_keys"),
    (paramiko.ChannelException(1, "Administratively prohibited"), KitError, "MaxSessions"),
    (NoValidConnectionsError({("gpu01.test", 2222): ConnectionRefusedError(111, "refused")}),
     KitError, "cannot reach the SSH server"),
    (paramiko.SSHException("Error reading SSH protocol banner"), KitError,
     "ssh -p 2222 ops@gpu01.test docker system dial-stdio"),
])
def test_each_ssh_failure_has_its_cause_fix_and_exit_code(error, kind, says) -> None:
    mapped = ssh_engine.explain(error, TARGET, "connecting")
    assert type(mapped) is kind and mapped.fix is not None
    assert says in mapped.message + mapped.fix


def test_a_changed_key_names_both_fingerprints() -> None:
    got, expected = key(), key()
    mapped = ssh_engine.explain(paramiko.BadHostKeyException("gpu01.test", got, expected),
                                TARGET, "connecting")
    assert ssh_engine.fingerprint(got) in mapped.message
    assert ssh_engine.fingerprint(expected) in mapped.message
    assert "CHANGED" in mapped.message


def test_errors_that_are_not_ssh_ones_are_left_alone() -> None:
    assert ssh_engine.explain(requests.exceptions.ConnectionError("x"), TARGET, "x") is None
    assert ssh_engine.explain(ValueError("x"), TARGET, "x") is None


def test_a_session_refused_mid_call_is_explained_not_a_traceback() -> None:
    """paramiko's ChannelException reaches kit unwrapped through urllib3 and docker-py."""

    class Api:
        def containers(self, **_):
            raise paramiko.ChannelException(1, "Administratively prohibited")

    engine = docker_api.Engine(Api(), "ssh://ops@gpu01.test:2222")  # type: ignore[arg-type]
    with pytest.raises(KitError, match="MaxSessions 10"):
        engine.containers([])


def test_a_wrapped_ssh_failure_is_found_inside_docker_pys_error() -> None:
    inner = paramiko.AuthenticationException("Authentication failed.")
    outer = docker.errors.DockerException(f"Error while fetching server API version: {inner}")
    outer.__cause__ = inner
    mapped = docker_api.explain(outer, "connecting", "ssh://ops@gpu01.test:2222")
    assert isinstance(mapped, BadInput) and "refused the SSH login" in mapped.message


def test_paramiko_missing_is_bad_input_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ssh_engine.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BadInput) as refused:
        docker_api.connect("ssh://ops@gpu01.test:2222")
    assert "pip install 'docker[ssh]'" in refused.value.fix


def test_a_closed_port_is_unreachable_and_exits_1(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = run_kit("status", spec_with_engine(tmp_path, f"ssh://ops@127.0.0.1:{port}"))
    assert result.exit_code == ExitCode.FAILED, result.output
    assert f"cannot reach the SSH server of the engine at ops@127.0.0.1:{port}" in result.output
    assert "sshd stopped?" in result.output


class Channel:
    """A remote `docker system dial-stdio` that fails as a host without docker does."""

    def __init__(self, status: int, stderr: bytes) -> None:
        self.status, self.stderr = status, stderr

    def settimeout(self, _): ...
    def exec_command(self, command: str) -> None:
        assert command == "docker system dial-stdio"
    def shutdown_write(self) -> None: ...
    def makefile_stderr(self, _):
        import io
        return io.BytesIO(self.stderr)
    def recv_exit_status(self) -> int:
        return self.status
    def close(self) -> None: ...


class Client:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def get_transport(self):
        return self

    def open_session(self, timeout: float) -> Channel:
        return self.channel


def test_no_docker_on_the_remote_is_named() -> None:
    error = ssh_engine.no_docker(Client(Channel(127, b"sh: docker: not found")), TARGET, "EOF")
    assert "docker is not installed there" in error.message
    assert "usermod -aG docker ops" in error.fix
    denied = ssh_engine.no_docker(
        Client(Channel(1, b"permission denied while trying to connect to the Docker daemon")),
        TARGET, "EOF")
    assert "permission denied" in denied.message


def test_connect_diagnoses_a_host_without_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    """SSH logs in, the ping finds no API: the remote's own error is what kit reports."""

    class Adapter:
        ssh_client = Client(Channel(127, b"sh: 1: docker: not found"))

        def get_connection(self, url, proxies=None):
            return url

    class Api:
        def __init__(self, **options) -> None:
            assert options["version"] == ssh_engine.API_VERSION
            self.adapter = Adapter()

        def get_adapter(self, prefix: str) -> Adapter:
            return self.adapter

        def ping(self) -> None:
            raise requests.exceptions.ConnectionError("Connection aborted.")

    monkeypatch.setattr(ssh_engine, "check_reachable", lambda target: None)
    monkeypatch.setattr(docker_api.docker, "APIClient", Api)
    with pytest.raises(KitError) as failed:
        docker_api.connect("ssh://ops@gpu01.test:2222")
    assert "docker is not installed there" in failed.value.message
    assert failed.value.exit_code == ExitCode.FAILED


def test_at_most_8_calls_are_in_flight_per_host() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    class Api:
        def containers(self, **_):
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.05)
            with lock:
                running -= 1
            return []

    address = "ssh://ops@bounded.test"
    engines = [docker_api.Engine(docker_api._Bounded(Api(), docker_api._host_limit(address)),
                                 address) for _ in range(2)]  # two engines, one host
    threads = [threading.Thread(target=engines[i % 2].containers, args=([],)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == ssh_engine.MAX_CONCURRENT_CALLS


@pytest.mark.parametrize("engine", [None, "ssh://ops@gpu01.example.com"])
def test_model_folders_are_checked_on_this_host_only_when_the_engine_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str | None
) -> None:
    """A folder of the same path on the operator's machine says nothing about the GPU
    server's disk: with a remote engine, the engine's preflight checks the model there."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    spec = spec_with_engine(tmp_path, engine) if engine else write_site(tmp_path)
    spec.write_text(spec.read_text().replace("model: qwen", "model: only-on-the-server"))
    result = run_kit("validate", spec)
    if engine:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == ExitCode.BAD_INPUT, result.output
        assert "model directory" in result.output and "only-on-the-server" in result.output
