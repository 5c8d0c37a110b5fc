"""Replicas (issue 10): a service's GPUs cut into replicas, each its own pinned and labelled
container, behind one least-connections upstream (with optional affinity); status and the
probe see every replica. The example spec in tests/data/replicas renders to golden files."""

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

import kit.converge.rollout
import kit.engine.replica_client
from kit.converge.reconcile import RecreateContainer, RollReplicas, up_actions
from kit.converge.rollout import mark, read_start_times
from kit.engine.desired import REPLICA_INDEX_LABEL, REPLICA_SERVICE_LABEL, SERVICE_LABEL
from kit.errors import KitError
from kit.front_door.replica_check import prove_replica, replica_checks
from kit.plan.build import build_plan
from kit.plan.host import load_spec
from kit.site import Site
from kit.spec.replicas import gpu_layout, replica_plans, split_gpus
from kit.spec.vllm_flags import EMBED, GENERATE
from kit.stack.up import up_site
from kit.views.status import StackStatus, gather, render_text
from tests.support import nginx_ns
from tests.support.cli import run_kit
from tests.support.compose import compose_binaries, services_of
from tests.support.fake_engine import ReplicaEngine
from tests.support.nginx_structure import parse
from tests.support.sites import REPO, spec_in_folder, write_site

EXAMPLE = REPO / "tests" / "data" / "replicas"
GOLDEN = {"compose/docker-compose.yml": "docker-compose.yml", "nginx/nginx.conf": "nginx.conf"}


@pytest.fixture
def replicas_site(tmp_path: Path) -> Path:
    """The replicas example in its own folder (models_root need not exist: bare names)."""
    return spec_in_folder(EXAMPLE / "site.yaml", tmp_path / "replicas")


def test_the_example_renders_its_golden_files(replicas_site: Path) -> None:
    result = run_kit("render", str(replicas_site / "site.yaml"))
    assert result.exit_code == 0, result.output
    for rendered, golden in GOLDEN.items():
        committed = (EXAMPLE / "golden" / golden).read_text()
        assert (replicas_site / rendered).read_text() == committed, (
            f"{rendered} drifted: re-render tests/data/replicas/site.yaml and copy it to golden/"
        )


@pytest.mark.parametrize(("gpus", "tp", "groups"), [
    ([0, 1, 2, 3], 1, [[0], [1], [2], [3]]),
    ([0, 1, 2, 3], 2, [[0, 1], [2, 3]]),
    ([6, 4, 7, 5], 2, [[6, 4], [7, 5]]),  # the spec's order: the operator chose the pairs
    ([3], 1, [[3]]),
])
def test_gpus_split_into_tensor_parallel_groups(gpus: list[int], tp: int, groups: list) -> None:
    assert split_gpus(gpus, tp) == groups


def test_a_single_replica_keeps_the_service_name_and_more_are_numbered() -> None:
    assert [r.host for r in replica_plans("llama", [0, 1], 2)] == ["llama"]
    many = replica_plans("llama", [0, 1, 2, 3], 2)
    assert [(r.index, r.gpus, r.host) for r in many] == [
        (0, ["0", "1"], "llama-r0"), (1, ["2", "3"], "llama-r1")]


def test_kit_plan_names_each_replicas_gpus() -> None:
    assert gpu_layout([0, 1], 2) == "GPU 0,1, tensor_parallel 2"  # one replica: as before
    assert gpu_layout([4, 5, 6, 7], 2) == (
        "GPU 4,5 | 6,7: 2 replicas of tensor_parallel 2 (capacity per replica)")


def test_the_plan_has_replicas_and_counts_their_streams(replicas_site: Path) -> None:
    plan = build_plan(load_spec(replicas_site / "site.yaml", check_host=False))
    llama, qwen = plan.services
    assert [r.gpus for r in llama.replicas] == [["0"], ["1"], ["2"], ["3"]]
    assert [r.gpus for r in qwen.replicas] == [["4", "5"], ["6", "7"]]
    assert (llama.affinity, llama.affinity_key) == ("prefix", "$kit_pick")
    assert (qwen.affinity, qwen.affinity_key) == ("header", "$http_x_session_id")
    assert llama.streams == 4 * 128 and qwen.streams == 2 * 64
    assert "--tensor-parallel-size" in qwen.command
    assert qwen.command[qwen.command.index("--tensor-parallel-size") + 1] == "2"
    assert qwen.ipc_host and not llama.ipc_host


def test_replicas_given_alone_set_the_gpus_per_replica(tmp_path: Path) -> None:
    spec = tmp_path / "site.yaml"
    spec.write_text((EXAMPLE / "site.yaml").read_text().replace(
        "    tensor_parallel: 2\n    replicas: 2\n", "    replicas: 2\n"))
    qwen = load_spec(spec, check_host=False).service("qwen32b")
    assert (qwen.tp, qwen.replica_count) == (2, 2)


def test_each_replica_is_a_pinned_labelled_container(replicas_site: Path) -> None:
    site = Site.load(replicas_site / "site.yaml", check_host=False)
    assert run_kit("render", str(site.spec_path)).exit_code == 0
    by_name = {s.name: s for s in site.desired.services}
    for index in range(4):
        replica = by_name[f"llama8b-r{index}"]
        assert replica.gpu_ids == (str(index),)
        assert replica.container_name == f"gpu02-llama8b-r{index}-1"
        assert replica.labels[SERVICE_LABEL] == f"llama8b-r{index}"
        assert replica.labels[REPLICA_SERVICE_LABEL] == "llama8b"
        assert replica.labels[REPLICA_INDEX_LABEL] == str(index)
    assert by_name["qwen32b-r1"].gpu_ids == ("6", "7")
    assert by_name["qwen32b-r1"].config.ipc_mode == "host"
    proxy = dict(by_name["nginx"].depends_on)
    assert {f"llama8b-r{i}" for i in range(4)} | {"qwen32b-r0", "qwen32b-r1"} <= set(proxy)
    # replicas differ only in their pins and labels: each hashes on its own
    assert len({by_name[f"llama8b-r{i}"].config_hash for i in range(4)}) == 4


def test_a_single_replica_service_has_no_replica_labels(site: Path) -> None:
    loaded = Site.load(site / "site.yaml")
    assert run_kit("render", str(loaded.spec_path)).exit_code == 0
    service = loaded.desired.service("llama8b")
    assert REPLICA_SERVICE_LABEL not in service.labels
    assert service.container_name == "test01-llama8b-1"


def test_nginx_balances_least_connections_with_a_shared_zone(replicas_site: Path) -> None:
    assert run_kit("render", str(replicas_site / "site.yaml")).exit_code == 0
    conf = parse((replicas_site / "nginx" / "nginx.conf").read_text())
    pool = conf.one("upstream", "kit_llama8b")
    assert pool.values("least_conn") == [()] and pool.values("zone") == [("kit_llama8b", "1m")]
    # the servers: one file per service, which kit up rewrites to take one replica out
    assert pool.values("include") == [("/etc/nginx/kit/replicas/llama8b.conf",)]
    servers = parse((replicas_site / "nginx" / "replicas" / "llama8b.conf").read_text())
    assert [s[0] for s in servers.values("server")] == [f"llama8b-r{i}:8000" for i in range(4)]
    assert all(s[1:] == ("max_fails=1", "fail_timeout=10s") for s in servers.values("server"))
    affinity = conf.one("upstream", "kit_qwen32b_affinity")
    assert affinity.values("hash") == [("$http_x_session_id", "consistent")]
    assert affinity.values("include") == conf.one("upstream", "kit_qwen32b").values("include")
    # without the header (or a conversation), the least-connections pool takes the request
    pick = conf.one("map", "$http_x_session_id", "$kit_qwen32b_pool")
    assert pick.values("") == [("kit_qwen32b",)]
    assert pick.values("default") == [("kit_qwen32b_affinity",)]
    # prefix routing: the door's pick (balance.js), released at the log phase
    assert conf.one("upstream", "kit_llama8b_affinity").values("hash") == [("$kit_pick",)]
    assert conf.one("js_var", "$kit_bounded_load").args == ("$kit_bounded_load",
                                                            "llama8b=0.25")
    assert conf.one("js_set", "$kit_replica_released").args == ("$kit_replica_released",
                                                                "balance.release")
    location = conf.one("location", "@kit_qwen32b")
    assert location.values("proxy_pass") == [("http://$kit_qwen32b_pool$uri$is_args$args",)]
    # a request not yet answered may go to another replica; a begun stream never
    assert location.values("proxy_next_upstream") == [("error", "timeout", "non_idempotent")]
    # a killed replica's address answers nothing: after 2 s the next one, within 2 x 2 s only
    assert location.values("proxy_connect_timeout") == [("2s",)]
    assert location.values("proxy_next_upstream_timeout") == [("4s",)]
    assert location.values("error_page") == [("502", "504", "=", "@kit_unavailable")]
    unavailable = conf.one("location", "@kit_unavailable")
    assert ("Retry-After", "5", "always") in unavailable.values("add_header")
    assert unavailable.values("return")[0][0] == "503"
    body = unavailable.values("return")[0][1]
    assert json.loads(body[: body.rindex("}") + 1])["error"]["code"] == 503  # then nginx's \n


def test_a_single_replica_upstream_is_as_before(site: Path) -> None:
    assert run_kit("render", str(site / "site.yaml")).exit_code == 0
    conf = parse((site / "nginx" / "nginx.conf").read_text())
    pool = conf.one("upstream", "kit_llama8b")
    assert pool.values("server") == [("llama8b:8000", "max_fails=0")]
    assert not pool.values("least_conn") and not conf.find("js_set", "$kit_replica_released")


def test_up_starts_every_replica_and_the_probe_checks_each(replicas_site: Path) -> None:
    broken = (0, '{"error": {"message": "engine dead"}}\n500')
    engine = ReplicaEngine({"gpu02-llama8b-r2-1": broken})
    site = brought_up(replicas_site, engine)
    replicas = [f"gpu02-llama8b-r{i}-1" for i in range(4)] + ["gpu02-qwen32b-r0-1",
                                                              "gpu02-qwen32b-r1-1"]
    assert set(replicas) <= set(engine.names())
    checks = {c.name: c for c in replica_checks(site, lambda: engine)}
    assert sorted(checks) == sorted(f"replica {n.removeprefix('gpu02-')[:-2]}" for n in replicas)
    assert not checks["replica llama8b-r2"].ok
    assert "a 1-token completion got 500" in checks["replica llama8b-r2"].detail
    assert all(c.ok for name, c in checks.items() if name != "replica llama8b-r2")
    assert "health 200, 1 completion token(s)" in checks["replica llama8b-r0"].detail


def test_an_embedding_replica_is_proven_by_an_embedding(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    site = brought_up(replicas_site, engine)
    container = next(c for c in site.observe(engine).containers if c.service == "qwen32b-r1")
    verdict = prove_replica(engine, container, "qwen32b", EMBED)
    assert verdict.ok and verdict.detail == "health 200, a 2-dimension embedding"
    assert [a for m, a in engine.calls if m == "exec"][-1] == "http://127.0.0.1:8000/v1/embeddings"


def test_a_stopped_replica_fails_its_check_without_a_request(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    site = brought_up(replicas_site, engine)
    container = next(c for c in site.observe(engine).containers if c.service == "qwen32b-r1")
    engine.stop(container.id)
    stopped = next(c for c in site.observe(engine).containers if c.service == "qwen32b-r1")
    verdict = prove_replica(engine, stopped, "qwen32b", GENERATE)
    assert not verdict.ok and verdict.detail == "gpu02-qwen32b-r1-1 is exited"


def test_status_shows_each_replica_and_how_many_are_healthy(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    site = brought_up(replicas_site, engine)
    dead = next(c for c in site.observe(engine).containers if c.service == "llama8b-r1")
    engine.stop(dead.id)
    observed = site.observe(engine)
    status = StackStatus("gpu02", observed.containers, (), (), None)
    now = datetime.now(UTC)
    assert status.replicas_in_service() == {
        "llama8b": {"healthy": 3, "replicas": 4, "in_rotation": 3},
        "qwen32b": {"healthy": 2, "replicas": 2, "in_rotation": 2}}
    text = render_text(status, now)
    assert "llama8b: 3 of 4 replicas healthy, 3 in rotation" in text
    row = next(line for line in text.splitlines() if line.startswith("llama8b-r1 "))
    assert "1 of llama8b" in row and "exited" in row
    entry = next(c for c in status.to_json(now)["containers"] if c["service"] == "llama8b-r1")
    assert (entry["replica_of"], entry["replica"]) == ("llama8b", 1)


def test_the_most_replicas_render_configs_nginx_and_compose_accept(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    gpus = ", ".join(str(i) for i in range(64))
    (folder / "site.yaml").write_text(
        "site: many\ndomain: llm.test.internal\nmodels_root: /data/models\n"
        "services:\n"
        f"  - {{name: svc, model: m, gpus: [{gpus}], tensor_parallel: 1, replicas: 64,\n"
        "     routing: {affinity: prefix}}\n"
    )
    assert run_kit("render", str(folder / "site.yaml")).exit_code == 0, "render"
    if nginx_ns.available() is None:
        checked = nginx_ns.nginx_t(folder / "nginx", services_of(folder))
        assert checked.returncode == 0, checked.stderr
    for binary in compose_binaries():
        result = subprocess.run(
            [*binary, "-p", "many", "-f", "compose/docker-compose.yml", "config", "-q"],
            cwd=folder, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, f"{binary}: {result.stderr}"


def changed_llama(site: Site) -> Site:
    """The example with llama8b's max_num_seqs changed: every one of its replicas changes."""
    site.spec_path.write_text(site.spec_path.read_text().replace("max_num_seqs: 128",
                                                                 "max_num_seqs: 100"))
    return Site.load(site.spec_path, check_host=False)


def brought_up(replicas_site: Path, engine: ReplicaEngine) -> Site:
    site = Site.load(replicas_site / "site.yaml", check_host=False)
    up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    return site


@pytest.fixture(autouse=True)
def quick_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drained after a few idle polls, not after seconds (the fake engine has no clock)."""
    monkeypatch.setattr(kit.engine.replica_client, "DRAIN_QUIET_SECONDS", 0.02)
    monkeypatch.setattr(kit.engine.replica_client, "DRAIN_POLL_SECONDS", 0.01)


def test_a_changed_service_is_rolled_one_replica_at_a_time(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    site = changed_llama(brought_up(replicas_site, engine))
    engine.calls.clear()
    reported: list[str] = []
    result = up_site(site, timeout=5, probe=False, report=reported.append,
                     warn=reported.append, connect=lambda: engine)
    (roll,) = [a for a in result.converged.actions if isinstance(a, RollReplicas)]
    assert [r.service.name for r in roll.replicas] == [f"llama8b-r{i}" for i in range(4)]
    assert not any(isinstance(a, RecreateContainer) for a in result.converged.actions)
    # each replica: out of nginx (reload), drained, replaced, gated, back in (reload), in turn
    steps = [(method, about) for method, about in engine.calls
             if method in ("signal", "stop", "create_container")
             or (method == "exec" and about.startswith("http://"))]
    per_replica = [
        ("signal", "SIGHUP"), ("exec", "http://127.0.0.1:8000/metrics"), ("stop", ""),
        ("create_container", ""), ("exec", "http://127.0.0.1:8000/health"),
        ("exec", "http://127.0.0.1:8000/v1/chat/completions"), ("signal", "SIGHUP")]
    seen = [(m, a if m in ("signal", "exec") else "") for m, a in steps]
    poll = ("exec", "http://127.0.0.1:8000/metrics")
    seen = [step for i, step in enumerate(seen) if step != poll or seen[i - 1] != poll]
    assert seen[: 4 * len(per_replica)] == per_replica * 4, seen
    created = [a for m, a in engine.calls if m == "create_container"]
    assert created == [f"gpu02-llama8b-r{i}-1" for i in range(4)]  # qwen32b untouched
    pool = site.layout.replica_pool("llama8b").read_text()
    assert pool.count("server ") == 4 and " down;" not in pool
    assert sum("back in nginx" in line for line in reported) == 4


def test_an_embedding_service_rolls_through_an_embedding_gate(replicas_site: Path) -> None:
    spec = replicas_site / "site.yaml"
    session = "    routing: {affinity: header, header: X-Session-ID}\n"
    spec.write_text(spec.read_text().replace(
        session, session + '    extra_args: ["--runner", "pooling"]\n'))
    engine = ReplicaEngine({})
    brought_up(replicas_site, engine)
    spec.write_text(spec.read_text().replace("max_model_len: 32768", "max_model_len: 16384"))
    engine.calls.clear()
    up_site(Site.load(spec, check_host=False), timeout=5, probe=False, report=lambda _: None,
            warn=lambda _: None, connect=lambda: engine)
    gates = [about for method, about in engine.calls
             if method == "exec" and about.startswith("http://127.0.0.1:8000/v1/")]
    assert gates == ["http://127.0.0.1:8000/v1/embeddings"] * 2  # one per replica, in turn


def test_a_replica_that_fails_its_gate_stops_the_rollout(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    running = brought_up(replicas_site, engine)
    before = {c.service: c.id for c in running.observe(engine).containers}
    site = changed_llama(running)
    engine.answers["gpu02-llama8b-r1-1"] = (0, '{"error": {"message": "CUDA error"}}\n500')
    with pytest.raises(KitError) as failed:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    message = failed.value.message
    assert message.startswith("rolling update of llama8b stopped at llama8b-r1 (1 of 4 replaced)")
    assert "failed its gate: a 1-token completion got 500" in message
    after = {c.service: c.id for c in site.observe(engine).containers}
    assert after["llama8b-r0"] != before["llama8b-r0"]  # replaced and back in service
    assert after["llama8b-r2"] == before["llama8b-r2"]  # the old ones keep serving
    assert after["llama8b-r3"] == before["llama8b-r3"]
    pool = site.layout.replica_pool("llama8b").read_text()
    assert "server llama8b-r1:8000 max_fails=1 fail_timeout=10s down;" in pool
    assert "server llama8b-r0:8000 max_fails=1 fail_timeout=10s;" in pool
    # status: r1 runs healthy and nginx sends it nothing; it says so (not just "healthy")
    status = gather(site, engine)
    text = render_text(status, datetime.now(UTC))
    row = next(line for line in text.splitlines() if line.startswith("llama8b-r1 "))
    assert "healthy, OUT OF ROTATION" in row
    assert "OUT OF ROTATION" not in next(line for line in text.splitlines()
                                         if line.startswith("llama8b-r2 "))
    assert "llama8b: 4 of 4 replicas healthy, 3 in rotation" in text
    assert "out of rotation: llama8b-r1 (nginx sends it no request" in text
    entries = {c["service"]: c for c in status.to_json(datetime.now(UTC))["containers"]}
    assert not entries["llama8b-r1"]["in_rotation"] and entries["llama8b-r0"]["in_rotation"]
    # the next render lists every replica again
    assert run_kit("render", str(site.spec_path)).exit_code == 0
    assert " down;" not in site.layout.replica_pool("llama8b").read_text()


def test_without_a_running_front_door_replicas_are_recreated_at_once(replicas_site: Path) -> None:
    engine = ReplicaEngine({})
    site = changed_llama(brought_up(replicas_site, engine))
    assert run_kit("render", str(site.spec_path)).exit_code == 0
    proxy = next(c for c in site.observe(engine).containers if c.service == "nginx")
    engine.stop(proxy.id)
    actions = up_actions(site.desired, site.observe(engine))
    assert not any(isinstance(a, RollReplicas) for a in actions)
    assert sum(isinstance(a, RecreateContainer) for a in actions) == 4


def test_marking_a_replica_down_and_back() -> None:
    pool = "# header\nserver a:8000 x;\nserver b:8000 x;\n"
    out = mark(pool, "a", serving=False)
    assert out == "# header\n# out of service: server a:8000 x down;\nserver b:8000 x;\n"
    assert mark(out, "a", serving=False) == out  # marking twice changes nothing
    assert mark(out, "a", serving=True) == pool


def test_a_single_replica_service_says_it_will_be_down_and_for_how_long(tmp_path: Path) -> None:
    site = Site.load(write_site(tmp_path))
    engine = ReplicaEngine({})
    first: list[str] = []
    up_site(site, timeout=5, probe=False, report=first.append, warn=first.append,
            connect=lambda: engine)
    assert not any("has one replica" in line for line in first)  # nothing ran before
    assert set(read_start_times(site.layout.start_times)) >= {"alpha", "beta"}
    spec = write_site(tmp_path, alpha_seqs=9)
    again: list[str] = []
    up_site(Site.load(spec), timeout=5, probe=False, report=again.append, warn=again.append,
            connect=lambda: engine)
    (note,) = [line for line in again if "has one replica" in line]
    assert note.startswith("alpha has one replica: it is down until its replacement is healthy "
                           "(its last start took 0s); meanwhile the front door answers 503")
    assert again.index(note) < next(i for i, line in enumerate(again)
                                    if line.startswith("recreate container"))


def test_a_single_replica_status_report_keeps_its_keys(site: Path) -> None:
    loaded = Site.load(site / "site.yaml")
    engine = ReplicaEngine({})
    up_site(loaded, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    observed = loaded.observe(engine)
    report = StackStatus("test01", observed.containers, (), (), None).to_json(datetime.now(UTC))
    assert set(report) == {"site", "containers", "front_door_ports", "drift", "render_pending",
                           "last_probe", "last_probe_stale"}
    assert not any("replica" in key for c in report["containers"] for key in c)
    assert "replicas healthy" not in render_text(
        StackStatus("test01", observed.containers, (), (), None), datetime.now(UTC))


def fewer_llama(site: Site, gpus: str, tensor_parallel: int = 1) -> Site:
    """The example with llama8b on other GPUs (and tensor_parallel): fewer replicas."""
    text = site.spec_path.read_text().replace("gpus: [0, 1, 2, 3]\n    tensor_parallel: 1",
                                              f"gpus: {gpus}\n    tensor_parallel: "
                                              f"{tensor_parallel}")
    site.spec_path.write_text(text)
    assert run_kit("render", str(site.spec_path)).exit_code == 0
    return Site.load(site.spec_path, check_host=False)


def test_a_dropped_replica_leaves_nginx_and_drains_before_it_is_removed(
    replicas_site: Path,
) -> None:
    engine = ReplicaEngine({})
    site = fewer_llama(brought_up(replicas_site, engine), "[0, 1]")
    engine.calls.clear()
    reported: list[str] = []
    result = up_site(site, timeout=5, probe=False, report=reported.append,
                     warn=reported.append, connect=lambda: engine)
    plan = [str(a) for a in result.converged.actions]
    reload_at = next(i for i, line in enumerate(plan) if line.startswith("reload "))
    retired = [i for i, line in enumerate(plan) if line.startswith("retire replica ")]
    assert [plan[i].split(":")[0] for i in retired] == [
        "retire replica gpu02-llama8b-r2-1", "retire replica gpu02-llama8b-r3-1"]
    assert reload_at < min(retired), plan
    assert not any(line.startswith("remove container") for line in plan), plan
    # nginx reloads without them, each is polled until idle, and only then stopped
    steps = [method if method != "signal" else about for method, about in engine.calls
             if method in ("signal", "stop") or (method == "exec" and about.endswith("/metrics"))]
    assert steps[0] == "SIGHUP" and steps.count("stop") == 2, steps
    assert steps.index("stop") > steps.index("exec"), steps
    assert sum("drained" in line for line in reported) == 2
    left = {c.service for c in site.observe(engine).containers}
    assert {"llama8b-r0", "llama8b-r1"} <= left and not {"llama8b-r2", "llama8b-r3"} & left


def test_a_dropped_replica_whose_gpus_are_reused_is_removed_first(replicas_site: Path) -> None:
    """Fewer, wider replicas on the same GPUs: the new ones need the old ones' GPU memory."""
    engine = ReplicaEngine({})
    site = fewer_llama(brought_up(replicas_site, engine), "[0, 1, 2, 3]", 2)
    actions = up_actions(site.desired, site.observe(engine))
    plan = [str(a) for a in actions]
    assert not any(line.startswith("retire replica") for line in plan), plan
    removed = [line for line in plan if line.startswith("remove container")]
    assert removed == [
        "remove container gpu02-llama8b-r2-1: service no longer in the compose file",
        "remove container gpu02-llama8b-r3-1: service no longer in the compose file"], plan
    assert plan.index(removed[-1]) < next(i for i, line in enumerate(plan) if "llama8b-r0" in
                                          line and not line.startswith("remove")), plan


def test_the_front_door_container_does_not_change_with_the_streams(replicas_site: Path) -> None:
    """More or fewer replicas (or max_num_seqs) reload nginx with its new worker limits
    (worker_rlimit_nofile); its container config stays, so it is never recreated under the
    streams it carries."""
    spec = replicas_site / "site.yaml"
    spec.write_text(spec.read_text().replace("max_num_seqs: 128", "max_num_seqs: 1024"))
    site = Site.load(spec, check_host=False)
    assert run_kit("render", str(site.spec_path)).exit_code == 0
    before, limits_before = site.desired.service("nginx"), build_plan(site.spec).nginx
    fewer = fewer_llama(site, "[0]")
    after, limits_after = fewer.desired.service("nginx"), build_plan(fewer.spec).nginx
    assert limits_after.worker_rlimit_nofile < limits_before.worker_rlimit_nofile
    assert f"worker_rlimit_nofile {limits_after.worker_rlimit_nofile};" in (
        fewer.layout.nginx_conf.read_text())
    assert before.config_hash == after.config_hash and not after.config.ulimits


def test_only_a_healthy_replica_is_drained(replicas_site: Path) -> None:
    """A crash-looping or loading replica carries no streams: its rollout (a broken change put
    back) does not wait out the drain deadline polling metrics it cannot answer."""
    engine = ReplicaEngine({})
    site = brought_up(replicas_site, engine)
    healthy, broken = (next(c for c in site.observe(engine).containers if c.service == name)
                       for name in ("llama8b-r0", "llama8b-r1"))
    engine.set_health(broken.id, "unhealthy")
    engine.calls.clear()
    assert kit.converge.rollout.drain(engine, broken, 5) == 0
    assert not [call for call in engine.calls if call[0] == "exec"]
    assert kit.converge.rollout.drain(engine, healthy, 5) == 0
    assert ("exec", "http://127.0.0.1:8000/metrics") in engine.calls


def test_a_rolling_update_to_a_missing_image_is_refused_before_a_replica_leaves(
    replicas_site: Path,
) -> None:
    """Preflight covers the replicas of a rolling update like any recreated container: an image
    the engine cannot pull stops kit up before the first replica is taken out of service."""
    engine = ReplicaEngine({})
    running = brought_up(replicas_site, engine)
    running.spec_path.write_text(running.spec_path.read_text() + "images:\n  vllm: "
                                 "vllm/vllm-openai:v0.99.0\n")
    site = Site.load(running.spec_path, check_host=False)
    engine.calls.clear()
    with pytest.raises(KitError) as refused:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    assert "pulling image vllm/vllm-openai:v0.99.0 failed" in refused.value.message
    assert not [call for call in engine.calls if call[0] in ("signal", "stop", "remove")]
    assert " down;" not in site.layout.replica_pool("llama8b").read_text()
