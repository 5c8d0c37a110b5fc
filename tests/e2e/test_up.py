"""kit up / status / down / logs against a real engine, on the local test images.

A site has a unique name, free ports, the vLLM stand-in loading in 1 s and healthchecks every
second; the tests assert invariants of the running stack, as Compose's own e2e tests do: what the
containers were given, which container ids survived a change, what nginx reloaded, and that
docker compose sees the same stack. The tests that leave a stack as they found it share one
(`TestOneSharedStack`): a test that changes it does so inside `restored`, which puts the spec back,
converges with `kit up` and proves the gate passes and nothing is left to change; the one that
takes it down runs last. Tests that break a stack's start or let compose create it bring up their
own (`make_site`).
"""

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kit.cli import cli
from kit.engine.desired import CONFIG_HASH_LABEL, PROJECT_LABEL, SERVICE_LABEL, load_desired
from kit.layout import SiteLayout
from kit.plan.build import HF_CACHE_MOUNT, SITE_HF_CACHE_MOUNT
from tests.support.docker_engine import pick_free_port, remove_project
from tests.support.live_stack import kill_port_forwarder, kit, read_in, write_spec

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = REPO / "tests" / "data" / "models" / "qwen2.5-1.5b-instruct" / "config.json"
COMPOSE_V2 = Path(os.environ.get("KIT_TEST_LIB", "/usr/local/lib/kit-test")) / "docker-compose-v2"
NO_CHANGE_LIMIT_S = 2.0
HEALTHY_TIMEOUT_S = 120


@dataclass
class EditedSite:
    """A site folder with a spec this test edits, and the engine it runs on."""

    root: Path
    name: str
    client: object  # docker.DockerClient
    spec: dict = field(default_factory=dict)

    @property
    def spec_path(self) -> Path:
        return self.root / "site.yaml"

    def write(self) -> None:
        write_spec(self.spec_path, self.spec)

    def service(self, name: str) -> dict:
        return next(s for s in self.spec["services"] if s["name"] == name)

    def kit(self, verb: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return kit(verb, str(self.spec_path), *args, timeout=timeout)

    def up(self, *args: str) -> subprocess.CompletedProcess:
        result = self.kit("up", *args)
        assert result.returncode == 0, f"kit up failed:\n{result.stdout}\n{result.stderr}"
        return result

    def containers(self) -> dict:
        """service → docker-py Container of this site."""
        found = self.client.containers.list(
            all=True, filters={"label": f"{PROJECT_LABEL}={self.name}"}
        )
        return {c.labels[SERVICE_LABEL]: c for c in found}

    def ids(self) -> dict[str, str]:
        return {service: c.id for service, c in self.containers().items()}

    def compose(self, binary: str, *args: str) -> subprocess.CompletedProcess:
        file = self.root / "compose" / "docker-compose.yml"
        return subprocess.run(
            [binary, "-f", str(file), "-p", self.name, *args],
            capture_output=True, text=True, timeout=300,
        )


def nginx_workers(container) -> set[int]:
    processes = container.top()["Processes"] or []
    return {int(row[1]) for row in processes if row[-1] == "nginx: worker process"}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = HEALTHY_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def all_healthy(site: EditedSite, services: set[str]) -> bool:
    containers = site.containers()
    return set(containers) == services and all(
        c.attrs["State"].get("Health", {}).get("Status") == "healthy" for c in containers.values()
    )


def new_site(folder: Path, client, backends: int) -> EditedSite:
    """A spec written in `folder` with `alpha` (GPU 0) and, with `backends=2`, `beta`."""
    name = f"kitup{secrets.token_hex(3)}"
    models = folder / "models"
    (models / "qwen").mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL_CONFIG, models / "qwen" / "config.json")
    backend = {"model": "qwen", "max_num_seqs": 8, "max_model_len": 4096,
               "env": {"STANDIN_LOAD_SECONDS": "1"}}
    services = [{"name": "alpha", **backend, "gpus": [0]},
                {"name": "beta", **backend, "gpus": [1, 2]}][:backends]
    site = EditedSite(folder / name, name, client)
    site.root.mkdir()
    site.spec = {
        "site": name,
        "domain": "llm.test.internal",
        "models_root": str(models),
        "auth": {"users": ["ops"]},
        "proxy": {"bind": "127.0.0.1", "https_port": pick_free_port(),
                  "http_port": pick_free_port(), "read_timeout": 900},
        "healthcheck_interval": 1,
        "services": services,
    }
    site.write()
    return site


@pytest.fixture
def make_site(
    tmp_path: Path, docker_client, test_images, cleanup_project
) -> Iterator[Callable[..., EditedSite]]:
    """EditedSite factory for a test's own site: `make_site(backends=2)` adds `beta`."""

    def make(backends: int = 1) -> EditedSite:
        site = new_site(tmp_path, docker_client, backends)
        cleanup_project(site.name)
        return site

    yield make


@dataclass
class SharedSite:
    """The shared two-service site and what its first `kit up` printed."""

    site: EditedSite
    first_up: subprocess.CompletedProcess


@pytest.fixture(scope="class")
def shared(tmp_path_factory: pytest.TempPathFactory, docker_client,
           test_images) -> Iterator[SharedSite]:
    """One two-service site brought up from nothing with `kit up` (gate included), shared by
    the tests that leave it as they found it (`restored`)."""
    site = new_site(tmp_path_factory.mktemp("up"), docker_client, backends=2)
    try:
        yield SharedSite(site, site.up())
    finally:
        remove_project(docker_client, site.name)


@pytest.fixture
def shared_site(shared: SharedSite) -> EditedSite:
    return shared.site


@contextmanager
def restored(site: EditedSite) -> Iterator[None]:
    """Inside: the caller edits the spec and converges. After (also when the stack was left
    broken): the spec as it was, `kit up` converges back and its gate passes, and a further
    `kit up` finds nothing to change, every container healthy."""
    spec = deepcopy(site.spec)
    try:
        yield
    finally:
        site.spec = spec
        site.write()
        back = site.kit("up")
    assert back.returncode == 0, f"kit up back failed:\n{back.stdout}\n{back.stderr}"
    assert "all checks passed" in back.stdout
    assert "no change: 5 container(s) up to date" in site.up("--no-probe").stdout
    assert all_healthy(site, {"alpha", "beta", "kit-auth", "nginx", "usage-ledger"})


class TestOneSharedStack:
    """The tests that leave the shared two-service stack as they found it (or usable: a batch
    key added), then the one that takes it down: a class, so the stack (and its healthchecks'
    load) is gone before the tests that bring up their own."""

    def test_up_from_nothing_is_healthy_pinned_labelled_and_passes_the_gate(self, shared) -> None:
        site = shared.site  # the first test: the stack as its first `kit up` left it
        assert "all checks passed" in shared.first_up.stdout  # kit up ends with the gate
        containers = site.containers()
        # + the password verifier and the usage ledger's collector
        assert set(containers) == {"alpha", "beta", "kit-auth", "nginx", "usage-ledger"}
        for container in containers.values():
            assert container.attrs["State"]["Health"]["Status"] == "healthy"
            assert container.name == f"{site.name}-{container.labels[SERVICE_LABEL]}-1"

        for service, gpus in (("alpha", ["0"]), ("beta", ["1", "2"])):
            requests = containers[service].attrs["HostConfig"]["DeviceRequests"]
            assert [(r["Driver"], r["DeviceIDs"], r["Capabilities"]) for r in requests] == [
                ("nvidia", gpus, [["gpu"]])
            ]
            mounts = {m["Destination"]: m for m in containers[service].attrs["Mounts"]}
            assert mounts["/models"]["RW"] is False
        assert not containers["nginx"].attrs["HostConfig"]["DeviceRequests"]
        assert containers["nginx"].attrs["HostConfig"]["ReadonlyRootfs"] is True
        nginx_mounts = {m["Destination"]: m for m in containers["nginx"].attrs["Mounts"]}
        assert nginx_mounts["/etc/nginx/kit"]["RW"] is False

        desired = load_desired(SiteLayout(site.root), site.name)
        for service in desired.services:
            assert containers[service.name].labels[CONFIG_HASH_LABEL] == service.config_hash

        listed = site.compose("docker-compose", "ps", "-q")
        assert listed.returncode == 0, listed.stderr
        assert set(listed.stdout.split()) == {c.id for c in containers.values()}

    def test_a_second_up_without_change_touches_nothing_and_is_fast(self, shared_site) -> None:
        site = shared_site
        before = {s: c.attrs["State"]["StartedAt"] for s, c in site.containers().items()}
        workers = nginx_workers(site.containers()["nginx"])

        elapsed = []
        for _ in range(3):  # the fastest of 3: a neighbour's load slows one run, not every run
            started = time.monotonic()
            result = CliRunner().invoke(cli, ["up", "--no-probe", str(site.spec_path)])
            elapsed.append(time.monotonic() - started)
            assert result.exit_code == 0, result.output
            # alpha, beta, nginx + the verifier and the usage ledger's collector
            assert "no change: 5 container(s) up to date" in result.output
        assert min(elapsed) < NO_CHANGE_LIMIT_S, f"no-change kit ups took {elapsed}s"
        after = site.containers()
        assert {s: c.attrs["State"]["StartedAt"] for s, c in after.items()} == before
        assert nginx_workers(after["nginx"]) == workers  # not even reloaded

    def test_a_changed_service_is_recreated_alone_and_nginx_reloads_after_it(
            self, shared_site) -> None:
        site = shared_site
        before = site.ids()
        workers = nginx_workers(site.containers()["nginx"])

        with restored(site):
            site.service("alpha")["max_num_seqs"] = 16
            site.write()
            result = site.up("--no-probe")

            after = site.ids()
            assert after["alpha"] != before["alpha"]
            assert after["beta"] == before["beta"] and after["nginx"] == before["nginx"]
            assert f"recreate container {site.name}-alpha-1: config changed" in result.stdout
            # max_num_seqs also sets the `auto` limits in nginx.conf: its files changed too
            assert re.search(rf"reload {site.name}-nginx-1: .*re-resolve alpha", result.stdout)
            out = result.stdout
            assert out.index("alpha healthy") < out.index(f"reload {site.name}-nginx")
            # new config, same master
            assert not nginx_workers(site.containers()["nginx"]) & workers
            alpha = site.containers()["alpha"]
            assert "16" in alpha.attrs["Args"][alpha.attrs["Args"].index("--max-num-seqs") + 1]
            assert alpha.attrs["State"]["Health"]["Status"] == "healthy"

    def test_a_config_only_nginx_change_is_an_in_place_reload(self, shared_site) -> None:
        site = shared_site
        before = site.containers()
        workers = nginx_workers(before["nginx"])

        with restored(site):
            site.spec["proxy"]["read_timeout"] = 300
            site.write()
            result = site.up("--no-probe")

            assert f"reload {site.name}-nginx-1: its mounted config files changed" in result.stdout
            after = site.containers()
            assert {s: c.id for s, c in after.items()} == {s: c.id for s, c in before.items()}
            nginx = after["nginx"]
            assert nginx.attrs["State"]["StartedAt"] == before["nginx"].attrs["State"]["StartedAt"]
            assert nginx.attrs["RestartCount"] == 0
            assert nginx_workers(nginx) and not nginx_workers(nginx) & workers
            assert "no change" in site.up("--no-probe").stdout  # the reload was recorded

    def test_status_shows_health_gpus_drift_and_the_last_probe(self, shared_site) -> None:
        """(That a last probe goes stale when its stack is gone: the `kit down` test.)"""
        site = shared_site
        status = site.kit("status", "--json")
        assert status.returncode == 0, status.stderr
        report = yaml.safe_load(status.stdout)
        assert set(report) == {"site", "containers", "front_door_ports", "drift", "render_pending",
                               "last_probe", "last_probe_stale", "usage_ledger"}
        assert report["usage_ledger"]["ok"] is True, report["usage_ledger"]
        assert [(p["port"], p["tls"], p["answers"]) for p in report["front_door_ports"]] == [
            (site.spec["proxy"]["https_port"], True, True),
            (site.spec["proxy"]["http_port"], False, True)]
        assert report["last_probe_stale"] is None
        assert set(report["containers"][0]) == {
            "service", "name", "state", "health", "gpus", "uptime_seconds", "restarts", "image",
            "id",
        }
        by_service = {c["service"]: c for c in report["containers"]}
        assert by_service["alpha"]["gpus"] == ["0"] and by_service["alpha"]["health"] == "healthy"
        assert report["drift"] == [] and report["render_pending"] == []
        assert report["last_probe"]["ok"] is True

        with restored(site):
            site.service("alpha")["max_num_seqs"] = 4
            site.write()
            pending = yaml.safe_load(site.kit("status", "--json").stdout)["render_pending"]
            assert "compose/docker-compose.yml" in pending
            assert site.kit("render").returncode == 0
            drift = yaml.safe_load(site.kit("status", "--json").stdout)["drift"]
            assert drift[0].startswith(f"recreate container {site.name}-alpha-1: config changed")

    def test_a_dead_front_door_port_is_shown_and_kit_up_repairs_it(self, shared_site) -> None:
        """The engine's port forwarder for the HTTPS port dies while nginx runs healthy: status
        says the port does not answer, and kit up recreates the front door and proves it."""
        site = shared_site
        with restored(site):  # kit up repairs it; `restored` too if this test fails before
            https_port = site.spec["proxy"]["https_port"]
            before = site.ids()
            assert kill_port_forwarder(https_port), "no docker-proxy for the port: is it published?"
            wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", https_port)) != 0,
                       "the HTTPS port to refuse", timeout=10)
            assert site.containers()["nginx"].attrs["State"]["Health"]["Status"] == "healthy"

            status = site.kit("status")
            assert status.returncode == 0, status.stderr
            print(status.stdout)
            assert (f"front door: https port 127.0.0.1:{https_port} DOES NOT ANSWER: connection "
                    "refused") in status.stdout
            repair = f"recreate container {site.name}-nginx-1: nginx runs healthy but https port"
            assert repair in status.stdout
            report = yaml.safe_load(site.kit("status", "--json").stdout)
            assert [p["answers"] for p in report["front_door_ports"]] == [False, True]

            repaired = site.up()
            print(repaired.stdout)
            assert repair in repaired.stdout
            assert "all checks passed" in repaired.stdout
            after = site.ids()
            assert after["nginx"] != before["nginx"] and after["alpha"] == before["alpha"]
            healthy = yaml.safe_load(site.kit("status", "--json").stdout)
            assert all(p["answers"] for p in healthy["front_door_ports"]) and healthy["drift"] == []

    def test_logs_of_one_service_and_of_all(self, shared_site) -> None:
        site = shared_site
        one = site.kit("logs", "alpha", "-n", "5")
        assert one.returncode == 0, one.stderr
        assert "GET /health" in one.stdout and " | " not in one.stdout
        every = site.kit("logs")
        assert re.search(r"^alpha +\| ", every.stdout, re.MULTILINE)  # names padded alike
        unknown = site.kit("logs", "gamma")
        assert unknown.returncode == 2
        assert "pick one of: alpha, beta, kit-auth, nginx, usage-ledger" in unknown.stderr

    def test_a_service_removed_from_the_spec_loses_its_container(self, shared_site) -> None:
        site = shared_site
        before = site.ids()

        with restored(site):  # beta comes back
            site.spec["services"] = [site.service("alpha")]
            site.write()
            result = site.up("--no-probe")

            assert (f"remove container {site.name}-beta-1: service no longer in the compose "
                    "file") in result.stdout
            after = site.ids()
            # the usage ledger's collector is kept: it reads the served names again from its
            # models file (compose/usage-models/models.json) when they change
            assert after == {"alpha": before["alpha"], "kit-auth": before["kit-auth"],
                             "nginx": before["nginx"], "usage-ledger": before["usage-ledger"]}
            assert f"reload {site.name}-nginx-1: its mounted config files changed" in result.stdout

    def test_the_first_batch_key_restarts_nothing(self, shared_site) -> None:
        """Issue 42: every service runs vLLM's priority scheduler from the start, so the first
        `--class batch` key is live at once and the next `kit up` recreates no container (a
        single-replica service would otherwise be down while it restarts). The key stays: the
        stack is as usable as before."""
        site = shared_site
        before = site.ids()
        added = kit("keys", "add", str(site.spec_path), "nightly", "--class", "batch")
        assert added.returncode == 0, added.stdout + added.stderr
        again = site.up("--no-probe")
        assert site.ids() == before, again.stdout
        assert "recreate" not in again.stdout, again.stdout

    def test_down_removes_containers_and_networks_and_volumes_only_when_asked(
            self, shared_site) -> None:
        """The last test of the class: it takes the shared stack down (its first `kit up` and
        every `restored` ran the gate: the last probe becomes stale below)."""
        site = shared_site
        label = {"label": f"{PROJECT_LABEL}={site.name}"}

        result = site.kit("down")
        assert result.returncode == 0, result.stderr
        after = site.kit("status")  # the last probe is of a stack that is gone
        assert "(stale: the front door it probed no longer runs)" in after.stdout, after.stdout
        assert site.client.containers.list(all=True, filters=label) == []
        assert site.client.networks.list(filters=label) == []
        assert {v.name for v in site.client.volumes.list(filters=label)} == {
            f"{site.name}_hf-cache-alpha", f"{site.name}_hf-cache-beta",
            f"{site.name}_door-figures",  # nginx's, always
            f"{site.name}_usage-spool", f"{site.name}_usage-ledger"}  # kept: who used what

        assert site.kit("down", "--volumes").returncode == 0
        assert site.client.volumes.list(filters=label) == []


def test_a_file_one_service_writes_in_its_cache_is_not_in_anothers(make_site) -> None:
    """Issue 42, item 3: model code in alpha's container (hostile) leaves a Python module in its
    Hugging Face cache; beta's container, on the same engine and site, does not see it. The
    site's hf_cache folder (an offline site: beta serves a Hub id from it) is read-only to both."""
    site = make_site(backends=2)
    snapshot = site.root / "hf" / "hub" / "models--org--tiny" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(MODEL_CONFIG, snapshot / "config.json")
    site.spec.update(hf_cache=str(site.root / "hf"), offline=True)
    site.service("beta")["model"] = "org/tiny"
    site.write()
    site.up("--no-probe")
    alpha, beta = (site.containers()[name] for name in ("alpha", "beta"))
    planted = f"{HF_CACHE_MOUNT}/modules/transformers_modules/planted.py"
    wrote = alpha.exec_run(["sh", "-c", f"mkdir -p {planted.rsplit('/', 1)[0]} && "
                            f"echo 'import os' > {planted} && cat {planted}"])
    assert wrote.exit_code == 0 and wrote.output == b"import os\n", wrote.output
    seen = beta.exec_run(["sh", "-c", f"ls -la {HF_CACHE_MOUNT} {planted}"])
    assert seen.exit_code != 0 and b"No such file" in seen.output, seen.output
    assert alpha.exec_run(["test", "-f", planted]).exit_code == 0  # still there: not a fluke
    for container in (alpha, beta):  # the site's cache: read, never written
        touched = container.exec_run(["touch", f"{SITE_HF_CACHE_MOUNT}/hub/planted"])
        assert touched.exit_code != 0 and b"Read-only file system" in touched.output
    assert sorted(p.name for p in (site.root / "hf" / "hub").iterdir()) == ["models--org--tiny"]
    assert '"org/tiny"' in read_in(beta, ["curl", "-fsS", "http://127.0.0.1:8000/v1/models"])


def test_a_failing_start_is_reported_at_once_with_the_log_and_its_cause(make_site) -> None:
    site = make_site()
    site.service("alpha")["env"]["STANDIN_GPU_MEMORY_GIB"] = "2"  # the weights do not fit
    site.write()
    started = time.monotonic()
    result = site.kit("up", "--no-probe")
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert elapsed < 60, "the failure must be seen when the container exits, not at the timeout"
    assert "service alpha did not become healthy" in result.stderr
    assert f"log lines of {site.name}-alpha-1" in result.stderr
    assert "CUDA out of memory" in result.stderr
    assert "cause: the GPU ran out of memory" in result.stderr
    assert "nginx" not in site.containers()  # nginx waits for healthy backends


def test_a_busy_port_is_refused_before_anything_is_created(make_site) -> None:
    site = make_site()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", site.spec["proxy"]["https_port"]))
        holder.listen()
        result = site.kit("up", "--no-probe")
    assert result.returncode == 1
    assert "(proxy.https_port) is already in use by another process" in result.stderr
    assert site.containers() == {}


def test_a_missing_models_root_is_bad_input(make_site, tmp_path: Path) -> None:
    site = make_site()
    site.spec["models_root"] = str(tmp_path / "nowhere")
    site.write()
    result = site.kit("up", "--no-probe")
    assert result.returncode == 2
    assert f"{tmp_path / 'nowhere'} does not exist on this host" in result.stderr
    assert "set models_root in the spec" in result.stderr
    assert site.containers() == {}


def test_a_models_folder_holding_a_socket_is_refused_on_the_engines_host(make_site) -> None:
    """What no path check sees: a socket inside the folder (e.g. an engine's socket bound into
    it). A throwaway container of the vLLM image looks on the engine's host, before anything
    starts (kit/converge/preflight.py)."""
    site = make_site()
    socket_path = Path(site.spec["models_root"]) / "run" / "engine.sock"
    socket_path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(socket_path))
        result = site.kit("up", "--no-probe")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"models_root {site.spec['models_root']} on the engine's host" in result.stderr
    assert "holds a socket, run/engine.sock" in result.stderr
    assert site.containers() == {}


def test_an_image_that_is_absent_and_cannot_be_pulled(make_site) -> None:
    site = make_site()
    site.spec["images"] = {"vllm": f"kit-test/absent-{site.name}:0"}
    site.write()
    result = site.kit("up", "--no-probe")
    assert result.returncode == 1
    assert "is not on this host and pulling it failed" in result.stderr
    assert site.containers() == {}


COMPOSE_BINARIES = [
    pytest.param("docker-compose", id="compose-v1"),
    pytest.param(
        str(COMPOSE_V2), id="compose-v2",
        marks=pytest.mark.skipif(not COMPOSE_V2.exists(), reason="compose v2 not installed"),
    ),
]


@pytest.mark.parametrize("compose", COMPOSE_BINARIES)
def test_compose_runs_the_rendered_file_and_kit_adopts_its_stack(make_site, compose) -> None:
    site = make_site()
    token = f"hf_{secrets.token_hex(8)}"
    site.service("alpha")["env"]["HF_TOKEN"] = token  # reaches the container via the env file
    site.write()
    assert site.kit("render").returncode == 0
    started = site.compose(compose, "up", "-d")
    assert started.returncode == 0, started.stderr
    wait_until(lambda: all_healthy(site, {"alpha", "kit-auth", "nginx", "usage-ledger"}),
               "compose's stack to be healthy")
    gpus = site.containers()["alpha"].attrs["HostConfig"]["DeviceRequests"][0]["DeviceIDs"]
    assert gpus == ["0"]
    assert f"HF_TOKEN={token}" in site.containers()["alpha"].attrs["Config"]["Env"]

    result = site.up()  # compose hashes differently: kit recreates, then the gate passes
    assert "all checks passed" in result.stdout
    alpha = site.containers()["alpha"]
    assert f"HF_TOKEN={token}" in alpha.attrs["Config"]["Env"]
    assert token not in str(alpha.labels) and token not in result.stdout + result.stderr
    assert token not in (site.root / "compose" / "docker-compose.yml").read_text()
    listed = site.compose(compose, "ps", "-q")
    assert set(listed.stdout.split()) == set(site.ids().values())

    assert site.compose(compose, "down").returncode == 0
    assert site.containers() == {}


def test_the_health_timeout_comes_from_the_spec_or_the_option(make_site) -> None:
    site = make_site()
    site.service("alpha")["env"]["STANDIN_LOAD_SECONDS"] = "60"
    site.write()
    result = site.kit("up", "--no-probe", "--timeout", "3")
    assert result.returncode == 1
    assert "service alpha did not become healthy" in result.stderr
    assert "not healthy after 3s (override with --timeout)" in result.stderr


def test_an_unreachable_engine_says_what_to_check(make_site, tmp_path: Path) -> None:
    site = make_site()
    address = f"unix://{tmp_path / 'no-engine.sock'}"
    result = subprocess.run(
        [sys.executable, "-m", "kit", "up", str(site.spec_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "DOCKER_HOST": address},
    )
    assert result.returncode == 1
    assert f"cannot reach the Docker engine at {address}" in result.stderr
    assert "is dockerd running?" in result.stderr and f"DOCKER_HOST={address}" in result.stderr
