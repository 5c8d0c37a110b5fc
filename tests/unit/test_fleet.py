"""kit fleet without an engine: servers found as DIR/<server>/site.yaml, every verb run on each
with one row per server, failures named (the others still reported), exit 1 when any failed,
and a credential change saying where the new one is live and where the old one still is."""

import json
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kit.errors import BadInput, ExitCode
from kit.fleet import fleet_specs
from tests.support.cli import run_kit
from tests.support.sites import write_site

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def server(fleet: Path, name: str, engine: str | None = None) -> Path:
    """A server folder fleet/<name>/ holding a spec (its own site name)."""
    spec = write_site(fleet / f"{name}-data")
    folder = fleet / name
    folder.mkdir(parents=True)
    text = spec.read_text().replace("site: unit01", f"site: {name}")
    (folder / "site.yaml").write_text(text + (f"engine: {engine}\n" if engine else ""))
    return folder / "site.yaml"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_servers_are_the_folders_holding_a_spec(tmp_path: Path) -> None:
    server(tmp_path / "fleet", "gpu02")
    server(tmp_path / "fleet", "gpu01")
    assert [p.parent.name for p in fleet_specs(tmp_path / "fleet")] == ["gpu01", "gpu02"]
    with pytest.raises(BadInput, match="has no <server>/site.yaml"):
        fleet_specs(tmp_path / "fleet" / "gpu01-data" / "models")
    with pytest.raises(BadInput, match="is not a folder"):
        fleet_specs(tmp_path / "nowhere")


def test_status_names_each_unreachable_server_and_exits_1(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    server(fleet, "gpu01")
    port = closed_port()
    server(fleet, "gpu02", f"ssh://ops@127.0.0.1:{port}")
    result = run_kit("fleet", fleet, "status", env=NO_ENGINE)
    assert result.exit_code == ExitCode.FAILED, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["SERVER", "ENGINE", "CONTAINERS", "HEALTH", "DRIFT", "LAST",
                                "PROBE", "TIME", "CAUSE"]
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in lines[1]
    assert lines[2].startswith("gpu02") and f"ssh://ops@127.0.0.1:{port}" in lines[2]
    assert "cannot reach the SSH server" in lines[2]
    assert "2 of 2 server(s) failed: gpu01, gpu02" in result.output


def test_render_runs_on_every_server(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    specs = [server(fleet, name) for name in ("gpu01", "gpu02")]
    result = run_kit("fleet", fleet, "render")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.output.splitlines()] == [
        "SERVER", "gpu01", "gpu02"]
    assert all((spec.parent / "compose" / "docker-compose.yml").is_file() for spec in specs)


def test_a_rotation_says_where_the_new_password_is_live_and_where_the_old_one_is(
    tmp_path: Path,
) -> None:
    """No engine answers: nothing changes anywhere and every row says the old password is in
    effect; with --offline the files change (live at each server's next `kit up`), except on
    gpu03, never rendered (bad input: nothing written)."""
    fleet = tmp_path / "fleet"
    for name in ("gpu01", "gpu02"):
        server(fleet, name, None if name == "gpu01" else f"ssh://ops@127.0.0.1:{closed_port()}")
    assert run_kit("fleet", fleet, "render").exit_code == 0
    server(fleet, "gpu03")

    def rows(*options: str) -> tuple[int, dict[str, str], str]:
        result = run_kit("fleet", fleet, "rotate-password", "ops", "--password-stdin", *options,
                         stdin="a-new-fleet-password\n", env=NO_ENGINE)
        lines = result.output.splitlines()[1:4]
        return result.exit_code, {line.split()[0]: line for line in lines}, result.output

    code, live, output = rows()
    assert code == ExitCode.FAILED, output
    assert all("old password still in effect" in row for row in live.values()), output
    assert "cannot reach the Docker engine" in live["gpu01"]
    assert "cannot reach the SSH server" in live["gpu02"]
    assert "3 of 3 server(s) failed: gpu01, gpu02, gpu03" in output

    code, offline, output = rows("--offline")
    assert code == ExitCode.FAILED, output
    assert "new password in the files; live at its next `kit up`" in offline["gpu01"]
    assert "new password in the files; live at its next `kit up`" in offline["gpu02"]
    assert "old password still in effect" in offline["gpu03"]
    assert "1 of 3 server(s) failed: gpu03" in output


def test_an_unknown_verb_is_a_usage_error(tmp_path: Path) -> None:
    result = run_kit("fleet", tmp_path, "explode")
    assert result.exit_code == 2 and "VERB one of status" in result.output


@pytest.mark.parametrize("verb", [["up"], ["render"], ["users", "add", "zed"]])
def test_two_folders_of_one_stack_are_refused_before_anything_runs(tmp_path: Path, verb) -> None:
    """A copied folder (same `site:`, no `engine:`) is the same stack on the same engine."""
    fleet = tmp_path / "fleet"
    first = server(fleet, "gpu01")
    copy = fleet / "gpu01-copy"
    copy.mkdir()
    (copy / "site.yaml").write_text(first.read_text())
    server(fleet, "gpu02")
    result = run_kit("fleet", fleet, *verb, env=NO_ENGINE)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert (f"stack gpu01 on unix:///nonexistent/docker.sock: {fleet / 'gpu01'}, {copy}"
            in result.output)
    assert "give each folder the `engine:` of the server it is for" in result.output
    assert not any((fleet / name / "compose").exists() for name in ("gpu01", "gpu01-copy", "gpu02"))


def test_one_site_name_on_two_engines_is_two_stacks(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    first = server(fleet, "gpu01", engine="ssh://ops@gpu01.example.com")
    other = fleet / "gpu02"
    other.mkdir()
    (other / "site.yaml").write_text(first.read_text().replace("gpu01.example", "gpu02.example"))
    result = run_kit("fleet", fleet, "render")
    assert result.exit_code == 0, result.output


def test_usage_merges_every_server_with_a_server_column(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each server's ledger read on its own engine (here: fakes by address), one table and one
    total; a server without a ledger is named with its cause, and the fleet exits 1."""
    from kit.engine import docker_api
    from tests.support.fake_engine import FakeEngine
    from tests.support.synthetic_ledger import chained, ledger_container, ledger_files, record

    fleet, engines = tmp_path / "fleet", {}
    today = datetime.now(UTC).date().isoformat()
    for name, requests in (("gpu01", 2), ("gpu02", 3), ("gpu03", 0)):
        address = f"ssh://ops@{name}.test.internal"
        server(fleet, name, address)
        engines[address] = FakeEngine(local=False)
        files = ledger_files(chained({today: [
            record(f"{today}T00:00:0{n}.000Z", who="key:ci") for n in range(requests)]}))
        ledger_container(engines[address], name, files if requests else None)
    monkeypatch.setattr(docker_api, "connect", lambda url=None: engines[url])
    result = run_kit("fleet", fleet, "usage", "--since", "1d")
    assert result.exit_code == ExitCode.FAILED, result.output
    lines = result.output.splitlines()
    assert lines[1].split()[:3] == ["SERVER", "WHO", "REQUESTS"]
    assert [line.split()[:3] for line in lines[2:5]] == [
        ["gpu01", "key:ci", "2"], ["gpu02", "key:ci", "3"], ["TOTAL", "5", "5"]]
    assert "gpu03" in result.output and "does not exist yet" in result.output
    assert "1 of 3 server(s) failed: gpu03" in result.output
    as_json = run_kit("fleet", fleet, "usage", "--json", "--by", "who,day")
    rows = json.loads(as_json.stdout)["rows"]  # the failed servers' table: on stderr
    assert [(r["server"], r["requests"]) for r in rows] == [("gpu01", 2), ("gpu02", 3)]
    assert run_kit("fleet", fleet, "usage", "--by", "team").exit_code == ExitCode.BAD_INPUT
