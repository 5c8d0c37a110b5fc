"""kit's Engine against a Docker Engine API on a unix socket (no engine needed)."""

import docker
import pytest

from kit.engine.docker_api import Engine, demultiplexed
from kit.errors import KitError
from tests.support.engine_api_socket import engine_api, frame

API_VERSION = "1.45"


def test_an_execs_output_sent_with_the_headers_is_read_whole_and_in_order(tmp_path) -> None:
    output = frame(1, b"out\n") + frame(2, b"err\n") + frame(1, b"x" * 70_000)
    with engine_api(tmp_path, output, exit_code=3) as (address, started):
        engine = Engine(docker.APIClient(base_url=address, version=API_VERSION), address)
        code, text = engine.exec("tiny-r0", ["cat", "/metrics"])
    assert (code, text) == (3, "out\nerr\n" + "x" * 70_000)
    assert started == [{"path": f"/v{API_VERSION}/exec/{'5e1ec7ed' * 8}/start",
                        "body": {"Detach": False, "Tty": False}, "upgrade": False}]


def test_an_exit_the_engine_has_not_recorded_yet_is_waited_for(tmp_path) -> None:
    """nginx -t's exit inspected before the engine processed it read as a failure (CI: a
    remote rotation refused with 'rejected the new config' and no output of nginx's)."""
    with engine_api(tmp_path, frame(2, b"syntax is ok\n"), exit_code=0,
                    running_inspects=3) as (address, _):
        engine = Engine(docker.APIClient(base_url=address, version=API_VERSION), address)
        assert engine.exec("nginx-1", ["nginx", "-t"]) == (0, "syntax is ok\n")


def test_output_not_framed_as_the_api_says_is_an_error_naming_the_byte(tmp_path) -> None:
    with engine_api(tmp_path, frame(1, b"ok\n") + b"\xbfnot a frame") as (address, _):
        engine = Engine(docker.APIClient(base_url=address, version=API_VERSION), address)
        with pytest.raises(KitError, match="not framed as its API says at byte 11 of 23"):
            engine.exec("tiny-r0", ["cat", "/metrics"])


@pytest.mark.parametrize("stream", [
    frame(1, b"cut short")[:-3],  # a payload shorter than its header says
    frame(1, b"ok")[:5],  # half a header
    bytes([7, 0, 0, 0, 0, 0, 0, 1]) + b"?",  # no such stream
])
def test_a_broken_frame_is_never_returned_as_text(stream: bytes) -> None:
    with pytest.raises(KitError, match="not framed"):
        demultiplexed(stream, "exec 5e1ec7ed")


def test_no_output_is_no_text() -> None:
    assert demultiplexed(b"", "exec 5e1ec7ed") == b""
